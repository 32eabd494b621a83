"""Sweeps: a grid file run as independent cells on a local process pool or a Ray cluster, into one ``rows.jsonl``.

A grid (TOML; ``specterbench.bench.grid``, ``docs/sweeps.md``, ``examples/grid.toml``) names each axis — models, strategies, budgets,
profiles, geometry, seeds, tokens, prompts, workload and per-strategy option axes such as
``[strategy_options.specter] k = [2, 4, 8]`` — and expands to cells whose keys equal the keys of ``specterbench
run``, so ``report``, the gate and ``--resume`` read a sweep's rows exactly as a single run's.

Work is of two kinds, both run by an executor on its workers:

- *shared* jobs, once per (model, workload, prompts, tokens) — the reference tokens and routing trace — and once
  per (model, calibration workload) for the strategies that profile; their results go to every cell that needs
  them (pickled to the local pool, or as one object in Ray's object store), never recomputed per cell;
- *cells*, one row each. A worker process keeps the last model it loaded, so consecutive cells of one model load
  it once.

The driver appends rows (fsync per row) as cells finish; a cell that fails, or whose worker dies or node is lost,
becomes an error row with the reason and the sweep goes on; Ctrl-C stops scheduling and keeps what finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from specterbench.errors import BudgetError, UsageError
from specterbench.bench.grid import (OWN_GEOMETRY, Cell, Grid, SharedJob, calibration_key, expand, load_grid, parse_grid,  # noqa: F401
                   reference_key)
from specterbench.bench.results import ResultRow, RowWriter, read_rows

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.plugins.host import PluginHost
    from specterbench.bench.runner import BenchConfig, Budget

RAY_INSTALL_HINT = "pip install 'specterbench[ray]'"
# Environment the driver's plugin host resolved names with; workers must see the same.
PROPAGATED_ENV_PREFIXES = ("SPECTERBENCH_",)

# ---- the work, as run on a worker -------------------------------------------------------------------------

_WORKER: dict[str, Any] = {"engine_key": None, "engine": None, "env": None}


@dataclass(frozen=True, slots=True)
class SharedReference:
    """A recorded reference, with the encoded prompts it was recorded on."""

    id: str  # where and when it was recorded: every cell that used it names it in ``extra["sweep"]``
    prompts: list
    reference: Any  # runner.Reference
    total_expert_bytes: int


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _worker(cfg: "BenchConfig", run_dir: str = "."):
    """(host, runner, engine) in this worker process; the engine is kept for the next job on the same model."""
    import torch

    from specterbench.engine.geometry import project
    from specterbench.plugins.host import get_host
    from specterbench.bench.runner import Runner

    torch.set_num_threads(cfg.threads)
    host = get_host()
    if _WORKER["env"] is None:
        _WORKER["env"] = host.environment()
    runner = Runner(host, cfg, Path(run_dir), env=_WORKER["env"])
    key = (cfg.models[0], cfg.device)
    if _WORKER["engine_key"] != key:
        _WORKER["engine_key"] = _WORKER["engine"] = None  # drop the previous model before loading the next
        _WORKER["engine"] = runner.load_engine(cfg.models[0])
        _WORKER["engine_key"] = key
    engine = _WORKER["engine"]
    engine.geometry = project(engine.own_geometry, cfg.geometry) if cfg.geometry else engine.own_geometry
    return host, runner, engine


def record_shared(job: SharedJob):
    """Run a shared job: a :class:`SharedReference` or a :class:`specterbench.plugins.strategy.Calibration`."""
    from specterbench.bench import runner as runner_module

    cfg = job.config
    _, runner, engine = _worker(cfg)
    if job.kind == "calibration":
        return runner.calibrate(engine)
    prompts = runner_module.encode_prompts(engine, runner_module.load_prompts(cfg.workload, cfg.prompts),
                                           cfg.max_prompt_tokens)
    reference = runner.record_reference(engine, prompts)
    return SharedReference(f"{_worker_id()}:{time.time_ns()}", prompts, reference, engine.total_expert_bytes)


def run_cell(cell: Cell, run_dir: str, shared: SharedReference, calibration=None,
             executor: str = "local") -> ResultRow:
    """Run one cell with its shared reference (and calibration) on this worker; a failure is the row's."""
    import torch

    cfg = cell.config
    host, runner, engine = _worker(cfg, run_dir)
    torch.manual_seed(cfg.seed)
    cls = host.strategies().get(cell.strategy)
    try:
        if cls.fixed_budget_fraction is None:
            runner.check_budgets(engine)
    except BudgetError as err:
        row = error_row(host, cell, Path(run_dir).name, _WORKER["env"], f"BudgetError: {err}",
                        engine.total_expert_bytes)
    else:
        row = runner.run_cell(engine, cell.key, cell.strategy, cls, cell.budget, cell.repeat, shared.prompts,
                              shared.reference, calibration)
    row.extra["sweep"] = {"executor": executor, "worker": _worker_id(), "reference": shared.id}
    return row


def error_row(host: "PluginHost", cell: Cell, run_id: str, env: dict, reason: str,
              total_expert_bytes: int | None = None) -> ResultRow:
    """The row of a cell that produced none itself (its worker died, its reference failed, it was refused)."""
    cfg, budget = cell.config, cell.budget
    entry = host.strategies().entry(cell.strategy)
    cls = entry.obj
    total = total_expert_bytes or 0
    nbytes = budget.resolve(total) if total else (budget.nbytes or 0)
    fraction = budget.fraction if budget.fraction is not None else (nbytes / total if total else 0.0)
    geometry = cfg.geometry or cell.model
    row = ResultRow(
        run_id=run_id, cell=cell.key, model=cell.model, geometry=geometry, geometry_label=geometry,
        priced_total_expert_bytes=0, strategy=cell.strategy, strategy_version=str(cls.version),
        strategy_plugin=f"{entry.plugin.name} ({entry.plugin.distribution} {entry.plugin.version})",
        lossless_strategy=bool(cls.lossless), budget_bytes=nbytes, budget_fraction=fraction, total_expert_bytes=total,
        profile=cfg.profile if cfg.clock == "modeled" else "-",
        clock=cfg.clock if (cfg.clock == "modeled" or cfg.device.startswith("cuda")) else "host",
        workload=cfg.workload, prompts=cfg.prompts, new_tokens=cfg.tokens, seed=cfg.seed, repeat=cell.repeat,
        status="error", error=reason, env=env)
    if cfg.strategy_options:
        row.extra["strategy_options"] = dict(cfg.strategy_options.get(cell.strategy, {}))
    return row


# ---- the plan the driver hands an executor ----------------------------------------------------------------


@dataclass(slots=True)
class Plan:
    """The cells to run, the shared jobs they need, and how the driver writes a row for a cell that made none."""

    host: "PluginHost"
    cells: list[Cell]
    shared: dict[tuple, SharedJob]
    needs: dict[str, tuple[tuple, ...]]  # cell key -> shared keys, reference first
    run_dir: Path
    env: dict
    expert_bytes: dict[str, int] = field(default_factory=dict)  # model -> total expert bytes, once known

    def failed(self, cell: Cell, reason: str) -> ResultRow:
        return error_row(self.host, cell, self.run_dir.name, self.env, reason, self.expert_bytes.get(cell.model))

    def shared_done(self, key: tuple, value) -> None:
        if isinstance(value, SharedReference):
            self.expert_bytes[key[1]] = value.total_expert_bytes


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


# ---- executors --------------------------------------------------------------------------------------------


PRELOAD = ["specterbench.bench.runner", "specterbench.bench.sweep", "transformers.modeling_utils"]  # by the forkserver


class LocalExecutor:
    """One process per cell, ``jobs`` at once (default: one per CPU core / ``threads``, or one per GPU).

    Workers come from a ``forkserver`` (``spawn`` where there is none) process pool with specterbench preloaded.
    A worker that dies breaks the whole pool: the cells in flight are rerun alone on a fresh pool, so that only
    the one that dies again becomes an error row.
    """

    name = "local"

    def __init__(self, jobs: int | None = None):
        if jobs is not None and jobs <= 0:
            raise UsageError(f"--jobs must be positive, got {jobs}")
        self.jobs = jobs

    def capacity(self, device: str, threads: int) -> int:
        if self.jobs is not None:
            return self.jobs
        if device.startswith("cuda"):
            return max(1, _cuda_count())
        return max(1, (os.cpu_count() or 1) // max(1, threads))

    def check(self, grid: Grid) -> None:
        if grid.device.startswith("cuda") and _cuda_count() == 0:
            raise UsageError(f"{grid.source}: device {grid.device!r} but this machine has no CUDA device; use "
                             f"device = 'cpu' or run on a Ray cluster with GPUs (--executor ray)")

    def _pool(self, workers: int, gpus: bool):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        if ctx.get_start_method() == "forkserver":
            # imported once by the server, so a fresh worker (also after a crash) starts in a fraction of a second
            ctx.set_forkserver_preload(PRELOAD)
        gpu_ids = None
        if gpus:
            gpu_ids = ctx.Queue()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = [g for g in visible.split(",") if g.strip()] if visible else [str(i) for i in range(_cuda_count())]
            for i in range(workers):
                gpu_ids.put(ids[i % len(ids)])
        return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_local_worker,
                                   initargs=(dict(os.environ), gpu_ids))

    def rows(self, plan: Plan) -> Iterator[ResultRow]:
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        if not plan.cells:
            return
        first = plan.cells[0].config
        gpus = first.device.startswith("cuda")
        workers = self.capacity(first.device, first.threads)
        device = "cuda" if gpus else None  # each worker sees one GPU, as cuda:0
        run_dir = str(plan.run_dir)
        shared_todo = deque(plan.shared.values())
        values: dict[tuple, Any] = {}
        errors: dict[tuple, str] = {}
        waiting = deque(plan.cells)
        suspects: deque = deque()  # jobs in flight when a worker died: rerun one at a time
        inflight: dict = {}  # future -> job (SharedJob or Cell)
        pool = None
        try:
            while shared_todo or waiting or inflight or suspects:
                # cells whose shared input failed can be answered without running
                for cell in [c for c in waiting if any(k in errors for k in plan.needs[c.key])]:
                    waiting.remove(cell)
                    k = next(k for k in plan.needs[cell.key] if k in errors)
                    yield plan.failed(cell, f"could not record the {k[0]} of {cell.model}: {errors[k]}")
                if pool is None:
                    pool = self._pool(workers, gpus)
                alone = bool(suspects) or any(a for _, a in inflight.values())  # isolating: one job at a time
                while len(inflight) < (1 if alone else workers):
                    if alone:
                        job = suspects.popleft() if suspects else None
                    else:
                        job = self._next(shared_todo, waiting, plan, values)
                    if job is None:
                        break
                    try:
                        inflight[self._submit(pool, job, plan, values, run_dir, device)] = (job, alone)
                    except BrokenProcessPool:  # a worker died between jobs (say, killed while idle)
                        (suspects if alone else shared_todo if isinstance(job, SharedJob) else waiting).appendleft(job)
                        if not inflight:
                            pool.shutdown(wait=True)
                            pool = None
                        break
                if not inflight:
                    continue
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                    wait(inflight)  # a dead worker breaks the pool: every future in flight ends now
                    done = set(inflight)
                broken = []
                for f in done:
                    job, alone = inflight.pop(f)
                    err = f.exception()
                    if isinstance(err, BrokenProcessPool):
                        broken.append((job, alone))
                    elif isinstance(job, SharedJob):
                        if err is None:
                            values[job.key] = f.result()
                            plan.shared_done(job.key, values[job.key])
                        else:
                            errors[job.key] = _one_line(err)
                    elif err is None:
                        yield f.result()
                    else:  # failed outside the cell's own guard (e.g. the model would not load)
                        yield plan.failed(job, _one_line(err))
                if broken:
                    pool.shutdown(wait=True)
                    pool = None
                    if len(broken) == 1 and (broken[0][1] or not suspects):
                        yield from self._died(broken[0][0], errors, plan)
                    else:
                        suspects.extend(job for job, _ in broken)
        finally:
            if pool is not None:
                pool.shutdown(wait=not inflight, cancel_futures=True)

    @staticmethod
    def _died(job, errors, plan) -> Iterator[ResultRow]:
        reason = ("worker process died while running it (a crash, os._exit or the out-of-memory killer); "
                  "BrokenProcessPool")
        if isinstance(job, SharedJob):
            errors[job.key] = reason
        else:
            yield plan.failed(job, reason)

    @staticmethod
    def _next(shared_todo, waiting, plan, values):
        if shared_todo:
            return shared_todo.popleft()
        for cell in waiting:
            if all(k in values for k in plan.needs[cell.key]):
                waiting.remove(cell)
                return cell
        return None

    @staticmethod
    def _submit(pool, job, plan, values, run_dir, device):
        if device is not None:
            job = _on_device(job, device)
        if isinstance(job, SharedJob):
            return pool.submit(record_shared, job)
        needs = plan.needs[job.key]
        return pool.submit(run_cell, job, run_dir, values[needs[0]], values[needs[1]] if len(needs) > 1 else None,
                           "local")


def _on_device(job, device: str):
    cfg = dataclasses.replace(job.config, device=device)
    return dataclasses.replace(job, config=cfg)


def _init_local_worker(environ: dict, gpu_ids) -> None:
    # a forkserver child starts with the server's environment: take the driver's, as a spawned child would
    os.environ.clear()
    os.environ.update(environ)
    # Ctrl-C reaches the workers too: end quietly (the driver keeps what finished) instead of a traceback each
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))
    if gpu_ids is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_ids.get()


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_ray():
    """The ``ray`` module, or a UsageError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"the ray executor needs Ray, which is not installed; install it with "
                         f"`{RAY_INSTALL_HINT}` (or `pip install 'ray>=2.30'`), or use --executor local") from None
    return ray


class RayExecutor:
    """Each cell a Ray task (``num_gpus=1`` on CUDA, else ``num_cpus=threads``); shared jobs are tasks too, and
    their results reach the cells through Ray's object store (computed once, read by every cell that needs them).

    ``address``: None starts (or joins) a local Ray instance; ``auto`` joins the running cluster; ``ray://host:port``
    connects through Ray Client. When Ray is already initialised in this process, that session is used.
    ``retries``: how often Ray reruns a task whose worker or node died (default 0: it becomes an error row).
    """

    name = "ray"

    def __init__(self, address: str | None = None, retries: int = 0):
        if retries < 0:
            raise UsageError(f"--retries must be 0 or more, got {retries}")
        self.address = address
        self.retries = retries
        self._started = False  # this executor started (or joined) Ray, so it disconnects at the end

    def check(self, grid: Grid) -> None:
        """Connect (before the run folder is made, so that a wrong address leaves nothing behind)."""
        ray = require_ray()
        self._connect(ray)
        if grid.device.startswith("cuda") and not ray.cluster_resources().get("GPU"):
            raise UsageError(f"{grid.source}: device {grid.device!r} but the Ray cluster has no GPU; add GPU "
                             f"nodes or use device = 'cpu'")

    def _connect(self, ray) -> None:
        if ray.is_initialized():
            return
        try:
            ray.init(address=self.address, include_dashboard=False if self.address is None else None,
                     logging_level="WARNING")
        except ConnectionError as err:
            raise UsageError(f"cannot reach a Ray cluster at {self.address!r} ({err}); start one with `ray start "
                             f"--head`, or leave out --address to start a local instance") from None
        self._started = True

    def rows(self, plan: Plan) -> Iterator[ResultRow]:
        ray = require_ray()
        try:
            if plan.cells:
                self._connect(ray)
                yield from self._rows(ray, plan)
        finally:
            if self._started:
                ray.shutdown()
                self._started = False

    def _rows(self, ray, plan: Plan) -> Iterator[ResultRow]:
        first = plan.cells[0].config
        gpus = first.device.startswith("cuda")
        # GPU tasks keep Ray's default of a fresh worker per task (max_calls=1): GPU memory is given back and a
        # reused worker can never hold a model on a GPU it no longer owns; CPU workers keep their model.
        resources = {"num_gpus": 1} if gpus else {"num_cpus": first.threads}
        options: dict[str, Any] = {"max_retries": self.retries}
        env = {k: v for k, v in os.environ.items() if k.startswith(PROPAGATED_ENV_PREFIXES)}
        if env:
            options["runtime_env"] = {"env_vars": env}
        record = ray.remote(**resources)(record_shared).options(**options)
        run = ray.remote(**resources)(run_cell).options(**options)
        device = "cuda" if gpus else None
        refs: dict = {}
        pending: dict = {}
        try:
            for key, job in plan.shared.items():
                refs[key] = record.remote(_on_device(job, device) if device else job)
            for cell in plan.cells:
                needs = plan.needs[cell.key]
                job = _on_device(cell, device) if device else cell
                ref = run.remote(job, str(plan.run_dir), refs[needs[0]], refs[needs[1]] if len(needs) > 1 else None,
                                 "ray")
                pending[ref] = cell
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    cell = pending.pop(ref)
                    try:
                        yield ray.get(ref)
                    except ray.exceptions.RayError as err:
                        yield plan.failed(cell, self._reason(ray, err, plan, plan.needs[cell.key], refs))
        finally:
            for ref in list(pending) + list(refs.values()):
                with contextlib.suppress(Exception):
                    ray.cancel(ref)

    @staticmethod
    def _reason(ray, err, plan: Plan, needs: tuple, refs: dict) -> str:
        for key in needs:  # a failed shared job fails every cell that needs it: say which
            try:
                plan.shared_done(key, ray.get(refs[key], timeout=0))
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayError as dep_err:
                return f"could not record the {key[0]} of {key[1]}: {RayExecutor._reason(ray, dep_err, plan, (), {})}"
        if isinstance(err, ray.exceptions.RayTaskError) and getattr(err, "cause", None) is not None:
            return _one_line(err.cause)
        if isinstance(err, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
            return f"worker lost while running it: {_one_line(err)}"
        return f"cell lost: {_one_line(err)}"


# ---- the driver -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class SweepResult:
    rows: list[ResultRow]  # written by this invocation
    cells: int  # in the grid
    skipped: int  # finished before (--resume)
    shared_jobs: int  # references and calibrations recorded for this invocation
    interrupted: bool = False


class Sweep:
    """Run a grid's cells on an executor and append their rows to ``run_dir/rows.jsonl`` as they finish."""

    def __init__(self, host: "PluginHost", grid: Grid, run_dir, *, executor=None, resume: bool = False,
                 quiet: bool = False, env: dict | None = None):
        self.host = host
        self.grid = grid
        self.run_dir = Path(run_dir)
        self.executor = executor if executor is not None else LocalExecutor()
        self.resume = resume
        self.quiet = quiet
        self.env = env if env is not None else host.environment()
        self.cells = expand(grid, host)

    def plan(self) -> Plan:
        done: set[str] = set()
        rows_path = self.run_dir / "rows.jsonl"
        if self.resume and rows_path.exists():
            done = {r.cell for r in read_rows(rows_path, on_error="skip") if r.status != "error"}
        todo = [c for c in self.cells if c.key not in done]
        shared: dict[tuple, SharedJob] = {}
        needs = {}
        for cell in todo:
            keys = cell.shared_keys(self.host.strategies().get(cell.strategy).uses_calibration)
            needs[cell.key] = keys
            for k in keys:
                shared.setdefault(k, SharedJob(k, cell.config))
        return Plan(self.host, todo, shared, needs, self.run_dir, self.env)

    def run(self) -> SweepResult:
        from specterbench.bench.progress import progress

        self.executor.check(self.grid)
        plan = self.plan()
        writer = RowWriter(self.run_dir / "rows.jsonl")
        result = SweepResult([], len(self.cells), len(self.cells) - len(plan.cells), len(plan.shared))
        bar = progress(len(plan.cells), desc=f"sweep ({self.executor.name})", unit="cell", quiet=self.quiet)
        try:
            with contextlib.closing(self.executor.rows(plan)) as rows:
                for row in rows:
                    writer.append(row)
                    result.rows.append(row)
                    self.host.pm.hook.specterbench_row_written(row=row)
                    bar.update(1)
                    failed = sum(r.status != "ok" for r in result.rows)
                    if failed:
                        bar.set_postfix_str(f"{failed} failed")
        except KeyboardInterrupt:
            result.interrupted = True
        finally:
            bar.close()
        return result


# ---- command line -----------------------------------------------------------------------------------------


def add_sweep_parser(sub) -> None:
    """Add ``specterbench sweep`` to the CLI's subparsers."""
    s = sub.add_parser("sweep", help="run a grid file's cells on local processes or a Ray cluster, into one run")
    s.add_argument("grid", help="grid file (TOML): models, strategies, budgets, profiles, geometry, seeds, ...")
    s.add_argument("--executor", choices=("local", "ray"), default="local")
    s.add_argument("--jobs", type=int, help="local: cells at once (default: CPU cores / threads, or GPUs)")
    s.add_argument("--address", help="ray: 'auto' (running cluster), 'ray://host:port' (Ray Client); default: "
                   "a local Ray instance")
    s.add_argument("--retries", type=int, default=0, help="ray: reruns of a cell whose worker or node died")
    s.add_argument("--out", default="results")
    s.add_argument("--run-id")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue a sweep, skipping finished cells")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    from specterbench.plugins.host import get_host
    from specterbench.analysis.report import render_markdown, write_summary

    host = get_host()
    grid = load_grid(args.grid)
    if args.executor == "ray":
        executor = RayExecutor(args.address, retries=args.retries)
    else:
        if args.address:
            raise UsageError("--address is for --executor ray")
        executor = LocalExecutor(args.jobs)
    if args.resume:
        run_dir = Path(args.resume)
        if not run_dir.is_dir():
            raise UsageError(f"--resume {run_dir}: no such run folder")
    else:
        run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S") + "-sweep-" + Path(args.grid).stem
        run_dir = Path(args.out) / run_id
    sweep = Sweep(host, grid, run_dir, executor=executor, resume=bool(args.resume), quiet=args.quiet)
    executor.check(grid)
    run_dir.mkdir(parents=True, exist_ok=True)
    grid_copy = run_dir / "grid.toml"
    if not grid_copy.exists():
        grid_copy.write_text(Path(args.grid).read_text(encoding="utf-8"), encoding="utf-8")
    host.pm.hook.specterbench_run_start(run_dir=run_dir, config=grid)
    result = None
    try:
        result = sweep.run()
    finally:
        host.pm.hook.specterbench_run_end(run_dir=run_dir, rows=result.rows if result else [])
    rows_path = run_dir / "rows.jsonl"
    if rows_path.exists():
        summary = write_summary(run_dir)
        print(render_markdown(read_rows(rows_path)), end="")
        print(f"rows: {rows_path}\nsummary: {summary}")
    if result.interrupted:
        print(f"specterbench: interrupted; {len(result.rows)} finished rows kept in {run_dir}; continue with "
              f"specterbench sweep {args.grid} --resume {run_dir}", file=sys.stderr)
        return 130
    if result.skipped:
        print(f"specterbench: {result.skipped} of {result.cells} cells were already done", file=sys.stderr)
    failed = [r for r in result.rows if r.status != "ok"]
    if failed:
        print(f"specterbench: {len(failed)} of {len(result.rows)} cell(s) failed: " +
              "; ".join(f"{r.cell}: {r.error}" for r in failed[:10]) + (" …" if len(failed) > 10 else ""),
              file=sys.stderr)
        return 1
    return 0
