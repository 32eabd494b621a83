"""Realism report: the local-routing-consistency metrics on hand-computed traces, the published table and its
sources, and the report of every shipped stand-in. Fast and CPU-only; never trains."""

from __future__ import annotations

import numpy as np
import pytest

from specterbench.catalog import embedded
from specterbench.studies import lrc, realism, realism_tables


def trace(rows, k: int = 1) -> np.ndarray:
    """A one-layer trace (T, 1, k) from a list of expert ids (k=1) or of k-tuples."""
    return np.asarray(rows, dtype=np.int64).reshape(len(rows), 1, k)


# ---- model-level caches (hits decided when a token starts; cold entries free while fewer than C are known) ----


def test_lru_at_rho1_counts_only_the_first_cold_access():
    # C = 1: the first token is free, every later change of expert evicts the only entry
    assert lrc.model_hit_rate([trace([0, 1, 0, 2, 0, 1])], 4, 1, "lru") == pytest.approx(1 / 6)


def test_lru_at_rho2_by_hand():
    # C = 2: 0, 1 cold (free); 0 hit; 2 evicts 1 (older); 0 hit; 1 miss -> 4/6
    assert lrc.model_hit_rate([trace([0, 1, 0, 2, 0, 1])], 4, 2, "lru") == pytest.approx(4 / 6)


def test_belady_beats_lru_on_a_cyclic_trace():
    cyc = [trace([0, 1, 2, 0, 1, 2])]
    assert lrc.model_hit_rate(cyc, 4, 2, "lru") == pytest.approx(2 / 6)  # LRU always evicts the next one needed
    assert lrc.model_hit_rate(cyc, 4, 2, "belady") == pytest.approx(4 / 6)  # keeps 0, then drops it after use


def test_lfu_breaks_count_ties_by_recency():
    assert lrc.model_hit_rate([trace([0, 1, 2, 0, 1, 2])], 4, 2, "lfu") == pytest.approx(2 / 6)


def test_every_policy_hits_everything_when_the_cache_holds_all_entries():
    t = [trace([0, 1, 2, 3, 2, 1, 0])]
    for policy in lrc.POLICIES:
        assert lrc.model_hit_rate(t, 4, 4, policy) == pytest.approx(1.0)


def test_caches_reset_per_sequence_and_rates_average_over_sequences():
    a, b = trace([0, 1, 0, 2, 0, 1]), trace([3, 3, 3, 3])
    assert lrc.model_hit_rate([a, b], 4, 1, "lru") == pytest.approx((1 / 6 + 1.0) / 2)


def test_model_level_entries_are_layer_expert_pairs():
    # two layers that route the same expert id are different entries: C = rho*L*k = 2 holds both
    t = np.array([[[0], [0]], [[0], [0]]])  # (T=2, L=2, k=1)
    assert lrc.model_level(t, 4).tolist() == [[0, 4], [0, 4]]
    assert lrc.model_hit_rate([t], 4, 1, "lru") == pytest.approx(1.0)


def test_unknown_policy_is_a_value_error():
    with pytest.raises(ValueError, match="unknown cache policy"):
        lrc.cache_hits(np.zeros((2, 1), dtype=np.int64), 1, "fifo", 4)


# ---- segment metrics, reuse, popularity, per-layer LRU ----------------------------------------------------------


def test_srp_best_threshold_f1_by_hand():
    # windows of m=2 over [0, 0, 1]: counts (e0, e1) = (2, 0), (1, 1); threshold 1 predicts 3 window-experts
    # (6 token slots) covering all 4 activations: F1 = 2*4 / (6 + 4) = 0.8
    assert lrc.srp([trace([0, 0, 1])], 2, m=2) == pytest.approx(80.0)


def test_srp_is_100_for_a_constant_expert():
    assert lrc.srp([trace([3] * 20)], 4, m=16) == pytest.approx(100.0)


def test_adjacent_reuse_is_the_shared_fraction_of_top_k():
    assert lrc.adjacent_reuse([trace([(0, 1), (1, 2), (2, 3)], k=2)]) == pytest.approx(0.5)


def test_popular_half_share():
    assert lrc.popular_half_share([trace([0, 1, 2, 3])], 4) == pytest.approx(0.5)
    assert lrc.popular_half_share([trace([0, 0, 0, 3])], 4) == pytest.approx(1.0)


def test_per_layer_lru_counts_every_first_access_as_a_miss():
    # budget 50% of 4 experts = 2 slots: miss, miss, hit, miss (evicts 1), hit, miss
    assert lrc.per_layer_lru([trace([0, 1, 0, 2, 0, 1])], 4, 0.5) == pytest.approx(2 / 6)


def test_summary_has_every_trace_metric_of_the_report():
    s = lrc.summary([trace(list(np.arange(40) % 5))], 8)
    trace_rows = {key for key, _, _ in realism.ROWS if not key.startswith(("draft_", "repeated_"))}
    assert trace_rows <= set(s)


def test_repeated_ngram_share():
    assert realism.repeated_ngram_share([[1, 2, 1, 2, 1, 2]], n=2) == pytest.approx(3 / 5)
    assert realism.repeated_ngram_share([list(range(20))]) == 0.0


# ---- the published table ------------------------------------------------------------------------------------


def test_published_table_has_sources_for_every_metric():
    pub = realism.load_published()
    metrics = {key for model in pub["models"].values() for key in model if isinstance(model[key], float)}
    for key in metrics:
        assert pub["sources"].get(key), f"published metric {key} has no source"
    assert "2505.16056" in pub["sources"]["paper"]


def test_every_stand_in_names_a_published_model():
    models = realism.load_published()["models"]
    for name, stand_in in embedded.STAND_INS.items():
        row = models[stand_in.published]
        for key in realism.TOLERANCES:
            key = realism.PUBLISHED_AS.get(key, key)
            assert isinstance(row[key], float), f"{stand_in.published} lacks {key}"


# ---- the report of each shipped stand-in ---------------------------------------------------------------------

SMALL = realism.ReportSize(heldout_windows=2, decode_prompts=2, decode_new_tokens=8, prompt_tokens=16,
                           draft_windows=1)


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_report_of_each_stand_in_lists_every_metric(name):
    rep = realism.report(name, size=SMALL)
    assert rep["stands_for"] == embedded.STAND_INS[name].published
    for key, _, _ in realism.ROWS:
        assert key in rep["teacher_forced"], key
    for key, _, _ in realism.ROWS:
        assert key in rep["decode"], key
    assert set(rep["checks"]) == set(realism.TOLERANCES)
    table = realism_tables.format_table(rep)
    for _, label, _ in realism.ROWS:
        assert label in table
    fid = rep["fidelity"]
    assert set(fid["drafts"]) == {"int4/g128", "int3/g128", "int2/g128"}
    assert all(0.0 <= r[key] <= 1.0 for r in (fid["experts_removed"], *fid["drafts"].values())
               for key in ("greedy", "sampled", "expert_overlap", "exact_set"))
    assert "routed experts removed" in realism_tables.format_fidelity(rep)



@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_the_shipped_fidelity_rows_were_measured_with_the_current_draft(name):
    """realism.json (and the card written from it) ships measured figures: its draft-fidelity block must name the
    dense copy the code builds now and the calibration the model carries, or it is stale (regenerate it with
    ``card.write_card``)."""
    import json

    from specterbench.catalog.embedded import load_calibration

    directory = embedded.model_dir(name)
    fid = json.loads((directory / "realism.json").read_text())["fidelity"]
    cal = load_calibration(directory)
    scales = (cal.error_scale, cal.head_error_scale) if cal is not None else (1.0, 1.0)
    assert (fid["error_scale"], fid["head_error_scale"]) == scales
    setup = realism.fidelity_setup(*scales)
    assert fid.get("dense") == setup["dense"]
    assert {key: row["label"] for key, row in fid["drafts"].items()} == setup["labels"]

def test_bad_decode_option_is_one_line_and_exit_2_before_any_model_loads(capsys, monkeypatch):
    from specterbench.cli import main, studies

    monkeypatch.setattr(studies, "report", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["realism", "--model", embedded.EMBEDDED_MODELS[0], "--temperature", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "temperature" in err and "(0, 5]" in err


def test_the_execution_order_reading_counts_every_first_access_a_miss_and_decides_each_access_in_turn():
    trace = np.array([[[0, 1]], [[2, 3]], [[0, 1]]])  # (T=3, L=1, k=2): a cache of 2 entries at ρ=1
    assert lrc.execution_order_hit_rate([trace], 4, 1) == 0.0  # 0 1 2 3 0 1 through 2 LRU slots: all misses
    assert lrc.model_hit_rate([trace], 4, 1, "lru") == pytest.approx(2 / 6)  # the paper's cold entries are free
    again = np.array([[[0, 1]], [[0, 1]]])
    assert lrc.execution_order_hit_rate([again], 4, 1) == 0.5
