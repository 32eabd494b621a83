"""The sweep and eval splits: each part is a module a reader can hold in their head, and every name the one-module
layout exported still imports from the old paths (``specterbench.sweep``, ``specterbench.evaluate`` included)."""

import importlib
from pathlib import Path

import pytest

import specterbench

PACKAGE = Path(specterbench.__file__).parent
SPLIT = ["bench/sweep.py", "bench/sweep_jobs.py", "bench/executors.py", "bench/sweep_cli.py", "quality/evaluate.py",
         "quality/eval_rows.py", "quality/eval_report.py", "quality/eval_cli.py"]
SWEEP_NAMES = ["Cell", "Grid", "LocalExecutor", "Plan", "RayExecutor", "SharedJob", "SharedReference", "Sweep",
               "SweepResult", "add_sweep_parser", "cmd_sweep", "error_row", "expand", "load_grid", "parse_grid",
               "record_shared", "require_ray", "run_cell"]
EVAL_NAMES = ["DRAFT", "REFERENCE", "EvalRow", "add_parser", "cmd_eval", "compare_samples", "default_models",
              "default_strategies", "headline", "quality_table", "ratio_stderr", "render_markdown", "resolve_tasks",
              "rows_from_results", "run_eval", "write_report"]


@pytest.mark.parametrize("path", SPLIT)
def test_each_part_of_the_split_stays_under_400_lines(path):
    assert len((PACKAGE / path).read_text().splitlines()) < 400


@pytest.mark.parametrize("module", ["specterbench.bench.sweep", "specterbench.sweep"])
@pytest.mark.parametrize("name", SWEEP_NAMES)
def test_the_sweep_names_still_import_from_the_sweep_module(module, name):
    assert getattr(importlib.import_module(module), name) is not None


@pytest.mark.parametrize("module", ["specterbench.quality.evaluate", "specterbench.evaluate"])
@pytest.mark.parametrize("name", EVAL_NAMES)
def test_the_eval_names_still_import_from_the_evaluate_module(module, name):
    assert getattr(importlib.import_module(module), name) is not None


def test_workers_run_functions_that_pickle_by_their_new_module():
    import pickle

    from specterbench.bench.sweep import record_shared, run_cell

    assert pickle.loads(pickle.dumps(run_cell)) is run_cell
    assert run_cell.__module__ == record_shared.__module__ == "specterbench.bench.sweep_jobs"


def test_every_module_of_the_split_imports_on_its_own():
    """No import cycle between the parts: each imports first, in an interpreter without specterbench loaded."""
    import subprocess
    import sys

    modules = ["specterbench." + path.removesuffix(".py").replace("/", ".") for path in SPLIT]
    script = ("import importlib, sys\n"
              f"for name in {modules!r}:\n"
              "    for loaded in [m for m in sys.modules if m.startswith('specterbench')]:\n"
              "        del sys.modules[loaded]\n"
              "    importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]
