"""The executors of a sweep: where its jobs run. Both take a :class:`~specterbench.bench.sweep_jobs.Plan` and yield
one :class:`~specterbench.runfiles.results.ResultRow` per cell as cells finish, in any order.

- :class:`LocalExecutor`: a process pool on this machine (one cell per process, a dead worker fails only its cell);
- :class:`RayExecutor`: Ray tasks on a local instance or a cluster (shared jobs through Ray's object store).

An executor never writes rows; the driver (:class:`specterbench.bench.sweep.Sweep`) does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections import deque
from typing import TYPE_CHECKING, Any, Iterator

from specterbench.bench.grid import SharedJob
from specterbench.bench.sweep_jobs import Plan, one_line, record_shared, run_cell
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.bench.grid import Grid

RAY_INSTALL_HINT = "pip install 'specterbench[ray]'"
# Environment the driver's plugin host resolved names with; workers must see the same.
PROPAGATED_ENV_PREFIXES = ("SPECTERBENCH_",)

# imported by the forkserver
PRELOAD = ["specterbench.bench.runner", "specterbench.bench.sweep_jobs", "transformers.modeling_utils"]


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
                            errors[job.key] = one_line(err)
                    elif err is None:
                        yield f.result()
                    else:  # failed outside the cell's own guard (e.g. the model would not load)
                        yield plan.failed(job, one_line(err))
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
    connects through Ray Client. When Ray is already initialised in this process, that connection is used.
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
            return one_line(err.cause)
        if isinstance(err, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
            return f"worker lost while running it: {one_line(err)}"
        return f"cell lost: {one_line(err)}"
