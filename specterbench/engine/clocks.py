"""Clocks: one interface (:class:`Clock`), three implementations.

- :class:`~specterbench.engine.modeled_clock.ModeledClock` — a deterministic two-resource timeline (compute
  stream, copy link) plus the host CPU, priced by the cost model (:mod:`specterbench.engine.costs`). The same calls
  give the same times on any machine.
- :class:`~specterbench.engine.cuda_clock.CudaClock` — measured: real copies from pinned memory on a dedicated copy
  stream fed by the copy scheduler, CUDA events, host wall time with synchronisation.
- :class:`~specterbench.engine.host_clock.HostWallClock` — measured on a machine without CUDA: host wall time only,
  copies are plain host copies.

Every clock orders copies with the same :class:`~specterbench.engine.scheduler.CopyScheduler` (priorities, demand
first, cancel of copies not started, bounded copies in flight), so the modeled clock prices the decisions the CUDA
clock executes. Time is in seconds: ``now()`` is seconds since the modeled clock started, or
``time.perf_counter()`` on a measured clock; every returned duration is seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from specterbench.engine.costs import CostModel, HostOp
from specterbench.engine.scheduler import DEMAND_PRIORITY, CopyScheduler, Transfer

__all__ = ["Backlog", "Clock", "ClockTotals", "HostJob", "Transfer"]


@dataclass(slots=True)
class ClockTotals:
    compute_busy_s: float = 0.0
    link_busy_s: float = 0.0
    link_bytes: int = 0
    stall_s: float = 0.0
    stalls: int = 0
    host_busy_s: float = 0.0  # host CPU computing experts (cpu-experts, Specter's hybrid verification)
    host_shared_s: float = 0.0  # of that, seconds the host's DRAM was shared with the link's DMA reads
    launches: int = 0  # kernel launches the compute stream was charged (the engine's kernel description)
    d2h_bytes: int = 0  # copied device->host (copy_on_compute(to_host=True): lru.swap's write-backs)
    d2h_busy_s: float = 0.0


@dataclass(slots=True, eq=False)
class HostJob:
    """An expert computed on the host: ``result`` once done, ``done_s`` when it is back on the device."""

    result: Any = None
    done_s: float = 0.0
    future: Any = None  # measured CUDA clock: the worker thread's future
    estimate_s: float = 0.0
    # modeled clock: when the host may start it, its compute floor (launch + FLOPs), the weight bytes it streams
    # from host DRAM and the activation hop back; ``done_s`` is provisional until the job is final
    ready_s: float = 0.0
    compute_s: float = 0.0
    weight_bytes: float = 0.0
    hop_s: float = 0.0


@runtime_checkable
class Clock(Protocol):
    """What the engine asks of a clock. Every implementation fills every method; times are seconds."""

    kind: str  # "modeled" | "measured" | "host"
    costs: CostModel  # the prices (a measured clock: its profile's, for estimates)
    totals: ClockTotals
    scheduler: CopyScheduler

    def now(self) -> float:
        """The clock's present time."""

    def issue(self, key, nbytes: int, priority: float, copy: Callable[[], None] | None = None) -> Transfer:
        """Queue a copy of ``nbytes`` (``copy`` enqueues the real copy; a measured clock calls it when the copy
        starts on the link). Higher ``priority`` starts first; :data:`DEMAND_PRIORITY` before every prefetch."""

    def copy_sync(self, key, nbytes: int, copy: Callable[[], None] | None = None) -> Transfer:
        """A synchronous copy from pageable host memory on the compute stream (``tensor.to(device)`` from unpinned
        memory, as accelerate's offload hooks copy): it starts when the compute stream reaches it and the link is
        free, runs ``copy``, and the compute stream waits until it has landed (a stall). Priced at the profile's
        ``pageable_link_bytes_per_s``."""

    def copy_on_compute(self, key, nbytes: int, copy: Callable[[], None] | None = None, *,
                        to_host: bool = False) -> Transfer:
        """A copy from pinned host memory issued on the compute stream itself (``copy_(…, non_blocking=True)`` with
        no copy stream set, as Mixtral-Offloading's ``ExpertCache._swap`` does): the stream runs it in order, after
        the compute queued before it, and the compute queued after it waits for it (a stall of its length). Runs
        ``copy`` at once. Host→device: priced at the profile's ``link_bytes_per_s`` and holds the link too (it
        starts when both are free); ``to_host``: device→host, priced by
        :meth:`~specterbench.engine.costs.CostModel.d2h_copy_seconds`, counted in ``totals.d2h_bytes``, not on the
        host→device link (PCIe is full duplex) and never reported as landed."""

    def started(self, t: Transfer) -> bool:
        """Whether ``t`` holds (or has held) the link: it can no longer be cancelled."""

    def ready(self, t: Transfer) -> bool:
        """Whether ``t`` has landed."""

    def expected_arrival(self, t: Transfer) -> float:
        """When ``t`` lands (clock time): exact once started; for a queued copy, if nothing outranks it later."""

    def cancel(self, t: Transfer) -> bool:
        """Drop ``t`` if it has not started; False when it has."""

    def wait(self, t: Transfer) -> float:
        """Make the compute stream wait until ``t`` lands (a queued copy becomes a demand fetch); the stall."""

    def in_flight(self) -> Sequence[Transfer]:
        """Copies started and not landed, oldest first (bounded: at most a few)."""

    def drain_landed(self) -> list[Transfer]:
        """Copies that landed since the last call, in landing order."""

    def compute(self, flops: float, nbytes: float, launches: int = 1, alu_ops: float = 0.0,
                efficiency: float = 1.0, graph_nodes: int = 0) -> float:
        """Charge one device op (the fields of a :class:`~specterbench.engine.costs.Op`); returns its price in
        seconds (a measured clock only prices it: the real kernel takes its own time)."""

    def wait_landed(self, t: Transfer) -> float:
        """Block until ``t`` has landed, so that its slot may be evicted (the host waits on a measured clock,
        never spinning; the compute stream stalls on the modeled one); the seconds waited."""

    def run_on_host(self, fn: Callable[..., Any], op: HostOp, threads: int, *args) -> HostJob:
        """Compute ``fn(*args)`` (one expert) on the host CPU beside the device, with ``threads`` threads; the
        tensors in ``args`` are moved to the host first. The result stays on the host."""

    def wait_host(self, jobs: Sequence[HostJob]) -> float:
        """Make the compute stream wait until every job's result is on the device; the stall."""

    def link_backlog_s(self, priority: float | None = None) -> float:
        """Until a copy issued now at ``priority`` would start (None: behind every queued copy)."""

    def host_backlog_s(self) -> float:
        """Until the host finishes the experts it has been given."""

    def link_bytes_per_s(self) -> float:
        """Link bandwidth measured from finished copies, or the profile's before the first."""

    @property
    def host_threads_available(self) -> int:
        """Host threads the clock models (modeled) or the machine has (measured)."""

    def settle(self) -> None:
        """Between requests: let every queued copy land and the compute stream catch up."""

    def sync(self) -> None:
        """The host reads the step's tokens: wait for the device (measured clocks)."""


class Backlog:
    """Backlog figures shared by the clocks, from the scheduler's running totals."""

    costs: CostModel
    scheduler: CopyScheduler

    def _queued_seconds(self, priority: float | None) -> float:
        s, c = self.scheduler, self.costs
        if priority is None:
            count, nbytes = s.queued_count, s.queued_bytes
        elif priority == DEMAND_PRIORITY:
            count, nbytes = s.demand_count, s.demand_bytes
        else:  # copies at or above ``priority``: only this one scans the queue
            probe = Transfer(None, 0, priority, 0.0, -1)
            nbytes = s.bytes_ahead_of(probe)
            count = round(nbytes / c.expert_copy_bytes) if c.expert_copy_bytes else 0
        return count * c.profile.link_latency_us * 1e-6 + nbytes / c.profile.link_bytes_per_s
