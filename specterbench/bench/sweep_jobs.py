"""The work of a sweep: the jobs a worker runs (shared references and calibrations, cells) and the plan the driver
hands an executor.

A worker process keeps the last model it loaded, so consecutive cells of one model load it once. Everything here
runs in a worker (a local pool process or a Ray task) except :class:`Plan`, which the driver builds.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specterbench.bench import runner as runner_module
from specterbench.bench.device_memory import resolve_cards
from specterbench.bench.grid import Cell, SharedJob
from specterbench.bench.runner import Runner
from specterbench.engine.geometry import project
from specterbench.engine.precision import priced_geometry
from specterbench.errors import BudgetError
from specterbench.plugins.host import get_host
from specterbench.runfiles.results import ResultRow
from specterbench.runfiles.rundir import run_identity

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.bench.config import BenchConfig
    from specterbench.plugins.host import PluginHost

# ---- the work, as run on a worker -------------------------------------------------------------------------

_WORKER: dict[str, Any] = {"engine_key": None, "engine": None, "env": None}


@dataclass(frozen=True, slots=True)
class SharedReference:
    """A recorded reference, with the encoded prompts it was recorded on."""

    id: str  # where and when it was recorded: every cell that used it names it in ``extra["sweep"]``
    prompts: list
    reference: Any  # bench.resident.Reference
    total_expert_bytes: int


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _worker(cfg: "BenchConfig", run_dir: str = "."):
    """(host, runner, engine) in this worker process; the engine is kept for the next job on the same model."""
    import torch

    torch.set_num_threads(cfg.threads)
    host = get_host()
    if _WORKER["env"] is None:
        _WORKER["env"] = host.environment()
    runner = Runner(host, cfg, Path(run_dir), env=_WORKER["env"])
    key = (cfg.models[0], cfg.device, cfg.precision)
    if _WORKER["engine_key"] != key:
        _WORKER["engine_key"] = _WORKER["engine"] = None  # drop the previous model before loading the next
        _WORKER["engine"] = runner.load_engine(cfg.models[0])
        _WORKER["engine_key"] = key
    engine = _WORKER["engine"]
    engine.geometry = (priced_geometry(project(engine.own_geometry, cfg.geometry), engine.precision)
                       if cfg.geometry else engine.own_geometry)  # own_geometry is priced at the precision already
    return host, runner, engine


def record_shared(job: SharedJob):
    """Run a shared job: a :class:`SharedReference` or a :class:`specterbench.strategy.RoutingCalibration`."""

    cfg = job.config
    _, runner, engine = _worker(cfg)
    if job.kind == "calibration":
        return runner.calibrate(engine)
    prompts = runner_module.encode_prompts(engine, runner_module.load_prompts(cfg.workload, cfg.prompts),
                                           cfg.max_prompt_tokens)
    try:  # the reference's cache on a GPU is sized by the largest budget, a card's too
        runner.budgets = resolve_cards(cfg.budgets, engine, max(len(ids) for _, ids in prompts), cfg.tokens, cfg)
    except BudgetError:
        pass  # a card too small: its cells refuse it, each in its row
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
    budget = cell.budget
    try:
        runner.budgets = resolve_cards(cfg.budgets, engine, max(len(ids) for _, ids in shared.prompts), cfg.tokens,
                                       cfg)  # a card's memory, at this cell's context
        budget = runner.budgets[0]
        if cls.fixed_budget_fraction is None:
            runner.check_budgets(engine)
    except BudgetError as err:
        row = error_row(host, cell, Path(run_dir).name, _WORKER["env"], f"BudgetError: {err}",
                        engine.total_expert_bytes)
    else:
        row = runner.run_cell(engine, cell.key, cell.strategy, cls, budget, cell.repeat, shared.prompts,
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
    unresolved = budget.card_bytes is not None and budget.fraction is None  # a card refused before it was sized
    nbytes = budget.resolve(total) if total and not unresolved else (budget.nbytes or 0)
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
        return error_row(self.host, cell, run_identity(self.run_dir), self.env, reason,
                         self.expert_bytes.get(cell.model))

    def shared_done(self, key: tuple, value) -> None:
        if isinstance(value, SharedReference):
            self.expert_bytes[key[1]] = value.total_expert_bytes


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")
