"""Injected regressions the gate exists to catch, on synthetic result rows: per-window modeled times summarised the way
the runner does, for a grid shaped like the gate's (two stand-ins, two budgets, the default decode)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from types import SimpleNamespace

import pytest

from specterbench.analysis.gate import render, run_gate
from specterbench.analysis.gate_rules import load_rules
from specterbench.bench.cell_metrics import p90 as p90
from specterbench.bench.runner import Runner
from specterbench.cli.gate import cmd_gate
from specterbench.runfiles.results import ResultRow

MODELS = (("tiny-mixtral", "mixtral"), ("tiny-qwen-moe", "qwen-moe"))
BUDGETS = (0.35, 0.5)
SAMPLE = {"mode": "sample", "temperature": 1.0}
SPECULATIVE = ("spec-decode", "specter")


def base_row(**kw) -> ResultRow:
    base = dict(run_id="r", cell="c", model="m", geometry="m", geometry_label="m", priced_total_expert_bytes=100,
                strategy="lru", strategy_version="1", strategy_plugin="baselines", lossless_strategy=True,
                budget_bytes=35, budget_fraction=0.35, total_expert_bytes=100, profile="a100-40g-pcie4",
                clock="modeled", workload="w", prompts=2, new_tokens=8, seed=0, repeat=0, tpot_ms=1.0, hit_rate=0.5,
                lossless=True, token_agreement=1.0)
    base.update(kw)
    return ResultRow(**base)


def summarise(row: ResultRow, windows: list[tuple[int, float]]) -> ResultRow:
    """Fill the row's modeled-time fields from decode windows (tokens, modeled ms), as the runner's _fill_metrics:
    each token of a window gets the window's time / its tokens."""
    tpot = [ms / n for n, ms in windows for _ in range(n)]
    tokens, decode_ms = sum(n for n, _ in windows), sum(ms for _, ms in windows)
    return dataclasses.replace(row, tpot_ms=statistics.median(tpot), tpot_p90_ms=p90(tpot),
                               tokens_per_s=tokens / decode_ms * 1e3,
                               samples={"tpot_ms": tpot, "host_ms": [3.0] * len(tpot), "ttft_ms": [row.ttft_ms or 1.0]})


def windows_of(strategy: str, scale: float, n_windows: int = 12) -> list[tuple[int, float]]:
    """Distinct window times: 5-token windows for speculative strategies, one-token steps for the others."""
    size = 5 if strategy in SPECULATIVE else 1
    return [(size, size * scale * (1 + ((7 * i) % n_windows) / n_windows)) for i in range(n_windows * 5 // size)]


SPEED = {"on-demand": 70.0, "lru": 19.0, "cpu-experts": 11.0, "mixed-precision": 11.3, "spec-decode": 28.0,
         "specter": 30.0, "resident": 6.2, "oracle": 6.3}


def gate_grid() -> list[ResultRow]:
    """A reference-like grid: two stand-ins at their real geometries, two budgets, the default decode."""
    rows = []
    for model, geometry in MODELS:
        for budget in BUDGETS:
            for strategy, scale in SPEED.items():
                if strategy == "resident" and budget != BUDGETS[0]:
                    continue
                lossy = strategy == "mixed-precision"
                extra = ({"tokens_per_window": 4.6, "k": 4, "strategy_options": None} if strategy in SPECULATIVE
                         else {})
                row = base_row(cell=f"{model}|{geometry}|{strategy}|{budget}", model=model, geometry=geometry,
                               geometry_label=f"{geometry} (projection)", strategy=strategy,
                               budget_fraction=1.0 if strategy == "resident" else budget,
                               lossless_strategy=not lossy, token_agreement=0.92 if lossy else 1.0,
                               lossless=None if lossy else True, decode=dict(SAMPLE), prompts=4, new_tokens=16,
                               ttft_ms=50.0 * scale, hit_rate=0.6 + budget / 2, h2d_bytes=6_000_000,
                               h2d_bytes_per_token=100_000.0 * scale, stall_ms_per_token=scale / 3,
                               host_ms_per_token=3.0, duration_s=2.0, extra=extra,
                               env={"git_sha": "abc", "cpu": "x86_64"})
                rows.append(summarise(row, windows_of(strategy, scale * (1.2 - budget))))
    return rows


def pick(rows: list[ResultRow], strategy: str, model: str = "tiny-qwen-moe", budget: float = 0.35) -> int:
    return next(i for i, r in enumerate(rows) if (r.strategy, r.model, r.budget_fraction) == (strategy, model, budget))


# ---- the injected regressions -------------------------------------------------------------------------------

RULES = load_rules("results/reference/gate.toml")


def failing(result) -> set[tuple[str, str]]:
    """(strategy @ budget of the model, metric) of every failure."""
    return {(c.cell.split(" · ")[1], c.metric.split(" (")[0]) for c in result.failures}


def test_the_committed_rules_pass_a_run_equal_to_its_reference():
    ref = gate_grid()
    result = run_gate(gate_grid(), ref, RULES)
    assert result.ok, render(result, passes=False)
    speculative, lossy, specter = 8, 4, 4  # cells of the 30
    # 7 metrics in every cell, window length and agreement where they apply, 2 ratchets and a goal per Specter cell
    assert len(result.checks) == 7 * len(ref) + speculative + lossy + 2 * specter + specter


def test_doubling_40_percent_of_a_speculative_strategys_windows_fails_though_the_median_is_unchanged():
    ref, new = gate_grid(), gate_grid()
    i = pick(new, "specter")
    windows = windows_of("specter", 30.0 * (1.2 - 0.35))
    slow = sorted(range(len(windows)), key=lambda w: windows[w][1])[-round(0.4 * len(windows)):]  # the slowest 40%
    new[i] = summarise(new[i], [(n, ms * 2 if w in slow else ms) for w, (n, ms) in enumerate(windows)])
    assert new[i].tpot_ms == ref[i].tpot_ms  # what a median-only gate would see
    result = run_gate(new, ref, RULES)
    assert {m for _, m in failing(result)} >= {"tpot_mean_ms", "tpot_p90_ms"}
    assert {who for who, _ in failing(result)} == {"specter @ 35%"}
    assert all("tiny-qwen-moe" in c.cell for c in result.failures)


def test_five_percent_more_h2d_bytes_fails():
    ref, new = gate_grid(), gate_grid()
    i = pick(new, "lru", "tiny-mixtral", 0.5)
    new[i] = dataclasses.replace(new[i], h2d_bytes=round(new[i].h2d_bytes * 1.05),
                                 h2d_bytes_per_token=new[i].h2d_bytes_per_token * 1.05)
    result = run_gate(new, ref, RULES)
    assert failing(result) == {("lru @ 50%", "h2d_bytes_per_token")}
    (c,) = result.failures
    assert (c.reference, c.now) == (ref[i].h2d_bytes_per_token, new[i].h2d_bytes_per_token)
    assert c.limit == pytest.approx(ref[i].h2d_bytes_per_token * 1.005, rel=1e-6)


def test_a_lossless_strategy_diverging_on_one_token_fails():
    ref, new = gate_grid(), gate_grid()
    i = pick(new, "specter", "tiny-mixtral", 0.5)
    tokens = {"p0": (5, 6, 7, 8), "p1": (1, 2, 3, 4)}
    got = {"p0": (5, 6, 7, 8), "p1": (1, 2, 9, 4)}  # one token differs
    Runner._check_tokens(new[i], got, SimpleNamespace(tokens=tokens, traces={}), True)  # the runner's own check
    result = run_gate(new, ref, RULES)
    (c,) = [c for c in result.failures if c.metric == "lossless"]
    assert "specter @ 50%" in c.cell and "position 2" in c.message and c.now.startswith("diverged")


def test_a_change_only_in_host_wall_time_never_fails():
    ref, new = gate_grid(), gate_grid()
    for j, r in enumerate(new):
        new[j] = dataclasses.replace(r, host_ms_per_token=r.host_ms_per_token * 7, duration_s=r.duration_s * 9,
                                     samples={**r.samples, "host_ms": [x * 7 for x in r.samples["host_ms"]]},
                                     env={**r.env, "cpu": "arm64", "git_sha": "def"})
    assert run_gate(new, ref, RULES).ok


@pytest.mark.parametrize("field, factor, metric", [
    ("ttft_ms", 1.01, "ttft_ms"), ("stall_ms_per_token", 1.01, "stall_ms_per_token"),
    ("hit_rate", 0.99, "hit_rate"), ("token_agreement", 0.98, "token_agreement"),
])
def test_every_other_gated_metric_fails_beyond_the_tolerance(field, factor, metric):
    ref, new = gate_grid(), gate_grid()
    i = pick(new, "mixed-precision")
    new[i] = dataclasses.replace(new[i], **{field: getattr(new[i], field) * factor})
    assert failing(run_gate(new, ref, RULES)) == {("mixed-precision @ 35%", metric)}


def test_shorter_speculative_windows_fail():
    ref, new = gate_grid(), gate_grid()
    i = pick(new, "spec-decode")
    new[i] = dataclasses.replace(new[i], extra={**new[i].extra, "tokens_per_window": 4.5})
    assert failing(run_gate(new, ref, RULES)) == {("spec-decode @ 35%", "tokens_per_window")}


def test_token_agreement_of_a_lossless_strategy_is_its_lossless_status_not_a_metric():
    rules = [r for r in RULES if getattr(r, "metric", "") == "token_agreement"]
    result = run_gate(gate_grid(), gate_grid(), rules)
    assert {c.cell.split(" · ")[1] for c in result.checks if c.metric} == {"mixed-precision @ 35%",
                                                                           "mixed-precision @ 50%"}


def test_a_faster_baseline_lowers_specters_speedup_and_trips_the_ratchet():
    ref, new = gate_grid(), gate_grid()  # cpu-experts, the strongest lossless baseline, gets 2% faster
    i = pick(new, "cpu-experts", "tiny-mixtral", 0.35)
    new[i] = summarise(new[i], [(n, ms / 1.02) for n, ms in windows_of("cpu-experts", 11.0 * 0.85)])
    result = run_gate(new, ref, RULES)
    ratchets = [c for c in result.failures if c.rule.startswith("ratchet")]
    assert {c.cell.split(" · ")[1] for c in ratchets} == {"specter @ 35%"} and len(ratchets) == 2
    assert all(c.now < c.limit < c.reference for c in ratchets)
    assert all(c.rule.startswith("ratchet") for c in result.failures)  # a faster baseline is not a regression


def test_goal_lines_say_met_or_not_met_and_never_fail():
    ref = gate_grid()
    result = run_gate(gate_grid(), ref, RULES)
    assert result.ok and len(result.goals) == 4
    assert all("goal not met (measured 0.3" in c.message for c in result.goals)  # 11 / 30 ms: cpu-experts is faster
    text = render(result, passes=False)
    assert text.count("\ngoal  ") == 4 and "\nFAIL" not in text


def test_a_cell_the_reference_lacks_fails_until_it_is_recorded():
    ref = [r for r in gate_grid() if r.model == "tiny-mixtral"]
    ref += [r for r in gate_grid() if r.model == "tiny-qwen-moe" and r.strategy != "lru"]
    result = run_gate(gate_grid(), ref, RULES)
    assert {c.rule for c in result.failures} == {"coverage"} and len(result.failures) == 2


def test_each_failure_is_one_line_and_the_same_in_json(tmp_path):
    from specterbench.runfiles.results import RowWriter

    ref, new = gate_grid(), gate_grid()
    i = pick(new, "lru", "tiny-mixtral", 0.5)
    new[i] = dataclasses.replace(new[i], h2d_bytes_per_token=new[i].h2d_bytes_per_token * 1.05)
    for name, rows in (("ref", ref), ("new", new)):
        w = RowWriter(tmp_path / name / "rows.jsonl")
        for r in rows:
            w.append(r)
    args = SimpleNamespace(run_dir=tmp_path / "new", reference=tmp_path / "ref", rules="results/reference/gate.toml",
                           rule=None, failures_only=True, json=str(tmp_path / "gate.json"), on_error="stop")
    assert cmd_gate(args) == 1
    report = json.loads((tmp_path / "gate.json").read_text())
    assert report["ok"] is False and report["failed"] == 1 and len(report["goals"]) == 4
    (f,) = report["failures"]
    assert f["metric"] == "h2d_bytes_per_token" and f["cell"].startswith("tiny-mixtral@mixtral · lru @ 50%")
    assert f["reference"] == ref[i].h2d_bytes_per_token and f["now"] == new[i].h2d_bytes_per_token
    line = render(run_gate(new, ref, RULES), passes=False).splitlines()[1]
    assert line.startswith("FAIL  tiny-mixtral@mixtral · lru @ 50%")
    assert "h2d_bytes_per_token: reference 1900000, " in line
    assert "now 1995000, limit 1909500 — +5.00%" in line


def test_a_better_metric_passes_with_a_note_to_lock_it_in():
    ref, new = gate_grid(), gate_grid()
    i = pick(new, "lru")
    new[i] = dataclasses.replace(new[i], h2d_bytes_per_token=new[i].h2d_bytes_per_token * 0.9, hit_rate=0.99)
    result = run_gate(new, ref, RULES)
    assert result.ok and sum(c.improved for c in result.checks) == 2
    assert "note  2 metric(s) better than the reference beyond the tolerance" in render(result, passes=False)
    assert "note" not in render(run_gate(gate_grid(), ref, RULES))


def test_a_new_stand_in_fails_cell_by_cell_until_it_is_recorded():
    ref = [r for r in gate_grid() if r.model == "tiny-mixtral"]
    result = run_gate(gate_grid(), ref, RULES)  # tiny-qwen-moe joined the grid
    assert {c.rule for c in result.failures} == {"coverage"}
    assert len(result.failures) == 15 and all(c.cell.startswith("tiny-qwen-moe") for c in result.failures)


def test_the_gate_grid_covers_every_shipped_stand_in():
    from specterbench.catalog.embedded import EMBEDDED_MODELS

    line = next(x for x in open("Makefile", encoding="utf-8") if x.startswith("GATE_MODELS ?="))
    assert line.split("?=")[1].strip().split(",") == list(EMBEDDED_MODELS), (
        "a stand-in ships without being gated: add it to GATE_MODELS in the Makefile and run `make reference`")
