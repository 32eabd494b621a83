"""The traps a new user fell into: each is one line naming the problem and the fix, or now does the right thing."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from specterbench.analysis.report import render_markdown
from specterbench.bench.grid import parse_grid
from specterbench.cli import main
from specterbench.cli.options import dated_folder
from specterbench.runfiles.results import ResultRow, read_rows

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--model", "tiny-random-mixtral", "--strategies", "lru,on-demand", "--budgets", "50%", "--tokens", "3",
        "--prompts", "1", "--quiet"]


def test_a_copied_and_resumed_run_folder_is_recognised_as_itself(tmp_path, capsys):
    assert main(["run", *FAST, "--out", str(tmp_path), "--run-id", "first"]) == 0
    rows = (tmp_path / "first" / "rows.jsonl").read_text().splitlines()
    (tmp_path / "first" / "rows.jsonl").write_text(rows[0] + "\n")  # as if stopped after its first cell
    shutil.copytree(tmp_path / "first", tmp_path / "copy")
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "copy"), "--quiet"]) == 0
    assert main(["report", str(tmp_path / "copy")]) == 0
    assert "another run" not in capsys.readouterr().err
    assert {r.run_id for r in read_rows(tmp_path / "copy")} == {"first"}


def test_the_shipped_reference_holds_several_runs_on_purpose_and_reports_without_a_warning(capsys):
    rows = read_rows(ROOT / "results" / "reference")
    assert len({r.run_id for r in rows}) > 1
    from specterbench.runfiles.results import integrity_problems
    from specterbench.runfiles.rundir import run_ids

    assert integrity_problems(rows, "reference", run_ids(ROOT / "results" / "reference")) == []


def test_resuming_over_a_corrupt_line_sets_it_aside_and_runs_its_cell_again(tmp_path, capsys):
    assert main(["run", *FAST, "--out", str(tmp_path), "--run-id", "r"]) == 0
    path = tmp_path / "r" / "rows.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n{corrupt\n")  # a damaged second row
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "line(s) 2 were not rows (cut off or corrupt)" in err and "Traceback" not in err
    assert len(read_rows(tmp_path / "r")) == 2


def test_a_second_interrupt_while_the_summary_is_written_is_still_one_line(tmp_path, capsys, monkeypatch):
    import specterbench.analysis.report as report
    import specterbench.bench.runner as runner

    def interrupted(self):
        self.rows.append(None)
        raise KeyboardInterrupt

    def second(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.Runner, "run", interrupted)
    monkeypatch.setattr(report, "write_summary", second)
    (tmp_path / "r").mkdir()
    code = main(["run", *FAST, "--out", str(tmp_path), "--run-id", "r"])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("specterbench: interrupted")


def test_two_dated_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    class Args:
        pass

    a, b = dated_folder(tmp_path, "20261205-120000-m", Args()), dated_folder(tmp_path, "20261205-120000-m", Args())
    assert a != b and a.is_dir() and b.is_dir() and b.name == "20261205-120000-m-2"


def test_a_measured_run_on_a_cpu_shows_host_time_and_no_empty_tpot(tmp_path, capsys):
    assert main(["run", *FAST, "--clock", "measured", "--out", str(tmp_path), "--run-id", "r"]) == 0
    out = capsys.readouterr().out
    table = out.split("\nrows:")[0]
    assert "nan" not in table and "ms/tok" in table and "TPOT: not measured (no CUDA device)" in table
    assert "stall ms/tok" not in table  # no device clock, no stall: the column is left out, not shown empty


def test_a_speculative_row_whose_draft_was_released_says_so_in_the_table():
    row = ResultRow(run_id="r", cell="c", model="m", geometry="m", geometry_label="m", priced_total_expert_bytes=10,
                    strategy="specter", strategy_version="5", strategy_plugin="specter", lossless_strategy=True,
                    budget_bytes=1, budget_fraction=0.35, total_expert_bytes=10, profile="p", clock="modeled",
                    workload="w", prompts=1, new_tokens=4, seed=0, repeat=0, extra={"draft_released": True})
    table = render_markdown([row])
    assert "specter (draft released)" in table and "it never speculated" in table


def test_sweeps_price_at_the_same_geometry_as_runs_by_default():
    grid = parse_grid({"models": ["tiny-mixtral"], "strategies": ["lru"], "budgets": ["50%"]}, "g.toml")
    assert grid.geometries == ("auto",)


def test_make_gate_with_no_jobs_is_one_line():
    done = subprocess.run(["make", "-s", "gate", "GATE_JOBS=0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "GATE_JOBS=0 is not a number of runs at a time" in done.stderr


def test_bench_wallclock_compare_with_a_bad_threshold_stops_before_measuring():
    done = subprocess.run(["make", "-s", "bench-wallclock-compare", "WALLCLOCK_MAX_SLOWDOWN=0.5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--max-slowdown 0.5 must be above 1" in done.stderr
    assert "benchmark" not in done.stdout.lower()


@pytest.mark.parametrize("text", ["35", "50"])
def test_a_budget_without_a_unit_names_both_readings(text, capsys):
    assert main(["run", *FAST[:4], "--budgets", text, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"budget '{text}' has no unit; write {text}% for a share of all expert bytes" in err


def test_the_reference_folder_marks_its_runs():
    data = json.loads((ROOT / "results" / "reference" / "run.json").read_text())
    assert data["kind"] == "merged" and len(data["run_ids"]) == 3
