"""The bad-input battery: every input a new user or a plugin author gets wrong gives one line naming the problem
and the fix, exit 2, no traceback — before any model loads where it can be known then — and no run folder loses or
mixes a row. In-process (``main([...])`` with capsys) on the tiny models, ``--prompts 1 --tokens 2``; a subprocess
only where a fresh interpreter is the point."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_errors import one_line  # noqa: E402

from specterbench import Strategy, hookimpl
from specterbench.cli import main
from specterbench.plugins.registry import BLOCK_ENV
from specterbench.runfiles import rundir
from specterbench.runfiles.results import RowWriter
from specterbench.testing.pytest_plugin import install_dist

MODEL = "tiny-random-mixtral"
FAST = ["--model", MODEL, "--strategies", "lru", "--budgets", "50%", "--prompts", "1", "--tokens", "2", "--quiet"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(host, capsys, monkeypatch):
    """``cli(*argv) -> (exit code, stdout, stderr)``, with the model load watched (``cli.loaded``)."""
    import specterbench.bench.runner as runner

    loaded = []
    original = runner.Runner.load_engine

    def load_engine(self, name):
        loaded.append(name)
        return original(self, name)

    monkeypatch.setattr(runner.Runner, "load_engine", load_engine)

    def call(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    call.loaded = loaded
    return call


def refused(cli, *argv, before_load: bool = True) -> str:
    cli.loaded.clear()
    code, _, err = cli(*argv)
    assert code == 2, err
    if before_load:
        assert cli.loaded == [], f"the model loaded before the refusal: {err}"
    return one_line(err)


def rows_of(run_dir: Path) -> list[dict]:
    """Every line of rows.jsonl parses as a complete row, and no cell appears twice."""
    lines = (run_dir / "rows.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) and "cell" in r for r in rows)
    cells = [r["cell"] for r in rows]
    assert len(cells) == len(set(cells)), f"duplicated rows: {cells}"
    return rows


# ---- run options: one line, exit 2, before the model loads -----------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--strategies", "lur"], "unknown strategy 'lur'; did you mean 'lru'"),
    (["--strategy", "lur"], "unknown strategy 'lur'"),
    (["--model", "tiny-random-mixtrl"], "did you mean 'tiny-random-mixtral'"),
    (["--profile", "a100"], "did you mean 'a100-40g-pcie4'"),
    (["--profile", "h100"], "unknown profile 'h100'"),
    (["--host-profile", "laptop"], "unknown host profile 'laptop'"),
    (["--geometry", "mixtrl"], "mixtrl"),
    (["--geometry", "mixtral", "--clock", "measured"], "only the modeled clock"),
    (["--clock", "wall"], "invalid choice: 'wall'"),
    (["--budgets", "lots"], "malformed budget 'lots'"),
    (["--budgets", "-5%"], "budget '-5%' is negative"),
    (["--budgets", "35"], "budget '35' has no unit; write 35% for a share"),
    (["--budgets", "1.5"], "must be in [0, 1]"),
    (["--tokens", "0"], "--tokens must be a positive"),
    (["--tokens", "-3"], "--tokens must be a positive"),
    (["--prompts", "0"], "PROMPTS must be positive"),
    (["--prompts", "1000"], "--prompts 1000 is more than workload 'shakespeare-heldout-v1' holds (40 prompts)"),
    (["--repeats", "0"], "repeats must be positive"),
    (["--threads", "0"], "threads must be positive"),
    (["--workload", "nosuch"], "nosuch"),
    (["--set", "lru"], "malformed --set"),
    (["--set", "nosuch.k=1"], "unknown strategy 'nosuch'"),
    (["--set", "lru.nosuch=1"], "strategy 'lru' has no option 'nosuch'"),
    (["--set", "lfu.half_life=8"], "strategy 'lfu' is not in this run"),
    (["--strategies", "specter", "--set", "specter.k=abc"], "specter.k=abc"),
    (["--strategies", "specter", "--set", "specter.k=99"], "specter.k=99"),
    (["--strategies", "specter", "--set", "specter.dense_bits=5"], "dense_bits=5 is invalid: use one of 16, 8, 4, 3"),
    (["--strategies", "specter", "--set", "specter.dense_quantizer=nf4"],
     "dense_quantizer=nf4 is invalid at dense_bits=8: use sym or int"),
    (["--decode", "beam"], "beam"),
    (["--decode", "sample", "--temperature", "0"], "temperature"),
    (["--decode", "sample", "--temperature", "6"], "temperature"),
    (["--decode", "sample", "--top-p", "0"], "top-p"),
    (["--decode", "sample", "--top-p", "1.5"], "top-p"),
    (["--decode", "sample", "--top-k", "0"], "top-k"),
    (["--device", "cuda"], "no CUDA device"),
    (["--device", "cuda:7"], "cuda:7"),
    (["--device", "tpu"], "tpu"),
    (["--run-id", "a/b"], "plain folder name"),
    (["--profile", "missing-profile.toml"], "missing-profile.toml"),
    (["--model", ""], "--model is empty"),
    (["--model", ","], "--model is empty"),
    (["--strategies", ""], "--strategies is empty"),
    (["--budgets", ""], "--budgets is empty"),
    (["--threads", "9999"], "threads 9999 is more than the"),
    (["--decode", "greedy", "--temperature", "0.7"], "--temperature shapes sampling, but --decode is greedy"),
    (["--decode", "greedy", "--top-k", "5"], "--top-k shapes sampling, but --decode is greedy"),
])
def test_a_bad_run_option_is_one_line_before_the_model_loads(cli, tmp_path, args, message):
    if args[:2] == ["--device", "cuda"] or args[:2] == ["--device", "cuda:7"]:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 7:  # pragma: no cover - a big GPU box
            pytest.skip("this machine has the device")
    line = refused(cli, "run", *FAST, "--out", tmp_path, *args)
    assert message in line, line
    assert not (tmp_path / "a").exists()


def test_strategy_is_an_alias_of_strategies(cli, tmp_path):
    code, out, err = cli("run", *FAST[:2], "--strategy", "lru", *FAST[4:], "--out", tmp_path, "--run-id", "r")
    assert code == 0, err
    assert [r["strategy"] for r in rows_of(tmp_path / "r")] == ["lru"]


@pytest.mark.parametrize("tokens, model", [("100000", MODEL), ("300", "tiny-mixtral")])
def test_tokens_beyond_the_context_are_refused_before_the_reference_runs(cli, tmp_path, tokens, model):
    line = refused(cli, "run", *FAST, "--model", model, "--tokens", tokens, "--out", tmp_path, before_load=False)
    assert "context of" in line and "use --tokens" in line


def test_a_budget_below_a_strategys_own_floor_is_refused_before_any_cell(cli, tmp_path):
    line = refused(cli, "run", *FAST, "--strategies", "lru,specter", "--budgets", "15%", "--out", tmp_path,
                   "--run-id", "r", before_load=False)
    assert "smallest budget that works is" in line
    assert not (tmp_path / "r" / "rows.jsonl").exists()


def test_debug_after_the_subcommand_shows_the_traceback(cli, tmp_path):
    with pytest.raises(Exception, match="unknown strategy"):
        main(["run", "--strategies", "lur", "--out", str(tmp_path), "--debug"])


@pytest.mark.parametrize("setup, message", [
    ("bad-json", "corrupt JSON"),
    ("no-weights", "no weights"),
    ("not-a-dir", "not-a-dir"),
])
def test_a_bad_model_path_is_one_line(cli, tmp_path, setup, message):
    path = tmp_path / setup
    if setup != "not-a-dir":
        path.mkdir()
        config = (ROOT / "specterbench/catalog/stand_ins/tiny-mixtral/config.json").read_text()
        (path / "config.json").write_text(config[: len(config) // 2] if setup == "bad-json" else config)
    code, _, err = cli("run", *FAST, "--model", "mixtral", "--model-path", path, "--out", tmp_path / "out")
    assert code == 2 and message in one_line(err)


def test_random_bytes_as_weights_are_one_line_and_leave_no_run_folder(cli, tmp_path):
    path = tmp_path / "ckpt"
    path.mkdir()
    (path / "config.json").write_text((ROOT / "specterbench/catalog/stand_ins/tiny-mixtral/config.json").read_text())
    (path / "model.safetensors").write_bytes(os.urandom(4096))
    code, _, err = cli("run", *FAST[2:], "--model-path", path, "--out", tmp_path / "out", "--run-id", "r")
    assert code == 2 and "not a readable safetensors file" in one_line(err)
    assert not (tmp_path / "out" / "r").exists()


def test_a_profile_file_with_an_infinite_figure_is_refused(cli, tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text('[profile]\nname = "x"\naccelerator = "x"\nflops_per_s = inf\nmem_bytes_per_s = 1e12\n'
                       'link_bytes_per_s = 2.5e10\nlink_latency_us = 10.0\nlaunch_us = 5.0\n'
                       'device_memory_bytes = 4e10\n')
    line = refused(cli, "run", *FAST, "--profile", profile, "--out", tmp_path)
    assert "flops_per_s must be finite, got inf" in line


def test_a_plugin_profile_with_an_infinite_figure_is_left_out(host, capsys):
    import dataclasses

    base = host.profiles().get("a100-40g-pcie4")

    class P:
        @hookimpl
        def specterbench_register_profiles(self, register):
            register(dataclasses.replace(base, name="infinite", flops_per_s=float("inf")))

    host.register(P(), "inf-plugin")
    assert "infinite" not in host.profiles().names() and "a100-40g-pcie4" in host.profiles().names()
    assert "field flops_per_s must be finite, got inf" in capsys.readouterr().err


def test_validate_given_a_built_in_profile_name_says_to_calibrate_this_machine(cli):
    line = refused(cli, "validate", "--profile", "a100-40g-pcie4")
    assert "is a built-in profile" in line and "specterbench calibrate --out results/profile.toml" in line


def test_calibrate_out_a_folder_is_refused_before_measuring(cli, tmp_path):
    assert "is a folder; give the profile file to write" in refused(cli, "calibrate", "--out", tmp_path)


# ---- run folders: saved options, resume, lock, partial rows, disk full -----------------------------------
def start(cli, tmp_path, *extra):
    code, _, err = cli("run", *FAST, "--strategies", "lru,on-demand", "--out", tmp_path, "--run-id", "r", *extra)
    assert code == 0, err
    return tmp_path / "r"


def test_a_bare_resume_restores_the_saved_run(cli, tmp_path):
    run_dir = start(cli, tmp_path)
    saved = json.loads((run_dir / rundir.RUN_JSON).read_text())["options"]
    assert saved["model"] == MODEL and saved["strategies"] == "lru,on-demand" and saved["tokens"] == 2
    before = rows_of(run_dir)
    code, _, err = cli("run", "--resume", run_dir, "--quiet")
    assert code == 0, err
    assert rows_of(run_dir) == before  # every cell was done: nothing added, nothing duplicated


def test_resume_with_a_conflicting_option_is_refused(cli, tmp_path):
    run_dir = start(cli, tmp_path)
    before = rows_of(run_dir)
    line = refused(cli, "run", "--resume", run_dir, "--model", "tiny-random-qwen2-moe")
    assert "--model 'tiny-random-qwen2-moe' conflicts with the run's 'tiny-random-mixtral'" in line
    assert rows_of(run_dir) == before


def test_resume_of_a_missing_folder_is_refused(cli, tmp_path):
    assert "no such run folder" in refused(cli, "run", "--resume", tmp_path / "nope")


def test_an_existing_run_id_without_resume_is_refused(cli, tmp_path):
    run_dir = start(cli, tmp_path)
    before = rows_of(run_dir)
    line = refused(cli, "run", *FAST, "--out", tmp_path, "--run-id", "r", before_load=False)
    assert "already holds a run; continue it with --resume" in line
    assert rows_of(run_dir) == before


def test_a_second_writer_is_refused_while_the_folder_is_locked(cli, tmp_path):
    run_dir = start(cli, tmp_path)
    before = rows_of(run_dir)
    with rundir.RunLock(run_dir):
        line = refused(cli, "run", "--resume", run_dir, before_load=False)
    assert "being written by another specterbench process" in line
    assert rows_of(run_dir) == before


def test_a_partial_last_row_is_set_aside_on_resume_and_every_complete_row_survives(cli, tmp_path):
    run_dir = start(cli, tmp_path)
    rows = (run_dir / "rows.jsonl").read_text().splitlines()
    (run_dir / "rows.jsonl").write_text(rows[0] + "\n" + rows[1][: len(rows[1]) // 2])  # killed mid-write
    code, _, err = cli("run", "--resume", run_dir, "--quiet")
    assert code == 0, err
    assert "were not rows (cut off or corrupt)" in err and "Traceback" not in err
    after = rows_of(run_dir)
    assert len(after) == 2 and after[0] == json.loads(rows[0])
    assert (run_dir / rundir.PARTIAL).exists()


def test_a_full_disk_is_one_line_and_keeps_the_rows_written(cli, tmp_path, monkeypatch):
    original = RowWriter.append
    calls = []

    def append(self, row):
        calls.append(row.cell)
        if len(calls) == 2:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(row.to_json()[:40])  # what was written before the disk filled
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        original(self, row)

    monkeypatch.setattr(RowWriter, "append", append)
    code, _, err = cli("run", *FAST, "--strategies", "lru,on-demand", "--out", tmp_path, "--run-id", "r")
    assert code == 2 and "No space left on device" in one_line(err) and "--resume" in err
    monkeypatch.setattr(RowWriter, "append", original)
    code, _, err = cli("run", "--resume", tmp_path / "r", "--quiet")
    assert code == 0, err
    assert sorted(r["strategy"] for r in rows_of(tmp_path / "r")) == ["lru", "on-demand"]


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "plot.png")


def test_plots_on_a_full_disk_are_one_line_and_keep_the_rows(cli, tmp_path, monkeypatch):
    import specterbench.analysis.plots as plots

    monkeypatch.setattr(plots, "write_plots", full_disk)
    code, _, err = cli("run", *FAST, "--out", tmp_path, "--run-id", "r")
    line = one_line(err)
    assert code == 2 and "No space left on device" in line and "the rows in" in line
    assert len(rows_of(tmp_path / "r")) == 1
    code, _, err = cli("report", tmp_path / "r")
    assert code == 2 and "No space left on device" in one_line(err)


def test_an_unwritable_out_is_one_line(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert "cannot write the run folder" in refused(cli, "run", *FAST, "--out", blocker / "sub")


# ---- summaries of runs without a GPU's TPOT ---------------------------------------------------------------
class Boom(Strategy):
    name = "boom"
    version = "1"

    def before_layer(self, layer, experts, n):
        if layer == 1:
            raise ValueError("bad strategy")


class BoomPlugin:
    @hookimpl
    def specterbench_register_strategies(self, register):
        register(Boom)


def test_an_all_error_run_writes_its_summary_and_names_where_the_strategy_failed(cli, host, tmp_path):
    host.register(BoomPlugin(), "boom-plugin")
    code, out, err = cli("run", *FAST, "--strategies", "boom", "--out", tmp_path, "--run-id", "r")
    assert code == 1 and "Traceback" not in err
    assert "boom" in (tmp_path / "r" / "summary.md").read_text()
    row = rows_of(tmp_path / "r")[0]
    assert row["status"] == "error" and "in before_layer, layer 1, position" in row["error"]
    assert row["extra"]["failure"]["plugin_frame"].startswith(__file__)


def test_a_measured_run_on_a_cpu_renders_host_rows(cli, tmp_path):
    code, out, err = cli("run", *FAST, "--clock", "measured", "--out", tmp_path, "--run-id", "r")
    assert code == 0, err
    assert "host wall time only" in (tmp_path / "r" / "summary.md").read_text()
    assert rows_of(tmp_path / "r")[0]["clock"] == "host"


# ---- report, compare, gate, overhead, eval -----------------------------------------------------------------
@pytest.fixture
def finished(cli, tmp_path):
    return start(cli, tmp_path)


def test_report_given_the_rows_file_names_the_folder(cli, finished):
    line = refused(cli, "report", finished / "rows.jsonl")
    assert "is a file; give the run folder that holds it" in line and str(finished) in line


def test_report_of_a_missing_folder_is_one_line(cli, tmp_path):
    assert "no run folder" in refused(cli, "report", tmp_path / "nope")


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage\n", b"[1, 2, 3]\n", b'{"cut": \n'])
def test_report_of_a_corrupt_rows_file_is_one_line(cli, tmp_path, content):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "rows.jsonl").write_bytes(content)
    assert "corrupt or partial row" in refused(cli, "report", tmp_path / "r")


def test_compare_of_runs_of_different_models_is_refused(cli, tmp_path, finished):
    code, _, err = cli("run", *FAST, "--model", "tiny-random-qwen2-moe", "--out", tmp_path, "--run-id", "q")
    assert code == 0, err
    assert "refusing to compare runs with a different model" in refused(cli, "compare", finished, tmp_path / "q")


def test_compare_with_an_alpha_outside_0_1_is_refused(cli, finished):
    assert "--alpha 2.0 must be in (0, 1)" in refused(cli, "compare", finished, finished, "--alpha", "2")


def test_gate_of_a_missing_run_is_one_line(cli, tmp_path):
    assert "no results at" in refused(cli, "gate", tmp_path / "nope", "--rule",
                                      "speedup strategy=lru over=on-demand metric=tpot_ms min=1.0")


def test_gate_json_that_cannot_be_written_is_one_line(cli, tmp_path, finished):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = cli("gate", finished, "--rule", "speedup strategy=lru over=on-demand metric=tpot_ms min=0.001",
                       "--json", blocker / "gate.json")
    assert code == 2 and "cannot write --json" in one_line(err)


def test_overhead_with_threads_beyond_the_machine_is_refused(cli):
    assert "threads 9999 is more than the" in refused(cli, "overhead", "--model", MODEL, "--threads", "9999")


def test_overhead_with_zero_tokens_is_refused(cli):
    assert "--tokens must be positive" in refused(cli, "overhead", "--model", MODEL, "--tokens", "0")


def test_eval_with_a_malformed_budget_is_refused_before_anything_runs(cli, tmp_path):
    assert "malformed budget 'abc'" in refused(cli, "eval", "--model", MODEL, "--budget", "abc",
                                                "--out", tmp_path)


@pytest.mark.parametrize("args, message", [
    (["--include-path", "no/such/tasks"], "--include-path no/such/tasks: no such folder"),
    (["--strategies", ""], "--strategies is empty"),
    (["--model", ","], "--model is empty"),
    (["--strategies", "lur"], "unknown strategy 'lur'"),
    (["--tasks", ","], "--tasks is empty"),
    (["--profile", "h100"], "unknown profile 'h100'"),
    (["--device", "tpu"], "tpu"),
    (["--temperature", "0.5"], "--temperature shapes sampling, but --decode is greedy"),
    (["--strategies", "lru", "--set", "lru.nosuch=1"], "strategy 'lru' has no option 'nosuch'"),
    (["--bootstrap-iters", "-1"], "--bootstrap-iters must be >= 0"),
    (["--strategies", "specter", "--set", "specter.k=abc"], "k"),
    (["--tasks", "shakespeare_scrambel"], "shakespeare_scrambel"),
])
def test_eval_options_are_checked_before_any_evaluation(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.setattr("specterbench.quality.evaluate.run_eval", lambda *a, **k: pytest.fail("the evaluation started"))
    line = refused(cli, "eval", "--model", MODEL, "--out", tmp_path, *args)
    assert message in line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["--model", "specterbench", "--tasks", "shakespeare_scramble"], "needs --model_args model=NAME"),
    (["--model", "specterbench", "--model_args", "strategy=lru", "--tasks", "x"], "needs --model_args model=NAME"),
    (["--model", "specterbench", "--model_args", "model=tiny-mixtral", "--device", "tpu"], "tpu"),
])
def test_the_lm_eval_wrapper_refuses_what_lm_eval_would_accept_silently(capsys, argv, message):
    from specterbench.cli.lm_eval import main as wrapper

    assert wrapper(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--run-id", "a/b"], "must be a plain folder name"),
    (["--run-id", ""], "must be a plain folder name"),
    (["--retries", "2"], "--retries is for --executor ray"),
    (["--jobs", "0"], "--jobs must be positive"),
])
def test_a_bad_sweep_option_is_one_line_before_anything_runs(cli, tmp_path, args, message):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'models = ["{MODEL}"]\nstrategies = ["lru"]\nbudgets = ["50%"]\n')
    assert message in refused(cli, "sweep", grid, "--out", tmp_path / "out", *args)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["eval", "--model", MODEL, "--drafts", ","], "--drafts is empty"),
    (["calibrate", "--name", " "], "--name is empty"),
    (["run", *FAST, "--run-id", ""], "--run-id is empty"),
])
def test_an_empty_name_is_refused_not_taken_for_the_default(cli, tmp_path, monkeypatch, args, message):

    monkeypatch.setattr("specterbench.quality.evaluate.run_eval", lambda *a, **k: pytest.fail("the evaluation started"))
    assert message in refused(cli, *args, "--out", tmp_path / "out")


def test_a_greedy_grid_with_a_temperature_is_refused(cli, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'models = ["{MODEL}"]\nstrategies = ["lru"]\nbudgets = ["50%"]\ndecode = "greedy"\n'
                    f'temperature = 0.7\n')
    assert "temperature shapes sampling, but decode = 'greedy'" in refused(cli, "sweep", grid)


def test_sweep_of_a_missing_grid_is_one_line(cli, tmp_path):
    assert "grid.toml" in refused(cli, "sweep", tmp_path / "grid.toml")


def test_make_sweep_quotes_a_grid_path_with_spaces():
    out = subprocess.run(["make", "-n", "sweep", "GRID=dir with spaces/grid.toml"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert "sweep 'dir with spaces/grid.toml'" in out


def test_an_unknown_subcommand_is_one_line(cli):
    assert "invalid choice: 'rnu'" in refused(cli, "rnu")


# ---- plugin authors' mistakes --------------------------------------------------------------------------------
TYPO_PLUGIN = """
    from specterbench import hookimpl

    @hookimpl
    def specterbench_register_strategy(register):
        pass
"""


def warning_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("specterbench: warning:")]


def test_a_hook_name_typo_names_the_plugin_the_hook_and_the_closest_real_one(cli, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(install_dist(tmp_path, "typo-plugin", "typo_plugin", TYPO_PLUGIN, "typo")))
    code, out, err = cli("list")
    assert code == 0 and "lru" in out
    (line,) = warning_lines(err)
    assert ("plugin 'typo' implements unknown hook 'specterbench_register_strategy'; did you mean "
            "'specterbench_register_strategies'?") in line


def test_a_plugin_that_fails_to_import_does_not_stop_other_commands(cli, tmp_path, monkeypatch):
    root = install_dist(tmp_path, "broken-plugin", "broken_plugin", "import does_not_exist\n", "broken")
    monkeypatch.syspath_prepend(str(root))
    code, out, err = cli("list")
    assert code == 0 and "lru" in out
    (line,) = warning_lines(err)
    assert "plugin 'broken'" in line and "does_not_exist" in line and f"{BLOCK_ENV}=broken" in line


def test_plugins_lists_a_plugin_that_failed(cli, tmp_path, monkeypatch):
    root = install_dist(tmp_path, "broken-plugin", "broken_plugin", "import does_not_exist\n", "broken")
    monkeypatch.syspath_prepend(str(root))
    code, out, _ = cli("plugins")
    assert code == 0 and "failed to load" in out and "broken" in out and "does_not_exist" in out


def test_blocking_a_plugin_that_does_not_exist_warns(cli, monkeypatch):
    monkeypatch.setenv(BLOCK_ENV, ",".join(filter(None, [os.environ.get(BLOCK_ENV), "nosuch"])))
    code, out, err = cli("list")
    assert code == 0 and "lru" in out
    (line,) = warning_lines(err)
    assert "'nosuch'" in line and "installed:" in line


def test_a_misspelled_decision_point_is_refused_at_registration(cli, host):
    class Typo(Strategy):
        name = "typo-victim"
        version = "1"

        def choose_victm(self, candidates, needed):  # never called by the engine
            return candidates[0]

    class P:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(Typo)

    host.register(P(), "typo-victim-plugin")
    code, _, err = cli("run", *FAST, "--strategies", "typo-victim")
    (warning,) = warning_lines(err)
    assert "choose_victm" in warning and "choose_victim" in warning
    (line,) = [line for line in err.splitlines() if line.startswith("specterbench: error:")]
    assert code == 2 and "refused at registration" in line and "choose_victm" in line


def test_the_pytest_plugin_survives_a_parent_folder_named_specterbench(tmp_path):
    (tmp_path / "specterbench").mkdir()  # a clone, seen from its parent folder
    (tmp_path / "test_x.py").write_text("def test_x(host):\n    assert 'lru' in host.strategies().names()\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "shadows the installed package" in run.stderr


# ---- progress bars ---------------------------------------------------------------------------------------------
def test_no_progress_bars_when_stderr_is_not_a_terminal(tmp_path):
    run = subprocess.run([sys.executable, "-m", "specterbench", "run", *FAST, "--out", str(tmp_path),
                          "--run-id", "r"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CI": ""})
    assert run.returncode == 0, run.stderr
    assert "it/s]" not in run.stderr and "Loading weights" not in run.stderr


@pytest.mark.parametrize("drafts, needle", [("int3/g128+d5", "dense_bits=5 is invalid"),
                                            ("int3/g128+dx", "cannot read 'int3/g128+dx'")])
def test_eval_drafts_with_a_bad_dense_copy_are_refused_before_anything_runs(cli, tmp_path, drafts, needle):
    assert needle in refused(cli, "eval", "--model", MODEL, "--drafts", drafts, "--out", tmp_path)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_eval_on_a_cuda_device_this_machine_lacks_is_one_line(cli, tmp_path):
    line = refused(cli, "eval", "--model", MODEL, "--device", "cuda", "--out", tmp_path, before_load=False)
    assert "no CUDA device" in line and "--device cpu" in line


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_the_lm_eval_wrapper_on_a_cuda_device_this_machine_lacks_is_one_line(capsys):
    from specterbench.cli.lm_eval import main

    code = main(["--model", "specterbench", "--model_args", f"model={MODEL}", "--tasks", "shakespeare_scramble",
                 "--device", "cuda", "--limit", "1"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # lm-eval logs its own lines first
    assert code == 2 and last.startswith("specterbench-lm-eval: error:") and "no CUDA device" in last
    assert "Traceback" not in err


def test_a_reader_that_goes_away_ends_the_command_quietly(monkeypatch, capsys):
    """`specterbench list | head`: the pipe closes under the writer; the command stops with SIGPIPE's status and no
    traceback."""
    import os
    import sys

    from specterbench.cli import main

    class ClosedPipe:
        def __init__(self):
            self.fd = os.open(os.devnull, os.O_WRONLY)

        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def fileno(self):
            return self.fd

    pipe = ClosedPipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    try:
        assert main(["list"]) == 141
    finally:
        os.close(pipe.fd)
    assert "Traceback" not in capsys.readouterr().err
