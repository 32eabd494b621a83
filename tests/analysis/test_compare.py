import dataclasses

import pytest

from specterbench.analysis.compare import compare_runs, render_comparison
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow


def row(**kw) -> ResultRow:
    base = dict(run_id="r", cell="c", model="m", geometry="m", geometry_label="m", priced_total_expert_bytes=100,
                strategy="lru", strategy_version="1", strategy_plugin="baselines", lossless_strategy=True,
                budget_bytes=35, budget_fraction=0.35, total_expert_bytes=100, profile="a100-40g-pcie4",
                clock="modeled", workload="w", prompts=2, new_tokens=8, seed=0, repeat=0, tpot_ms=1.0,
                hit_rate=0.5, h2d_bytes_per_token=1000.0)
    base.update(kw)
    return ResultRow(**base)


def by_metric(df, strategy="lru"):
    return {r.metric: r for r in df[df["strategy"] == strategy].itertuples()}


def test_lower_is_better_metric_going_down_is_better_and_hit_rate_going_down_is_worse():
    df = compare_runs([row(tpot_ms=2.0, hit_rate=0.6)], [row(tpot_ms=1.5, hit_rate=0.4)])
    m = by_metric(df)
    assert (m["tpot_ms"].direction, m["tpot_ms"].verdict, m["tpot_ms"].delta_pct) == ("lower", "better", -25.0)
    assert (m["hit_rate"].direction, m["hit_rate"].verdict) == ("higher", "worse")
    assert m["h2d_bytes_per_token"].verdict == "same"


def test_cells_match_on_rounded_budget_and_unmatched_cells_are_noted():
    base = [row(budget_fraction=0.3500001), row(strategy="static")]
    new = [row(budget_fraction=0.35), row(strategy="specter")]
    df = compare_runs(base, new)
    assert set(df["strategy"]) == {"lru"}
    notes = " ".join(df.attrs["notes"])
    assert "only in base (not compared): static @ 35%" in notes and "only in new (not compared): specter" in notes


@pytest.mark.parametrize("field, value, reason", [
    ("schema_version", 2, "different schema version: base has 1; new has 2"),
    ("model", "other", "different model: base has m; new has other"),
    ("geometry", "mixtral", "different geometry"),
    ("profile", "h100-pcie5", "different profile: base has a100-40g-pcie4; new has h100-pcie5"),
])
def test_incompatible_runs_are_refused_with_the_reason(field, value, reason):
    with pytest.raises(UsageError, match=reason):
        compare_runs([row()], [row(**{field: value})])


def test_runs_without_a_common_cell_are_refused_with_what_each_has():
    with pytest.raises(UsageError, match="share no cell.*32 tokens"):
        compare_runs([row(new_tokens=8)], [row(new_tokens=32)])


def test_per_token_samples_decide_significance():
    slow, fast = [2.0, 2.1, 2.2, 2.05, 2.15, 2.12] * 3, [1.0, 1.1, 1.2, 1.05, 1.15, 1.12] * 3
    df = compare_runs([row(tpot_ms=2.1, samples={"tpot_ms": slow})], [row(tpot_ms=1.1, samples={"tpot_ms": fast})])
    m = by_metric(df)
    assert m["tpot_ms"].significant == True  # noqa: E712 (object column)
    assert m["tpot_ms"].p_value < 0.001 and "18 vs 18 per-token samples" in m["tpot_ms"].test
    assert m["hit_rate"].significant is None  # one repeat a side: no test


def test_identical_samples_are_not_significant():
    samples = {"tpot_ms": [1.0, 1.2, 1.1, 1.3]}
    m = by_metric(compare_runs([row(samples=samples)], [row(samples=samples)]))
    assert m["tpot_ms"].significant == False and m["tpot_ms"].verdict == "same"  # noqa: E712


def test_repeats_are_pooled_by_median_and_tested():
    base = [row(repeat=i, hit_rate=h) for i, h in enumerate([0.50, 0.52, 0.51, 0.49, 0.50])]
    new = [row(repeat=i, hit_rate=h) for i, h in enumerate([0.70, 0.72, 0.71, 0.69, 0.70])]
    m = by_metric(compare_runs(base, new))
    assert (m["hit_rate"].base, m["hit_rate"].new, m["hit_rate"].verdict) == (0.50, 0.70, "better")
    assert m["hit_rate"].significant == True and "5 vs 5 repeats" in m["hit_rate"].test  # noqa: E712


def test_failed_rows_are_left_out_of_the_medians_and_shown():
    new = [row(), row(repeat=1, tpot_ms=None, status="error", error="BudgetError: too small")]
    df = compare_runs([row()], new)
    m = by_metric(df)
    assert m["tpot_ms"].new == 1.0 and "error: BudgetError" in m["tpot_ms"].new_status
    assert "BudgetError" in render_comparison(df)


def test_render_has_direction_verdict_and_a_tally():
    df = compare_runs([row(tpot_ms=2.0, hit_rate=0.6)], [row(tpot_ms=1.5, hit_rate=0.4)])
    text = render_comparison(df)
    assert text.startswith("1 better (0 significant), 1 worse (0 significant)")
    line = next(x for x in text.splitlines() if "| tpot_ms" in x)
    assert "lower" in line and "better" in line and "-25.00" in line
    assert "hit_rate" not in render_comparison(df[df["metric"] == "tpot_ms"])


def test_only_changed_hides_unchanged_metrics():
    df = compare_runs([row(tpot_ms=2.0)], [row(tpot_ms=1.5)])
    text = render_comparison(df, only_changed=True)
    assert "tpot_ms" in text and "h2d_bytes_per_token" not in text


def test_changed_strategy_versions_are_noted():
    df = compare_runs([row()], [dataclasses.replace(row(), strategy_version="2")])
    assert "strategy lru: version 1 → 2" in df.attrs["notes"]


def noisy(values, **kw):
    return row(host_ms_per_token=sorted(values)[len(values) // 2], samples={"host_ms": list(values)}, **kw)


def test_host_wall_time_is_not_called_significant_by_default():
    base, new = noisy([1.0 + i / 100 for i in range(200)]), noisy([2.0 + i / 100 for i in range(200)])
    m = by_metric(compare_runs([base], [new]))["host_ms_per_token"]
    assert m.verdict == "worse" and m.significant is None and "not tested" in m.test
    tested = by_metric(compare_runs([base], [new], test_wall_time=True))["host_ms_per_token"]
    assert tested.significant == True  # noqa: E712


def test_every_time_metric_of_a_host_clock_row_is_wall_time():
    base = row(clock="host", profile="-", tpot_ms=None, ttft_ms=1.0, samples={"ttft_ms": [1.0, 1.1, 1.2]})
    new = row(clock="host", profile="-", tpot_ms=None, ttft_ms=3.0, samples={"ttft_ms": [3.0, 3.1, 3.2]})
    df = compare_runs([base], [new])
    assert "not tested" in by_metric(df)["ttft_ms"].test
    text = render_comparison(df, only_changed=True)
    assert "ttft_ms" not in text and "host wall-time pairs not tested" in text


def test_the_tally_counts_significant_changes_in_both_directions():
    base = row(samples={"tpot_ms": [1.0 + i / 100 for i in range(50)], "ttft_ms": [5.0 + i / 100 for i in range(50)]},
               ttft_ms=5.25)
    new = row(samples={"tpot_ms": [2.0 + i / 100 for i in range(50)], "ttft_ms": [1.0 + i / 100 for i in range(50)]},
              ttft_ms=1.25, tpot_ms=2.0)
    text = render_comparison(compare_runs([base], [new]))
    assert text.startswith("1 better (1 significant), 1 worse (1 significant)")
