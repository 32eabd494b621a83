"""Bounds that bound, and the ablation that isolates the lookahead."""

from specterbench.baselines import Oracle
from specterbench.baselines.oracle_spec import MAX_WINDOW, window_lengths, window_trace
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner


def config(strategies, tokens=40, budget="50%", geometry=None):
    return BenchConfig(models=("tiny-random-mixtral",), strategies=strategies, budgets=(parse_budget(budget),),
                       profile="a100-40g-pcie4", prompts=1, tokens=tokens, geometry=geometry)


def test_oracle_says_it_bounds_per_token_fetch_only_decoding():
    assert "per-token, fetch-only" in Oracle.description
    assert "oracle-spec" in Oracle.__doc__


def test_windows_cover_every_token_once_without_overshooting():
    assert window_lengths(40) == [32, 5]  # 1 (prefill) + 33 + 6 = 40
    assert window_lengths(34) == [32]
    assert window_lengths(1) == []
    assert all(sum(k + 1 for k in window_lengths(n)) + 1 == n for n in range(1, 200))


def test_window_trace_is_the_union_of_its_tokens_routing_per_layer():
    L = 2
    per_forward = [[(0, (0, 1)), (1, (2, 3))], [(0, (1,)), (1, (3,))], [(0, (4,)), (1, (5,))],
                   [(0, (6,)), (1, (7,))]]  # prefill, then one forward per token
    trace = tuple(entry for forward in per_forward for entry in forward)
    out = window_trace(trace, L, 4, depth=2)  # tokens 1..3 in one window of depth 2: reference forwards 1, 2, 3
    assert out == [(0, (0, 1)), (1, (2, 3)), (0, (1, 4, 6)), (1, (3, 5, 7))]


def test_oracle_spec_is_lossless_accepts_every_proposal_and_prefetches_every_window(host, small_prompts, tmp_path):
    (row,) = Runner(host, config(("oracle-spec",)), tmp_path).run()
    assert row.status == "ok" and row.lossless, row.error
    x = row.extra
    assert x["routing_mismatches"] == 0
    assert x["tokens_per_window"] == (MAX_WINDOW + 1 + 6) / 2  # a full window of 33 tokens, then the last 6
    assert row.hit_rate == 1.0  # own geometry: a copy beats the host, and every window's experts were copied in time
    assert row.strategy_device_bytes == 0  # a free draft: the whole budget is cache


def test_oracle_spec_gives_the_host_what_it_finishes_before_the_copy(host, small_prompts, tmp_path):
    (row,) = Runner(host, config(("oracle-spec",), geometry="mixtral"), tmp_path).run()
    assert row.status == "ok" and row.lossless, row.error
    assert row.extra["copies_dropped_for_host"] > 0 and row.host_experts > 0


def test_spec_host_is_specter_without_its_plan(host, small_prompts, tmp_path):
    rows = Runner(host, config(("spec-host",), budget="60%"), tmp_path).run()
    (row,) = rows
    assert row.status == "ok" and row.lossless, row.error
    assert row.extra["plan"] == "off"
    if not row.extra["draft_released"]:  # (a dropped draft's bytes are filled with residents: those are copies)
        assert row.prefetch_issued == 0  # residents are loaded before the run; nothing is prefetched during it


def test_specter_turns_its_plan_off_where_the_cache_has_no_room_beyond_a_layers_top_k(host, small_prompts, tmp_path):
    """A cache of at most top-k slots holds no resident and no room a plan copy could take without evicting what the
    layer being verified has just fetched: Specter runs without its plan there, says so in the row, and is then
    exactly the ablation (with its plan on there, Specter ran slower than spec-host)."""
    rows = Runner(host, config(("specter", "spec-host"), budget="36%", geometry="mixtral"), tmp_path).run()
    by = {r.strategy: r for r in rows}
    specter, ablation = by["specter"], by["spec-host"]
    assert specter.status == "ok" and specter.lossless, specter.error
    assert specter.extra["plan"].startswith("off (no room: ") and specter.prefetch_issued == 0
    assert specter.tpot_mean_ms == ablation.tpot_mean_ms and specter.hits == ablation.hits
