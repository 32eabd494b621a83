"""The modeled clock: a deterministic timeline of the compute stream, the copy link and the host CPU, every
operation priced by the cost model (:class:`~specterbench.engine.costs.CostModel`) at a geometry and a hardware
profile, so the same calls give the same times on any machine. The interface it implements and the measured clocks
beside it are in :mod:`specterbench.engine.clocks`.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from specterbench.engine.clocks import Backlog, ClockTotals, HostJob
from specterbench.engine.costs import CostModel, HostOp
from specterbench.engine.geometry import Geometry
from specterbench.engine.profiles import HardwareProfile, HostProfile
from specterbench.engine.scheduler import DEMAND_PRIORITY, CopyScheduler, Transfer


class ModeledClock(Backlog):
    """Deterministic timeline priced by a hardware profile at a geometry.

    Compute ops run back to back on the compute stream. Copies wait in the scheduler from the time they are issued;
    the link serves them one at a time, highest priority first among those already issued (non-preemptive). An
    expert's compute waits for its copy to finish; the wait is a stall. Each operation costs O(log n) in the
    queued copies (the scheduler's heap); :attr:`steps` counts the clock's internal steps.

    **Host DRAM is one resource** (the sharing rule, :meth:`CostModel.host_dram_share`): the link's DMA reads its
    copies out of host memory at the link's rate, and the host CPU computing an expert streams that expert's weights
    out of the same DRAM. While a copy is on the link the host gets ``host.mem_bytes_per_s - link_bytes_per_s``;
    otherwise all of it. Host experts run one after another (each with the threads its strategy gives it); a job's
    finish is provisional until the compute stream has passed it, because a copy issued later may still overlap it
    (:meth:`_resolve_host` replays the host queue against the link's busy intervals).
    """

    kind = "modeled"

    def __init__(self, profile: HardwareProfile, geometry: Geometry, host: HostProfile | None = None):
        self.costs = CostModel(profile, geometry, host)
        self.profile, self.geometry, self.host = profile, geometry, host
        self.scheduler = CopyScheduler(max_in_flight=1)
        self.host_free_s = 0.0
        self.now_s = 0.0
        self.link_free_s = 0.0
        self.totals = ClockTotals()
        self._seq = 0
        self._on_link: deque[Transfer] = deque()  # started, not yet landed by ``now_s``
        self._landed: list[Transfer] = []
        self._steps = 0
        self.host_threads = host.threads if host else 1  # threads the host profile has (strategies ask for fewer)
        self._host_jobs: deque[HostJob] = deque()  # host experts whose finish is not final yet, in run order
        self._link_log: deque[tuple[float, float]] = deque()  # (start, end) of copies a pending host job may overlap

    @property
    def steps(self) -> int:
        """Internal steps so far (copies started and landed, scheduler heap and FIFO moves): the scaling test
        counts them per copy."""
        return self._steps + self.scheduler.steps

    @property
    def host_threads_available(self) -> int:
        return self.host_threads

    @property
    def queued(self) -> list[Transfer]:
        """Copies not yet started (a snapshot, O(queued); for reports and tests, not the hot path)."""
        return self.scheduler.pending()

    # ---- link --------------------------------------------------------------------------------------
    def transfer_seconds(self, nbytes: int) -> float:
        return self.costs.copy_seconds(nbytes)

    def issue(self, key, nbytes: int, priority: float, copy=None) -> Transfer:
        self._seq += 1
        t = Transfer(key, nbytes, priority, self.now_s, self._seq)
        self._advance_link()  # copies that started before now keep their place
        self.scheduler.submit(t)
        self._advance_link()  # on an idle link this copy starts at once
        if copy is not None:
            copy()
        return t

    def copy_sync(self, key, nbytes: int, copy=None) -> Transfer:
        seconds = self.costs.pageable_copy_seconds(nbytes)  # a profile without the field: one line, before anything
        return self._copy_in_stream(key, nbytes, seconds, copy)

    def copy_on_compute(self, key, nbytes: int, copy=None, *, to_host: bool = False) -> Transfer:
        if not to_host:
            return self._copy_in_stream(key, nbytes, self.costs.copy_seconds(nbytes), copy)
        seconds = self.costs.d2h_copy_seconds(nbytes)
        self._seq += 1
        t = Transfer(key, nbytes, DEMAND_PRIORITY, self.now_s, self._seq, self.now_s, self.now_s + seconds,
                     state="landed")
        self.totals.d2h_busy_s += seconds
        self.totals.d2h_bytes += nbytes
        self._steps += 1
        if copy is not None:
            copy()
        self._stall_until(t.end_s)  # the compute stream runs it: what is queued after it waits
        return t

    def _copy_in_stream(self, key, nbytes: int, seconds: float, copy) -> Transfer:
        """A host→device copy of ``seconds`` the compute stream runs itself: it starts when the stream reaches it
        and the link is free, and the stream waits until it has landed."""
        self._seq += 1
        self._advance_link()  # copies started before now keep the link
        start = max(self.now_s, self.link_free_s)
        t = Transfer(key, nbytes, DEMAND_PRIORITY, self.now_s, self._seq, start, start + seconds, state="landed")
        self.link_free_s = t.end_s
        self._link_log.append((start, t.end_s))
        self.totals.link_busy_s += seconds
        self.totals.link_bytes += nbytes
        self._steps += 1
        if copy is not None:
            copy()
        self._stall_until(t.end_s)  # serial with compute: nothing runs on the compute stream until it lands
        self._landed.append(t)
        self._prune_link_log()
        return t

    def _next_start(self) -> float | None:
        s = self.scheduler
        s.admit(self.link_free_s)
        if s.has_eligible():
            return self.link_free_s
        return s.earliest_arrival_s()

    def _start_next(self) -> Transfer:
        s = self.scheduler
        start = self._next_start()
        if start is None:
            raise ValueError("no copy is queued")
        s.admit(start)
        while s.in_flight:  # the link is serial: the copy before has ended by ``start``
            s.landed(s.in_flight[0])
        t = s.pop()
        t.start_s = start
        t.end_s = start + self.costs.copy_seconds(t.nbytes)
        self.link_free_s = t.end_s
        self._link_log.append((start, t.end_s))
        self._prune_link_log()
        self.totals.link_busy_s += t.end_s - start
        self.totals.link_bytes += t.nbytes
        self._on_link.append(t)
        self._steps += 1
        return t

    def _advance_link(self) -> None:
        while True:
            start = self._next_start()
            if start is None or start > self.now_s:
                break
            self._start_next()
        on_link = self._on_link
        while on_link and on_link[0].end_s <= self.now_s:
            self._landed.append(on_link.popleft())
            self._steps += 1

    def started(self, t: Transfer) -> bool:
        self._advance_link()
        return t.start_s is not None

    def ready(self, t: Transfer) -> bool:
        self._advance_link()
        return t.end_s is not None and t.end_s <= self.now_s

    def expected_arrival(self, t: Transfer) -> float:
        """When the copy will finish if nothing outranks it from now on (a lower bound while queued; O(queued)
        for a queued copy)."""
        if t.end_s is not None:
            return t.end_s
        ahead = self.scheduler.bytes_ahead_of(t)
        return max(self.link_free_s, self.now_s) + self.costs.copy_seconds(ahead + t.nbytes)

    def cancel(self, t: Transfer) -> bool:
        """Drop a copy that has not started; returns False when it already holds the link."""
        if self.started(t):
            return False
        return self.scheduler.cancel(t)

    def wait(self, t: Transfer) -> float:
        """Block the compute stream until ``t`` lands; returns the stall in seconds."""
        self._advance_link()  # a copy that has started by now keeps the link
        if t.start_s is None:
            self.scheduler.promote(t, DEMAND_PRIORITY)
            while t.start_s is None:
                self._start_next()
        return self._stall_until(t.end_s)

    def in_flight(self) -> Sequence[Transfer]:
        self._advance_link()
        return self._on_link

    def drain_landed(self) -> list[Transfer]:
        self._advance_link()
        out, self._landed = self._landed, []
        return out

    def link_backlog_s(self, priority: float | None = None) -> float:
        self._advance_link()
        return max(0.0, self.link_free_s - self.now_s) + self._queued_seconds(priority)

    def link_bytes_per_s(self) -> float:
        t = self.totals
        return t.link_bytes / t.link_busy_s if t.link_busy_s > 0 else self.profile.link_bytes_per_s

    # ---- compute -----------------------------------------------------------------------------------
    def op_seconds(self, flops: float, nbytes: float, launches: int = 1, alu_ops: float = 0.0,
                   efficiency: float = 1.0, graph_nodes: int = 0) -> float:
        return self.costs.op_seconds(flops, nbytes, launches, alu_ops, efficiency, graph_nodes)

    def compute(self, flops: float, nbytes: float, launches: int = 1, alu_ops: float = 0.0,
                efficiency: float = 1.0, graph_nodes: int = 0) -> float:
        dt = self.costs.op_seconds(flops, nbytes, launches, alu_ops, efficiency, graph_nodes)
        self.now_s += dt
        self.totals.compute_busy_s += dt
        self.totals.launches += launches
        return dt

    # ---- host compute (a third resource) -------------------------------------------------------------
    def wait_landed(self, t: Transfer) -> float:
        return self.wait(t)

    def run_on_host(self, fn, op: HostOp, threads: int, *args) -> HostJob:
        """Activations go down the link, the host computes (concurrently with the device), the result comes
        back. Activation copies are small and full duplex: charged latency + bytes, not queued behind weights. The
        host's DRAM is shared with the link's DMA (see the class docstring): ``done_s`` is final once the compute
        stream waits for the job (:meth:`wait_host`)."""
        c = self.costs
        hop = c.hop_seconds(op.act_bytes)
        job = HostJob(fn(*(a.cpu() for a in args)), ready_s=self.now_s + hop,
                      compute_s=c.host_compute_seconds(op, threads),
                      weight_bytes=op.weight_bytes, hop_s=hop)
        self._host_jobs.append(job)
        self._resolve_host()
        return job

    def _busy_intervals(self):
        """The link's busy intervals from the oldest logged one on: copies started, then the queued ones back to
        back from when the link frees (what the link will do unless something is issued later)."""
        yield from self._link_log
        if not self.scheduler.empty():
            start = max(self.link_free_s, self.now_s)
            yield start, start + self._queued_seconds(None)

    def _resolve_host(self) -> None:
        """Replay the host queue against the link's busy intervals: each pending job's finish (provisional for those
        past ``now_s``); jobs finished by ``now_s`` become final (no later copy can start before ``now_s``)."""
        self._advance_link()
        jobs, c = self._host_jobs, self.costs
        free = self.host_free_s
        intervals = list(self._busy_intervals())
        for job in jobs:
            start = max(job.ready_s, free)
            end, shared = c.host_dram_finish(start, job.compute_s, job.weight_bytes, intervals)
            # estimate_s (the measured clocks' estimate field) holds the seconds the job shared DRAM with copies
            job.done_s, job.estimate_s = end + job.hop_s, shared
            free = end
        while jobs and jobs[0].done_s - jobs[0].hop_s <= self.now_s:
            job = jobs.popleft()
            start = max(job.ready_s, self.host_free_s)
            self.host_free_s = job.done_s - job.hop_s
            self.totals.host_busy_s += self.host_free_s - start
            self.totals.host_shared_s += job.estimate_s
        self._prune_link_log()

    def _prune_link_log(self) -> None:
        """Forget copies no host job can overlap any more: those ended before every pending job's earliest start
        (and before ``now_s``, the earliest a job run from now on can start)."""
        keep_from = self.now_s
        if self._host_jobs:
            keep_from = min(keep_from, max(self._host_jobs[0].ready_s, self.host_free_s))
        log = self._link_log
        while log and log[0][1] <= keep_from:
            log.popleft()

    def wait_host(self, jobs: Sequence[HostJob]) -> float:
        self._resolve_host()  # the compute stream stops here: nothing new reaches the link until the jobs finish
        stall = self._stall_until(max((j.done_s for j in jobs), default=0.0))
        self._resolve_host()
        return stall

    def wait_until(self, t: float) -> float:
        """Stall the compute stream until clock time ``t`` (modeled clock only; strategies should wait for copies
        with ``engine.wait_for(keys)``, which every clock implements)."""
        return self._stall_until(t)

    def host_backlog_s(self) -> float:
        if self._host_jobs:
            self._resolve_host()
        last = self._host_jobs[-1].done_s - self._host_jobs[-1].hop_s if self._host_jobs else self.host_free_s
        return max(0.0, last - self.now_s)

    def _stall_until(self, t: float) -> float:
        stall = max(0.0, t - self.now_s)
        if stall > 0:
            self.now_s = t
            self.totals.stall_s += stall
            self.totals.stalls += 1
        return stall

    def now(self) -> float:
        return self.now_s

    def settle(self) -> None:
        self._resolve_host()
        host_end = self._host_jobs[-1].done_s if self._host_jobs else self.host_free_s
        while not self.scheduler.empty():
            self._start_next()
        self.now_s = max(self.now_s, self.link_free_s, host_end)
        self._advance_link()
        self._resolve_host()

    def sync(self) -> None:
        """The host reads the step's tokens: nothing to wait for beyond the compute stream itself."""
