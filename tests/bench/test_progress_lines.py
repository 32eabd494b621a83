"""Long commands show their progress (cell n of N, the current cell, an ETA; one line per cell in a log) and the
printed table fits a 160-column terminal, with mean TPOT beside the median."""

from __future__ import annotations

import json
import statistics

import pytest

from specterbench.analysis.report import render_markdown
from specterbench.bench.progress import CellProgress, format_seconds
from specterbench.cli import main
from specterbench.runfiles.results import ResultRow

FAST = ["--model", "tiny-random-mixtral", "--budgets", "50%", "--prompts", "1", "--tokens", "3"]


def test_each_cell_is_one_line_with_n_of_n_and_an_eta_from_the_second(monkeypatch):
    said, clock = [], iter([0.0, 10.0, 20.0])
    monkeypatch.setattr("specterbench.bench.runner.time.perf_counter", lambda: next(clock))
    cells = CellProgress(3, said.append)
    for what in ("a", "b", "c"):
        cells.start(what)
    assert said == ["cell 1/3 · a", "cell 2/3 · b · eta 20s", "cell 3/3 · c · eta 10s"]


@pytest.mark.parametrize("seconds, text", [(4.4, "4s"), (185, "3m05s"), (3720, "1h02m")])
def test_an_eta_reads_as_seconds_minutes_or_hours(seconds, text):
    assert format_seconds(seconds) == text


def test_a_run_logs_one_line_per_cell_and_no_bars(host, tmp_path, capsys):
    assert main(["run", *FAST, "--strategies", "lru,on-demand", "--out", str(tmp_path), "--run-id", "r"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if " cell " in f" {line}"]
    assert len(lines) == 2, err
    assert lines[0].startswith("· cell 1/2 · tiny-random-mixtral · lru @ 50%")
    assert lines[1].startswith("· cell 2/2 · tiny-random-mixtral · on-demand @ 50%") and " · eta " in lines[1]
    assert "it/s]" not in err and "%|" not in err


def test_rows_record_the_mean_tpot_beside_the_median(host, tmp_path):
    assert main(["run", *FAST, "--strategies", "lru", "--out", str(tmp_path), "--run-id", "r", "--quiet"]) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    assert row["tpot_mean_ms"] == pytest.approx(statistics.fmean(row["samples"]["tpot_ms"]))


def bench_rows() -> list[ResultRow]:
    """A headline-sized run: thirteen strategies at two budgets, projected geometry, one long error."""
    names = ["on-demand", "lru", "lfru", "static", "next-layer-gate", "activation-aware", "cpu-experts",
             "mixed-precision", "resident", "oracle", "spec-decode", "specmoeoff", "specter"]
    rows = []
    for i, name in enumerate(names):
        for budget in (0.35, 0.5):
            rows.append(ResultRow(
                run_id="r", cell=f"{name}{budget}", model="tiny-qwen-moe", geometry="qwen-moe",
                geometry_label="tiny-qwen-moe routing priced at qwen-moe geometry (modeled projection)",
                priced_total_expert_bytes=10**10, strategy=name, strategy_version="1", strategy_plugin="p",
                lossless_strategy=True, budget_bytes=10**6, budget_fraction=budget, total_expert_bytes=3 * 10**6,
                profile="a100-40g-pcie4", clock="modeled", workload="shakespeare-heldout-v1", prompts=8,
                new_tokens=64, seed=0, repeat=0, tpot_ms=10.0 + i, tpot_mean_ms=11.0 + i, tpot_p90_ms=20.0,
                ttft_ms=500.0, tokens_per_s=90.0, host_ms_per_token=3.0, hit_rate=0.5,
                h2d_bytes_per_token=1.2e6, stall_ms_per_token=8.0, lossless=True,
                status="error" if name == "static" else "ok",
                error="EngineViolation: " + "a long reason " * 12 if name == "static" else None))
    return rows


def test_the_default_table_fits_160_columns_and_says_what_every_row_shares_once():
    text = render_markdown(bench_rows())
    assert max(len(line) for line in text.splitlines()) <= 160
    assert "model: tiny-qwen-moe\n" in text and "geometry: tiny-qwen-moe routing priced at qwen-moe" in text
    header = next(line for line in text.splitlines() if line.startswith("| strategy"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[columns.index("TPOT ms") + 1] == "TPOT mean ms"


def test_wide_shows_every_column_and_each_row_whole():
    text = render_markdown(bench_rows(), wide=True)
    assert "TPOT p90 ms" in text and "host ms/tok" in text and "a long reason " * 12 in text


def test_library_bars_that_do_not_choose_are_off_in_a_log_and_ours_still_choose(monkeypatch):
    import io

    from tqdm import tqdm

    from specterbench.bench.progress import quiet_library_bars

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(tqdm, "__init__", tqdm.__init__)  # undone after the test
    quiet_library_bars(io.StringIO())  # a log: not a terminal
    assert tqdm(range(3), file=io.StringIO()).disable  # lm-eval's "Building contexts", datasets' loaders
    assert not tqdm(range(3), file=io.StringIO(), disable=False).disable  # a bar that says what it wants
