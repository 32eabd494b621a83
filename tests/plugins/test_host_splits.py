"""llama.cpp's layer split (``n-cpu-moe``) and KTransformers' hybrid (``kt-hybrid``): what stays on the device, what
runs on the host, nothing copied during decode, and one line for each bad option."""

import pytest

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.catalog.tiny import tiny_random
from specterbench.engine.engine import Engine
from specterbench.errors import BudgetError, UsageError
from specterbench.runfiles.results import read_rows

MODEL = "tiny-random-mixtral"  # 2 MoE layers, 8 experts, top-2


def run(host, small_prompts, tmp_path, strategy, budgets=("50%",), options=None, tokens=6, geometry=None):
    config = BenchConfig(models=(MODEL,), strategies=(strategy,), budgets=tuple(parse_budget(b) for b in budgets),
                         profile="a100-40g-pcie4", tokens=tokens, prompts=2, geometry=geometry,
                         strategy_options={strategy: options or {}})
    Runner(host, config, tmp_path).run()
    return read_rows(tmp_path)


def test_the_layer_split_keeps_the_last_layers_resident_and_copies_nothing_during_decode(host, small_prompts,
                                                                                           tmp_path):
    (row,) = run(host, small_prompts, tmp_path, "n-cpu-moe", options={"n": 1, "prefill": "host"})
    assert row.status == "ok" and row.lossless
    assert row.extra["n_cpu_moe"] == 1 and row.extra["pinned_experts"] == 8  # layer 1's eight experts
    assert row.decode_h2d_bytes_per_token == 0  # decode: the host layer runs on the host, the other is resident
    assert row.extra["host_calls"] > 0


def test_cpu_moe_runs_with_zero_expert_bytes_on_the_device(host, small_prompts, tmp_path):
    (row,) = run(host, small_prompts, tmp_path, "n-cpu-moe", budgets=("0%",), options={"n": "all"})
    assert row.status == "ok" and row.lossless and row.budget_bytes == 0
    assert row.peak_cache_bytes == 0 and row.h2d_bytes_per_token == 0 and row.decode_h2d_bytes_per_token == 0
    assert row.extra["prefill"] == "auto: on the host (no room to stream)"


def test_fit_takes_the_fewest_host_layers_that_leave_the_rest_within_the_budget(host, small_prompts, tmp_path):
    rows = run(host, small_prompts, tmp_path, "n-cpu-moe", budgets=("40%", "100%"), options={"prefill": "host"})
    assert [r.extra["n_cpu_moe"] for r in sorted(rows, key=lambda r: r.budget_fraction)] == [2, 0]


def test_a_streamed_prefill_copies_host_experts_and_drops_them_before_decode(host, small_prompts, tmp_path):
    (row,) = run(host, small_prompts, tmp_path, "n-cpu-moe", budgets=("100%",), options={"n": 1, "prefill": "stream"})
    assert row.status == "ok" and row.lossless and row.extra["streamed_experts"] > 0
    assert row.h2d_bytes_per_token > 0 and row.decode_h2d_bytes_per_token == 0  # decode copied nothing


def test_a_priced_prefill_streams_only_the_layers_the_rule_prices_sooner_copied(host, small_prompts, tmp_path):
    (own,) = run(host, small_prompts, tmp_path / "own", "n-cpu-moe", budgets=("100%",),
                 options={"n": 1, "prefill": "priced"})
    (mixtral,) = run(host, small_prompts, tmp_path / "mixtral", "n-cpu-moe", budgets=("100%",),
                     options={"n": 16, "prefill": "priced"}, geometry="mixtral")  # 16 of 32 real layers
    for row in (own, mixtral):
        assert row.status == "ok" and row.lossless and row.decode_h2d_bytes_per_token == 0
        assert row.extra["prefill"] == "priced: per layer by the engine's prefill rule"
    # the stand-in's tiny experts copy sooner than the host computes them; Mixtral's 352 MB experts over a short
    # prompt's few tokens each do not
    assert own.extra["streamed_experts"] > 0 and mixtral.extra["streamed_experts"] == 0


def test_lru_fetches_its_prompts_misses_as_mixtral_offloading_unless_its_prefill_is_priced(host, small_prompts,
                                                                                            tmp_path):
    (fetch,) = run(host, small_prompts, tmp_path / "fetch", "lru", geometry="mixtral")
    (priced,) = run(host, small_prompts, tmp_path / "priced", "lru", options={"prefill": "priced"}, geometry="mixtral")
    assert fetch.status == priced.status == "ok" and fetch.lossless and priced.lossless
    assert fetch.host_experts == 0  # mixtral-offloading has no host path: every miss of the prompt is copied
    # at Mixtral's sizes the rule computes a short prompt's misses on the host, sooner than copying them
    assert priced.host_experts > 0 and priced.ttft_ms < fetch.ttft_ms


@pytest.mark.parametrize("placement", ["frequency", "uniform", "front-loading"])
def test_the_hybrid_pins_gpu_experts_by_its_placement_and_runs_the_rest_on_the_host(host, small_prompts, tmp_path,
                                                                                     placement):
    (row,) = run(host, small_prompts, tmp_path, "kt-hybrid", options={"placement": placement, "prefill": "host"})
    assert row.status == "ok" and row.lossless and row.decode_h2d_bytes_per_token == 0
    assert row.extra["placement"] == placement and row.extra["pinned_experts"] == 8  # half of 16 experts


def test_rebalancing_copies_the_new_hot_experts_on_the_link(host, small_prompts, tmp_path):
    (row,) = run(host, small_prompts, tmp_path, "kt-hybrid", options={"rebalance": 2, "prefill": "host"},
                 tokens=12)
    assert row.status == "ok" and row.lossless
    assert row.extra["repinned_copies"] > 0 and row.decode_h2d_bytes_per_token > 0


@pytest.mark.parametrize("strategy, options, message", [
    ("n-cpu-moe", {"n": "lots"}, "n-cpu-moe option n='lots' is invalid"),
    ("n-cpu-moe", {"prefill": "gpu"}, "n-cpu-moe option prefill='gpu' is invalid"),
    ("kt-hybrid", {"placement": "random"}, "kt-hybrid option placement='random' is unknown"),
    ("kt-hybrid", {"rebalance": 0}, "kt-hybrid option rebalance=0 is invalid"),
    ("kt-hybrid", {"gpu_experts": -1}, "kt-hybrid option gpu_experts=-1 is invalid"),
    ("lru", {"prefill": "host"}, "lru option prefill='host' is invalid: use fetch or priced"),
])
def test_bad_options_are_one_line(host, strategy, options, message):
    with pytest.raises(UsageError, match=message):
        host.strategies().get(strategy).validate_options(options)


def test_more_host_layers_than_the_model_has_or_more_resident_than_the_budget_is_one_line(host, small_prompts,
                                                                                          tmp_path):
    with pytest.raises(UsageError, match="n-cpu-moe option n=5 is more than the 2 MoE layers"):
        run(host, small_prompts, tmp_path, "n-cpu-moe", options={"n": 5})
    with pytest.raises(BudgetError, match=r"n-cpu-moe with n=0 keeps 2 MoE layer\(s\) of experts resident"):
        run(host, small_prompts, tmp_path, "n-cpu-moe", options={"n": 0})


def test_a_zero_budget_is_refused_by_a_strategy_that_cannot_run_it_naming_one_that_can(host, small_prompts,
                                                                                     tmp_path):
    config = BenchConfig(models=(MODEL,), strategies=("lru", "n-cpu-moe"), budgets=(parse_budget("0%"),),
                         profile="a100-40g-pcie4", tokens=4, prompts=1)
    with pytest.raises(BudgetError, match=r"below what lru needs .* \(n-cpu-moe can run it\)"):
        Runner(host, config, tmp_path).run()


def test_the_least_budget_is_zero_for_the_host_splits_and_one_forward_for_a_cache(host):
    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="mixtral", tokenizer=tok)
    least = {name: host.strategies().get(name).min_budget(engine, options)
             for name, options in (("lru", {}), ("cpu-experts", {}), ("n-cpu-moe", {"n": "all"}), ("kt-hybrid", {}))}
    one_forward = engine.min_budget_bytes()
    assert least == {"lru": one_forward, "cpu-experts": one_forward, "n-cpu-moe": 0, "kt-hybrid": 0}
    assert engine.min_budget_bytes() > 0


def test_under_a_projection_the_split_moves_one_real_layer_at_a_time(host, small_prompts, tmp_path):
    # at Mixtral's sizes each of the 2 stand-in layers stands for 16 real ones; 50% holds 8 of the 16 stand-in
    # experts; the stream buffer is one real layer's experts (at least top-2), so 6 stay for resident layers: real
    # layers 20..31 (12 of 32) are the device's, as 6 of layer 1's 8 experts
    (row,) = run(host, small_prompts, tmp_path, "n-cpu-moe", geometry="mixtral")
    assert row.status == "ok" and row.lossless
    assert row.extra["n_cpu_moe"] == 20 and row.extra["moe_layers"] == 32 and row.extra["pinned_experts"] == 6
    assert row.decode_h2d_bytes_per_token == 0
