"""Sweeps: grid files, cell keys, the local process-pool executor and the Ray executor.

Worker processes cannot see strategies registered in this process, so the failing strategies live in a real
tiny distribution on ``sys.path`` (local workers) and on ``PYTHONPATH`` (Ray workers). The grids are tiny (one
model, one budget, two prompts of four tokens) and each executor's sweep runs once per module; the tests read
its rows.
"""

import dataclasses
import os
import sys
import textwrap
from pathlib import Path

import pytest

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.executors import RayExecutor, require_ray
from specterbench.bench.grid import load_grid, parse_grid
from specterbench.bench.runner import Runner
from specterbench.bench.sweep import LocalExecutor, Plan, Sweep, expand
from specterbench.cli.sweep import add_parser as add_sweep_parser
from specterbench.errors import UsageError
from specterbench.plugins.host import PluginHost
from specterbench.runfiles.results import ResultRow, read_rows

MODEL = "tiny-random-mixtral"
FAILING = """
    import os

    from specterbench import Strategy, hookimpl

    class Raising(Strategy):
        name = "sweep-raising"
        version = "1"

        def after_layer(self, layer, experts):
            raise RuntimeError("boom")

    class Crashing(Strategy):
        name = "sweep-crashing"
        version = "1"

        def on_request_start(self, request):
            os._exit(3)  # the worker process dies mid-cell, as on a segfault or the OOM killer

    @hookimpl
    def specterbench_register_strategies(register):
        register(Raising)
        register(Crashing)
"""
SMALL = {"models": [MODEL], "budgets": ["35%"], "profiles": ["a100-40g-pcie4"], "seeds": [0], "tokens": 4,
         "prompts": 2}
GRID = {**SMALL, "strategies": ["lru", "oracle", "sweep-raising", "sweep-crashing"]}


def write_grid(path: Path, data: dict) -> Path:
    def toml(v):
        return "[" + ", ".join(toml(x) for x in v) + "]" if isinstance(v, list) else repr(v).replace("'", '"')

    path.write_text("".join(f"{k} = {toml(v)}\n" for k, v in data.items()))
    return path


@pytest.fixture(scope="module")
def failing_plugin(tmp_path_factory):
    """A real distribution with an entry point, importable by this process and by its workers."""
    root = tmp_path_factory.mktemp("dist")
    (root / "sweep_failing.py").write_text(textwrap.dedent(FAILING))
    info = root / "sweep_failing-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sweep-failing\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[specterbench]\nsweep-failing = sweep_failing\n")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def by_strategy(rows):
    return {r.strategy: r for r in rows}


def modeled(row: ResultRow) -> dict:
    """A row without what the host's wall clock, the worker or the run id decide."""
    d = dataclasses.asdict(row)
    for k in ("run_id", "env", "duration_s", "host_ms_per_token", "peak_host_rss_bytes", "error"):
        d.pop(k)
    d["samples"].pop("host_ms", None)
    d["warmup"].pop("host_ms", None)
    d["extra"].pop("sweep", None)
    return d


# ---- grid files -------------------------------------------------------------------------------------------


def test_an_unknown_grid_key_is_one_line_naming_it(tmp_path):
    with pytest.raises(UsageError, match=r"unknown key 'profile'; did you mean 'profiles'\?") as err:
        load_grid(write_grid(tmp_path / "g.toml", {**SMALL, "strategies": ["lru"], "profile": "x"}))
    assert "\n" not in str(err.value)


def test_unknown_names_are_refused_before_anything_runs(host, tmp_path):
    with pytest.raises(UsageError, match="unknown strategy 'lur'; did you mean 'lru'"):
        expand(parse_grid({**SMALL, "strategies": ["lur"]}), host)
    with pytest.raises(UsageError, match="unknown profile"):
        expand(parse_grid({**SMALL, "strategies": ["lru"], "profiles": ["a100-typo"]}), host)
    with pytest.raises(UsageError, match="strategy 'specter' has no option 'kk'"):
        expand(parse_grid({**SMALL, "strategies": ["specter"], "strategy_options": {"specter": {"kk": [2]}}}), host)
    with pytest.raises(UsageError, match="'specter' is not among the strategies"):
        expand(parse_grid({**SMALL, "strategies": ["lru"], "strategy_options": {"specter": {"k": [2]}}}), host)


def test_a_malformed_grid_value_names_the_key():
    with pytest.raises(UsageError, match="seeds takes whole numbers"):
        parse_grid({**SMALL, "strategies": ["lru"], "seeds": ["zero"]})
    with pytest.raises(UsageError, match="no 'budgets'"):
        parse_grid({"models": [MODEL], "strategies": ["lru"]})


def test_cell_keys_equal_the_single_run_keys(host):
    grid = parse_grid({**SMALL, "strategies": ["lru", "resident"], "budgets": ["35%", "50%"], "seeds": [0, 1]})
    keys = [c.key for c in expand(grid, host)]
    single = []
    for seed in (0, 1):
        config = BenchConfig(models=(MODEL,), strategies=("lru", "resident"),
                             budgets=(parse_budget("35%"), parse_budget("50%")), profile="a100-40g-pcie4",
                             tokens=4, prompts=2, seed=seed)
        single += [c[0] for c in Runner(host, config, Path("unused"), env={}).cells(MODEL)]
    assert sorted(keys) == sorted(single)
    assert len(keys) == 2 * (2 + 1)  # resident once, at 100%


def test_strategy_options_are_axes_and_part_of_the_key(host):
    grid = parse_grid({**SMALL, "strategies": ["lru", "specter"], "budgets": ["35%", "50%"],
                       "strategy_options": {"specter": {"k": [2, 4, 8], "bits": 4}}})
    cells = expand(grid, host)
    specter = [c for c in cells if c.strategy == "specter"]
    assert len(specter) == 3 * 2 and len(cells) == 3 * 2 + 2
    assert {c.config.strategy_options["specter"]["k"] for c in specter} == {2, 4, 8}
    assert "|specter[bits=4,k=8]|" in specter[-1].key
    assert len({c.key for c in cells}) == len(cells)


def test_a_run_with_options_keys_its_cells_by_them(host):
    config = BenchConfig(models=(MODEL,), strategies=("specter",), budgets=(parse_budget("50%"),),
                         profile="a100-40g-pcie4", strategy_options={"specter": {"k": 4}})
    [(key, *_)] = Runner(host, config, Path("unused"), env={}).cells(MODEL)
    assert "|specter[k=4]|" in key


def test_geometry_axis_takes_own_for_the_models_sizes(host):
    grid = parse_grid({**SMALL, "strategies": ["lru"], "geometry": ["own", "mixtral"]})
    assert [c.config.geometry for c in expand(grid, host)] == [None, "mixtral"]


def test_the_ray_executor_without_ray_says_how_to_install_it(host, tmp_path, monkeypatch):
    import argparse

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    parser = argparse.ArgumentParser()
    add_sweep_parser(parser.add_subparsers())
    args = parser.parse_args(["sweep", str(write_grid(tmp_path / "g.toml", {**SMALL, "strategies": ["lru"]})),
                              "--executor", "ray", "--out", str(tmp_path / "out")])
    with pytest.raises(UsageError, match=r"pip install 'specterbench\[ray\]'"):
        args.func(args)
    assert not (tmp_path / "out").exists()


# ---- the driver, with a stand-in executor -----------------------------------------------------------------


class Interrupted:
    """Finishes one cell, then the user presses Ctrl-C."""

    name = "stand-in"

    def check(self, grid):
        pass

    def rows(self, plan: Plan):
        yield plan.failed(plan.cells[0], "stand-in row")
        raise KeyboardInterrupt


def test_ctrl_c_stops_the_sweep_and_keeps_finished_rows(host, tmp_path):
    grid = parse_grid({**SMALL, "strategies": ["lru", "on-demand"]})
    result = Sweep(host, grid, tmp_path, executor=Interrupted(), quiet=True, env={}).run()
    assert result.interrupted and len(result.rows) == 1
    assert [r.strategy for r in read_rows(tmp_path)] == ["lru"]


def test_resume_plans_only_unfinished_cells_and_their_shared_jobs(host, tmp_path):
    grid = parse_grid({**SMALL, "strategies": ["lru", "static"]})
    Sweep(host, grid, tmp_path, executor=Interrupted(), quiet=True, env={}).run()  # an error row for lru
    plan = Sweep(host, grid, tmp_path, resume=True, env={}).plan()
    assert len(plan.cells) == 2  # an error row is not a finished cell
    ok = dataclasses.replace(read_rows(tmp_path)[0], status="ok")
    (tmp_path / "rows.jsonl").write_text(ok.to_json() + "\n")
    plan = Sweep(host, grid, tmp_path, resume=True, env={}).plan()
    assert [c.strategy for c in plan.cells] == ["static"]
    assert sorted(k[0] for k in plan.shared) == ["calibration", "reference"]


# ---- the local executor -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_sweep(failing_plugin, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("local")
    grid = parse_grid(GRID)
    result = Sweep(PluginHost(), grid, run_dir, executor=LocalExecutor(jobs=2), quiet=True, env={}).run()
    return run_dir, result


def test_local_sweep_merges_every_cell_into_one_rows_file(local_sweep):
    run_dir, result = local_sweep
    assert sorted(r.strategy for r in read_rows(run_dir)) == sorted(GRID["strategies"])
    rows = by_strategy(result.rows)
    assert rows["lru"].status == rows["oracle"].status == "ok"
    assert rows["lru"].lossless and rows["oracle"].lossless


def test_local_sweep_records_the_reference_once_and_shares_it(local_sweep):
    _, result = local_sweep
    assert result.shared_jobs == 1
    ok = [r for r in result.rows if r.status == "ok"]
    assert len({r.extra["sweep"]["reference"] for r in ok}) == 1


def test_local_sweep_a_cell_that_raises_becomes_an_error_row(local_sweep):
    row = by_strategy(local_sweep[1].rows)["sweep-raising"]
    assert row.status == "error" and "RuntimeError: boom" in row.error


def test_local_sweep_a_dead_worker_fails_only_its_own_cell(local_sweep):
    rows = by_strategy(local_sweep[1].rows)
    assert rows["sweep-crashing"].status == "error"
    assert "worker process died" in rows["sweep-crashing"].error
    assert rows["sweep-raising"].error.startswith("RuntimeError")  # a neighbour in flight was rerun, not blamed


def test_local_sweep_rows_equal_a_single_run(local_sweep, tmp_path):
    run_dir, result = local_sweep
    host = PluginHost()
    config = BenchConfig(models=(MODEL,), strategies=("lru", "oracle"), budgets=(parse_budget("35%"),),
                         profile="a100-40g-pcie4", tokens=4, prompts=2)
    single = {r.cell: r for r in Runner(host, config, tmp_path, env={}).run()}
    swept = {r.cell: r for r in result.rows if r.cell in single}
    assert swept.keys() == single.keys()
    for key in single:
        assert modeled(swept[key]) == modeled(single[key])


# ---- the Ray executor -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_session(failing_plugin):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'specterbench[ray]')")
    pythonpath = os.pathsep.join(p for p in (str(failing_plugin), os.environ.get("PYTHONPATH")) if p)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
        yield ray
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_sweep(ray_session, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ray")
    result = Sweep(PluginHost(), parse_grid(GRID), run_dir, executor=RayExecutor(), quiet=True, env={}).run()
    return run_dir, result


def test_ray_sweep_merges_every_cell_into_one_rows_file(ray_sweep):
    run_dir, result = ray_sweep
    assert sorted(r.strategy for r in read_rows(run_dir)) == sorted(GRID["strategies"])
    rows = by_strategy(result.rows)
    assert rows["lru"].status == rows["oracle"].status == "ok"
    assert {r.extra["sweep"]["executor"] for r in rows.values() if r.status == "ok"} == {"ray"}
    assert result.shared_jobs == 1 and len({rows[s].extra["sweep"]["reference"] for s in ("lru", "oracle")}) == 1


def test_ray_sweep_a_cell_that_raises_becomes_an_error_row(ray_sweep):
    row = by_strategy(ray_sweep[1].rows)["sweep-raising"]
    assert row.status == "error" and "RuntimeError: boom" in row.error


def test_ray_sweep_a_killed_workers_cell_is_reported(ray_sweep):
    row = by_strategy(ray_sweep[1].rows)["sweep-crashing"]
    assert row.status == "error" and "worker lost" in row.error and "WorkerCrashedError" in row.error


def test_ray_sweep_equals_the_local_sweep_cell_for_cell(ray_sweep, local_sweep):
    ray_rows = {r.cell: r for r in ray_sweep[1].rows}
    local_rows = {r.cell: r for r in local_sweep[1].rows}
    assert ray_rows.keys() == local_rows.keys()
    for key in ray_rows:
        assert modeled(ray_rows[key]) == modeled(local_rows[key]), key


def test_ray_sweep_resume_skips_finished_cells(ray_sweep):
    run_dir, _ = ray_sweep
    grid = parse_grid({**GRID, "strategies": ["lru", "oracle", "on-demand"]})
    result = Sweep(PluginHost(), grid, run_dir, executor=RayExecutor(), resume=True, quiet=True, env={}).run()
    assert [r.strategy for r in result.rows] == ["on-demand"] and result.skipped == 2
    assert sorted(r.strategy for r in read_rows(run_dir)) == sorted([*GRID["strategies"], "on-demand"])


def test_require_ray_returns_the_module_when_installed():
    pytest.importorskip("ray", reason="Ray is not installed")
    assert require_ray().__name__ == "ray"


def test_workers_run_functions_that_pickle_by_their_own_module():
    import pickle

    from specterbench.bench.sweep_jobs import record_shared, run_cell

    assert pickle.loads(pickle.dumps(run_cell)) is run_cell
    assert run_cell.__module__ == record_shared.__module__ == "specterbench.bench.sweep_jobs"
