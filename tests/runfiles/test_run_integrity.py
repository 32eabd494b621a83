"""A run folder never holds a duplicated or foreign row: duplicate cells are folded, a resume goes only into a folder
of the same kind and configuration, a cut last line is set aside, report/compare/gate flag what is wrong with a
folder, refused runs leave no folder and finished ones no lock. In-process (``main([...])``) on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specterbench.cli import main
from specterbench.runfiles import rundir

MODEL = "tiny-random-mixtral"
FAST = ["--model", MODEL, "--budgets", "50%", "--prompts", "1", "--tokens", "2", "--quiet"]


@pytest.fixture
def cli(host, capsys):
    def call(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return code, out, err

    return call


def error_line(err: str) -> str:
    (line,) = [line for line in err.splitlines() if line.startswith("specterbench: error:")]
    return line


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("specterbench: warning:")]


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-strategy run (lru, on-demand), copied by tests that change it."""
    out = tmp_path_factory.mktemp("finished")
    assert main([*["run", *FAST], "--strategies", "lru,on-demand", "--out", str(out), "--run-id", "r"]) == 0
    return out / "r"


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# ---- duplicate cells in a request are folded ---------------------------------------------------------------
@pytest.mark.parametrize("flag, value, note", [
    ("--strategies", "lru,lru", "--strategies names 'lru' twice; it runs once"),
    ("--budgets", "50%,50%", "--budgets names '50%' twice; it runs once"),
    ("--budgets", "50%,0.5", "--budgets names '0.5' is '50%' again; it runs once"),
    ("--model", f"{MODEL},{MODEL}", f"--model names '{MODEL}' twice; it runs once"),
])
def test_a_cell_named_twice_runs_once_with_a_note(cli, tmp_path, flag, value, note):
    args = dict(zip(FAST[::2], FAST[1::2]))
    args.pop("--quiet", None)
    args.update({"--strategies": "lru", flag: value})
    code, _, err = cli("run", *[x for kv in args.items() for x in kv], "--quiet", "--out", tmp_path, "--run-id", "r")
    assert code == 0, err
    assert any(note in line for line in warnings_of(err)), err
    assert len(rows_of(tmp_path / "r")) == 1


# ---- resume only into a folder of the same kind --------------------------------------------------------------
def test_resume_into_a_folder_without_run_json_is_refused_and_appends_nothing(cli, tmp_path, finished):
    run_dir = copy_run(finished, tmp_path / "r")
    (run_dir / rundir.RUN_JSON).unlink()
    before = (run_dir / "rows.jsonl").read_bytes()
    code, _, err = cli("run", "--resume", run_dir, "--quiet")
    assert code == 2 and "not a folder `specterbench run` wrote (no run.json)" in error_line(err)
    assert (run_dir / "rows.jsonl").read_bytes() == before


def test_run_resume_of_a_sweeps_folder_names_the_sweep_command(cli, tmp_path, finished):
    run_dir = copy_run(finished, tmp_path / "s")
    (run_dir / rundir.RUN_JSON).unlink()
    (run_dir / rundir.GRID_COPY).write_text('models = ["x"]\n')
    code, _, err = cli("run", "--resume", run_dir, "--quiet")
    assert code == 2 and "a sweep's folder, not a run's; continue it with specterbench sweep" in error_line(err)


def test_sweep_resume_of_a_runs_folder_names_the_run_command(cli, tmp_path, finished):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'models = ["{MODEL}"]\nstrategies = ["lru"]\nbudgets = ["50%"]\n')
    code, _, err = cli("sweep", grid, "--resume", finished)
    assert code == 2 and f"continue it with specterbench run --resume {finished}" in error_line(err)


def test_sweep_resume_with_another_grid_names_the_key_that_differs(cli, tmp_path):
    run_dir = tmp_path / "s"
    run_dir.mkdir()
    (run_dir / rundir.GRID_COPY).write_text(f'models = ["{MODEL}"]\nstrategies = ["lru"]\nbudgets = ["50%"]\n')
    grid = tmp_path / "grid.toml"
    grid.write_text(f'models = ["{MODEL}"]\nstrategies = ["lru"]\nbudgets = ["35%"]\n')
    code, _, err = cli("sweep", grid, "--resume", run_dir)
    line = error_line(err)
    assert code == 2 and 'sets budgets = ["35%"], the sweep was started with ["50%"]' in line


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_resume_with_a_run_id_of_another_folder_is_refused(cli, tmp_path, finished, command):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'models = ["{MODEL}"]\nstrategies = ["lru"]\nbudgets = ["50%"]\n')
    argv = ["run"] if command == "run" else ["sweep", grid]
    code, _, err = cli(*argv, "--resume", finished, "--run-id", "other", "--quiet")
    assert code == 2 and "but --run-id names 'other'; drop --run-id" in error_line(err)


def test_resume_with_its_own_run_id_is_honoured(cli, tmp_path, finished):
    run_dir = copy_run(finished, tmp_path / "r")
    code, _, err = cli("run", "--resume", run_dir, "--run-id", "r", "--quiet")
    assert code == 0, err
    assert len(rows_of(run_dir)) == 2


def test_resume_with_a_conflicting_option_names_the_field(cli, tmp_path, finished):
    run_dir = copy_run(finished, tmp_path / "r")
    code, _, err = cli("run", "--resume", run_dir, "--tokens", "3", "--quiet")
    assert code == 2 and "--tokens 3 conflicts with the run's 2" in error_line(err)


# ---- a cut last line -----------------------------------------------------------------------------------------
def test_sweep_resume_sets_a_cut_last_line_aside(cli, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'models = ["{MODEL}"]\nstrategies = ["lru"]\nbudgets = ["50%"]\ntokens = 2\nprompts = 1\n')
    code, _, err = cli("sweep", grid, "--out", tmp_path, "--run-id", "s", "--jobs", "1")
    assert code == 0, err
    assert f"· cell 1/1 done · {MODEL} · lru @ 50% · ok" in err  # a log gets one line per cell, no bar
    run_dir = tmp_path / "s"
    with open(run_dir / "rows.jsonl", "ab") as f:
        f.write(b'{"run_id": "s", "cell": "cut')  # a full disk stopped this write
    code, _, err = cli("sweep", grid, "--resume", run_dir, "--jobs", "1", "--quiet")
    assert code == 0, err
    assert any("set aside in rows.jsonl.partial" in line for line in warnings_of(err))
    assert len(rows_of(run_dir)) == 1 and (run_dir / rundir.PARTIAL).exists()


# ---- report, compare and gate flag duplicated cells and foreign rows -------------------------------------------
def doctor(run_dir: Path, how: str) -> None:
    lines = (run_dir / "rows.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    if how == "foreign":
        row["run_id"] = "another-run"
        row["cell"] = row["cell"] + "|x"
    with open(run_dir / "rows.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("how, needle", [("duplicate", "has 2 finished rows"),
                                         ("foreign", "rows of another run among run r's: 'another-run'")])
def test_report_flags_a_duplicated_cell_or_a_foreign_row(cli, tmp_path, finished, how, needle):
    run_dir = copy_run(finished, tmp_path / "r")
    doctor(run_dir, how)
    code, _, err = cli("report", run_dir)
    assert code == 0 and any(needle in line for line in warnings_of(err)), err
    assert needle in (run_dir / "summary.md").read_text()


def test_compare_flags_a_duplicated_cell(cli, tmp_path, finished):
    run_dir = copy_run(finished, tmp_path / "r")
    doctor(run_dir, "duplicate")
    code, _, err = cli("compare", finished, run_dir)
    assert code == 0 and any("has 2 finished rows" in line for line in warnings_of(err)), err


def test_gate_fails_on_a_foreign_row(cli, tmp_path, finished):
    run_dir = copy_run(finished, tmp_path / "r")
    doctor(run_dir, "foreign")
    code, out, err = cli("gate", run_dir, "--rule", "speedup strategy=lru over=on-demand metric=tpot_ms min=0.001")
    assert code == 1 and "rows of another run among" in out, out + err


def test_a_resumed_error_cell_is_not_a_duplicate(tmp_path, finished):
    from specterbench.runfiles.results import integrity_problems, read_rows

    run_dir = copy_run(finished, tmp_path / "r")
    rows = read_rows(run_dir)
    errored = rows[0].__class__(**{**{f: getattr(rows[0], f) for f in rows[0].__slots__}, "status": "error"})
    assert integrity_problems([errored, *rows], "x") == []


@pytest.mark.parametrize("command", ["report", "compare", "gate"])
def test_an_empty_rows_file_is_an_error_like_a_missing_one(cli, tmp_path, finished, command):
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    (run_dir / "rows.jsonl").write_text("")
    argv = {"report": ["report", run_dir], "compare": ["compare", finished, run_dir],
            "gate": ["gate", run_dir, "--rule", "speedup strategy=lru over=on-demand metric=tpot_ms min=0.001"]}
    code, _, err = cli(*argv[command])
    assert code == 2 and "no rows in" in error_line(err)


# ---- no folder left by a refused run, no lock by a finished one --------------------------------------------------
def test_a_run_refused_after_the_model_loads_leaves_no_run_folder(cli, tmp_path):
    code, _, err = cli("run", *FAST, "--strategies", "lru", "--budgets", "1%", "--out", tmp_path, "--run-id", "r")
    assert code == 2 and "below what lru needs" in error_line(err)
    assert not (tmp_path / "r").exists()


def test_a_finished_run_leaves_no_lock(finished):
    assert not (finished / rundir.LOCK).exists()


def test_a_lock_is_still_exclusive_after_a_writer_removed_it(tmp_path):
    first = rundir.RunLock(tmp_path).acquire()
    first.release()
    second = rundir.RunLock(tmp_path).acquire()
    with pytest.raises(Exception, match="being written by another specterbench process"):
        rundir.RunLock(tmp_path).acquire()
    second.release()
