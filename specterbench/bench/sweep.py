"""Sweeps: a grid file run as independent cells on a local process pool or a Ray cluster, into one ``rows.jsonl``.

A grid (TOML; ``specterbench.bench.grid``, ``docs/sweeps.md``, ``examples/grid.toml``) names each axis — models,
strategies, budgets, profiles, geometry, seeds, tokens, prompts, workload and per-strategy option axes such as
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

Modules: ``grid`` (the grid file and its cells), ``sweep_jobs`` (what a worker runs, the plan), ``executors``
(local pool, Ray), this module (the driver that writes rows) and ``sweep_cli`` (``specterbench sweep``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specterbench.bench.executors import LocalExecutor
from specterbench.bench.grid import Grid, SharedJob, expand
from specterbench.bench.progress import format_seconds, progress
from specterbench.bench.sweep_jobs import Plan
from specterbench.runfiles.results import ResultRow, RowWriter, read_rows

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.plugins.host import PluginHost

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
            done = {r.cell for r in read_rows(rows_path, on_error="skip", allow_empty=True) if r.status != "error"}
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

        self.executor.check(self.grid)
        plan = self.plan()
        writer = RowWriter(self.run_dir / "rows.jsonl")
        result = SweepResult([], len(self.cells), len(self.cells) - len(plan.cells), len(plan.shared))
        bar = progress(len(plan.cells), desc=f"sweep ({self.executor.name})", unit="cell", quiet=self.quiet)
        lines = bar.disable and not self.quiet  # no bar (a log, CI): one line per finished cell instead
        started = time.perf_counter()
        try:
            with contextlib.closing(self.executor.rows(plan)) as rows:
                for row in rows:
                    writer.append(row)
                    result.rows.append(row)
                    self.host.pm.hook.specterbench_row_written(row=row)
                    bar.update(1)
                    failed = sum(r.status != "ok" for r in result.rows)
                    what = f"{row.model} · {row.strategy_label} @ {row.budget_fraction:.0%}"
                    bar.set_postfix_str(what + (f" · {failed} failed" if failed else ""))
                    if lines:
                        n, total = len(result.rows), len(plan.cells)
                        left = (time.perf_counter() - started) / n * (total - n)
                        print(f"· cell {n}/{total} done · {what} · {row.status}"
                              + (f" · eta {format_seconds(left)}" if n < total else ""), file=sys.stderr,
                              flush=True)
        except KeyboardInterrupt:
            result.interrupted = True
        finally:
            bar.close()
        return result
