"""The measured clock on a machine without CUDA: host wall time only (see :mod:`specterbench.engine.clocks`)."""

from __future__ import annotations

import os
import time
from typing import Sequence

from specterbench.engine.clocks import Backlog, ClockTotals, HostJob
from specterbench.engine.costs import CostModel, HostOp
from specterbench.engine.scheduler import DEMAND_PRIORITY, CopyScheduler, Transfer


class HostWallClock(Backlog):
    """Measured mode on a machine without CUDA: only host wall time exists. A copy is a host copy run when it is
    issued (so it has landed at once); host experts run in the caller. Prices for estimates come from ``costs``
    (the engine gives it the default profile's when none is set)."""

    kind = "host"

    def __init__(self, costs: CostModel | None = None):
        self.costs = costs  # None: the engine prices with its default profile at its geometry (configure)
        self.totals = ClockTotals()
        self.scheduler = CopyScheduler()
        self._seq = 0
        self._landed: list[Transfer] = []

    @property
    def host_threads_available(self) -> int:
        return os.cpu_count() or 1

    def issue(self, key, nbytes: int, priority: float, copy=None) -> Transfer:
        self._seq += 1
        start = time.perf_counter()
        if copy is not None:
            copy()
        end = time.perf_counter()
        t = Transfer(key, nbytes, priority, start, self._seq, start, end, state="landed")
        self.totals.link_busy_s += end - start
        self.totals.link_bytes += nbytes
        self._landed.append(t)
        return t

    def copy_sync(self, key, nbytes: int, copy=None) -> Transfer:
        """Every copy here is a synchronous host copy already: the pageable one is timed the same way."""
        return self.issue(key, nbytes, DEMAND_PRIORITY, copy)

    def copy_on_compute(self, key, nbytes: int, copy=None, *, to_host: bool = False) -> Transfer:
        """A host copy either way, timed when it runs; a device→host one is counted in ``totals.d2h_bytes``."""
        if not to_host:
            return self.issue(key, nbytes, DEMAND_PRIORITY, copy)
        self._seq += 1
        start = time.perf_counter()
        if copy is not None:
            copy()
        end = time.perf_counter()
        self.totals.d2h_busy_s += end - start
        self.totals.d2h_bytes += nbytes
        return Transfer(key, nbytes, DEMAND_PRIORITY, start, self._seq, start, end, state="landed")

    def started(self, t: Transfer) -> bool:
        return True

    def ready(self, t: Transfer) -> bool:
        return True

    def expected_arrival(self, t: Transfer) -> float:
        return t.end_s

    def cancel(self, t: Transfer) -> bool:
        return False  # every copy ran when it was issued

    def wait(self, t: Transfer) -> float:
        return 0.0  # it has landed

    def in_flight(self) -> Sequence[Transfer]:
        return ()

    def drain_landed(self) -> list[Transfer]:
        out, self._landed = self._landed, []
        return out

    def compute(self, flops: float, nbytes: float, launches: int = 1, alu_ops: float = 0.0,
                efficiency: float = 1.0, graph_nodes: int = 0) -> float:
        return self.costs.op_seconds(flops, nbytes, launches, alu_ops, efficiency, graph_nodes)

    def wait_landed(self, t: Transfer) -> float:
        return 0.0  # it landed when it was issued

    def run_on_host(self, fn, op: HostOp, threads: int, *args) -> HostJob:
        start = time.perf_counter()
        result = fn(*(a.cpu() for a in args))
        self.totals.host_busy_s += time.perf_counter() - start
        return HostJob(result, time.perf_counter())

    def wait_host(self, jobs: Sequence[HostJob]) -> float:
        return 0.0  # computed in the caller

    def link_backlog_s(self, priority: float | None = None) -> float:
        return 0.0  # copies never queue

    def host_backlog_s(self) -> float:
        return 0.0

    def link_bytes_per_s(self) -> float:
        t = self.totals
        return t.link_bytes / t.link_busy_s if t.link_busy_s > 0 else self.costs.profile.link_bytes_per_s

    def now(self) -> float:
        return time.perf_counter()

    def settle(self) -> None:
        pass  # nothing is ever queued

    def sync(self) -> None:
        pass  # no device
