"""Clocks: the modeled two-resource timeline (compute stream, copy stream) and the measured CUDA clock.

The engine talks to a clock through five calls: ``issue`` a copy with a priority, ``cancel`` one not yet
started, ``wait`` for one before compute that needs it, ``compute`` an operation, and ``now``. The modeled
clock is deterministic: the same calls give the same times on any machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from specterbench.engine.geometry import Geometry
from specterbench.engine.profiles import HardwareProfile, HostProfile

DEMAND_PRIORITY = float("inf")  # a demand fetch outranks every prefetch still queued


@dataclass(slots=True, eq=False)
class Transfer:
    key: Any
    nbytes: int
    priority: float
    issue_s: float
    seq: int
    start_s: float | None = None
    end_s: float | None = None
    event: Any = None  # CUDA event of the copy, measured clock only


@dataclass(slots=True)
class ClockTotals:
    compute_busy_s: float = 0.0
    link_busy_s: float = 0.0
    link_bytes: int = 0
    stall_s: float = 0.0
    stalls: int = 0
    host_busy_s: float = 0.0  # host CPU computing experts (cpu-experts)


class ModeledClock:
    """Deterministic timeline priced by a hardware profile at a geometry.

    Compute ops run back to back on the compute stream. Copies are queued at the time they are issued and the
    link serves them one at a time, highest priority first among those already issued (non-preemptive). An
    expert's compute waits for its copy to finish; the wait is a stall.
    """

    kind = "modeled"

    def __init__(self, profile: HardwareProfile, geometry: Geometry, host: HostProfile | None = None):
        self.profile = profile
        self.geometry = geometry
        self.host = host
        self.host_threads = host.threads if host else 0  # threads a strategy lets the host use
        self.host_free_s = 0.0
        self.now_s = 0.0
        self.link_free_s = 0.0
        self.queued: list[Transfer] = []
        self.totals = ClockTotals()
        self._seq = 0

    # ---- link --------------------------------------------------------------------------------------
    def transfer_seconds(self, nbytes: int) -> float:
        return self.profile.link_latency_us * 1e-6 + nbytes / self.profile.link_bytes_per_s

    def issue(self, key, nbytes: int, priority: float, copy=None) -> Transfer:
        self._seq += 1
        t = Transfer(key, nbytes, priority, self.now_s, self._seq)
        self._advance_link()  # copies that started before now keep their place
        self.queued.append(t)
        self._advance_link()  # on an idle link this copy starts at once
        if copy is not None:
            copy()
        return t

    def _start_next(self) -> Transfer:
        eligible = [t for t in self.queued if t.issue_s <= self.link_free_s]
        if eligible:
            t = max(eligible, key=lambda x: (x.priority, -x.seq))
            start = self.link_free_s
        else:
            t = min(self.queued, key=lambda x: (x.issue_s, -x.priority, x.seq))
            start = t.issue_s
        self.queued.remove(t)
        t.start_s = start
        t.end_s = start + self.transfer_seconds(t.nbytes)
        self.link_free_s = t.end_s
        self.totals.link_busy_s += t.end_s - start
        self.totals.link_bytes += t.nbytes
        return t

    def _advance_link(self) -> None:
        while self.queued and max(self.link_free_s, min(t.issue_s for t in self.queued)) <= self.now_s:
            self._start_next()

    def started(self, t: Transfer) -> bool:
        self._advance_link()
        return t.start_s is not None

    def ready(self, t: Transfer) -> bool:
        self._advance_link()
        return t.end_s is not None and t.end_s <= self.now_s

    def expected_arrival(self, t: Transfer) -> float:
        """When the copy will finish if nothing outranks it from now on (a lower bound while queued)."""
        if t.end_s is not None:
            return t.end_s
        ahead = sum(q.nbytes for q in self.queued if q.priority > t.priority or
                    (q.priority == t.priority and q.seq < t.seq))
        return max(self.link_free_s, self.now_s) + self.transfer_seconds(ahead + t.nbytes)

    def cancel(self, t: Transfer) -> bool:
        """Drop a copy that has not started; returns False when it already holds the link."""
        if self.started(t):
            return False
        self.queued.remove(t)
        return True

    def wait(self, t: Transfer) -> float:
        """Block the compute stream until ``t`` lands; returns the stall in seconds."""
        if t.start_s is None:
            t.priority = DEMAND_PRIORITY
            while t.start_s is None:
                self._start_next()
        stall = max(0.0, t.end_s - self.now_s)
        if stall > 0:
            self.now_s = t.end_s
            self.totals.stall_s += stall
            self.totals.stalls += 1
        return stall

    # ---- compute -----------------------------------------------------------------------------------
    def op_seconds(self, flops: float, nbytes: float, launches: int = 1) -> float:
        p = self.profile
        return launches * p.launch_us * 1e-6 + max(flops / p.flops_per_s, nbytes / p.mem_bytes_per_s)

    def compute(self, flops: float, nbytes: float, launches: int = 1) -> float:
        dt = self.op_seconds(flops, nbytes, launches)
        self.now_s += dt
        self.totals.compute_busy_s += dt
        return dt

    # ---- host compute (a third resource) -------------------------------------------------------------
    def host_compute(self, flops: float, weight_bytes: float, act_bytes: float) -> float:
        """Run an expert on the host: activations go down the link, the host computes (concurrently with the
        device), the result comes back. Returns when the result is on the device. Activation copies are small
        and full-duplex, so they are charged latency + bytes but do not queue behind weight copies."""
        if self.host is None:
            raise ValueError("this modeled clock has no host profile; give the run a --host-profile")
        h, p = self.host, self.profile
        hop = p.link_latency_us * 1e-6 + act_bytes / p.link_bytes_per_s
        start = max(self.now_s + hop, self.host_free_s)
        used = min(self.host_threads, h.threads) / h.threads
        dur = h.launch_us * 1e-6 + max(flops / (h.flops_per_s * used), weight_bytes / h.mem_bytes_per_s)
        self.host_free_s = start + dur
        self.totals.host_busy_s += dur
        return start + dur + hop

    def wait_until(self, t: float) -> float:
        """Block the compute stream until ``t`` (a host result); returns the stall."""
        stall = max(0.0, t - self.now_s)
        if stall > 0:
            self.now_s = t
            self.totals.stall_s += stall
            self.totals.stalls += 1
        return stall

    def now(self) -> float:
        return self.now_s

    def settle(self) -> None:
        """Between requests: let every queued copy land and the compute stream catch up."""
        while self.queued:
            self._start_next()
        self.now_s = max(self.now_s, self.link_free_s, self.host_free_s)

    def sync(self) -> None:
        """The host reads the step's tokens: nothing to wait for beyond the compute stream itself."""


class CudaClock:
    """Measured clock on CUDA: copies on a dedicated stream from pinned memory, CUDA events, wall time with sync.

    Compute is the real kernels on the default stream, so ``compute`` only records nothing; ``now`` is host
    wall time after the last ``sync``.
    """

    kind = "measured"

    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.totals = ClockTotals()
        self._seq = 0
        self._waits: list[tuple[Any, Any]] = []

    def transfer_seconds(self, nbytes: int) -> float:  # pragma: no cover - needs CUDA
        return 0.0

    def issue(self, key, nbytes: int, priority: float, copy=None) -> Transfer:  # pragma: no cover - needs CUDA
        self._seq += 1
        t = Transfer(key, nbytes, priority, time.perf_counter(), self._seq)
        with self.torch.cuda.stream(self.stream):
            if copy is not None:
                copy()
            t.event = self.torch.cuda.Event()
            t.event.record(self.stream)
        t.start_s = t.issue_s
        return t

    def started(self, t: Transfer) -> bool:  # pragma: no cover - needs CUDA
        return True

    def ready(self, t: Transfer) -> bool:  # pragma: no cover - needs CUDA
        return t.event.query()

    def expected_arrival(self, t: Transfer) -> float:  # pragma: no cover - needs CUDA
        return time.perf_counter()

    def cancel(self, t: Transfer) -> bool:  # pragma: no cover - needs CUDA
        return False

    def wait(self, t: Transfer) -> float:  # pragma: no cover - needs CUDA
        cur = self.torch.cuda.current_stream(self.device)
        if not t.event.query():
            before = self.torch.cuda.Event(enable_timing=True)
            after = self.torch.cuda.Event(enable_timing=True)
            before.record(cur)
            cur.wait_event(t.event)
            after.record(cur)
            self._waits.append((before, after))
            self.totals.stalls += 1
        else:
            cur.wait_event(t.event)
        return 0.0

    def compute(self, flops: float, nbytes: float, launches: int = 1) -> float:  # pragma: no cover - needs CUDA
        return 0.0

    def now(self) -> float:  # pragma: no cover - needs CUDA
        return time.perf_counter()

    def host_compute(self, flops, weight_bytes, act_bytes) -> float:  # pragma: no cover - needs CUDA
        return 0.0  # the host really computed it, in the caller

    def wait_until(self, t) -> float:  # pragma: no cover - needs CUDA
        return 0.0

    def sync(self) -> None:  # pragma: no cover - needs CUDA
        self.torch.cuda.synchronize(self.device)
        for before, after in self._waits:
            self.totals.stall_s += before.elapsed_time(after) / 1e3
        self._waits.clear()


@dataclass(slots=True)
class HostWallClock:
    """Measured mode on a machine without CUDA: only host wall time exists; there is no device to time."""

    kind: str = "host"
    totals: ClockTotals = field(default_factory=ClockTotals)
    _seq: int = 0

    def transfer_seconds(self, nbytes: int) -> float:
        return 0.0

    def issue(self, key, nbytes: int, priority: float, copy=None) -> Transfer:
        self._seq += 1
        if copy is not None:
            copy()
        now = time.perf_counter()
        return Transfer(key, nbytes, priority, now, self._seq, now, now)

    def started(self, t: Transfer) -> bool:
        return True

    def ready(self, t: Transfer) -> bool:
        return True

    def expected_arrival(self, t: Transfer) -> float:
        return t.end_s

    def cancel(self, t: Transfer) -> bool:
        return False

    def wait(self, t: Transfer) -> float:
        return 0.0

    def compute(self, flops: float, nbytes: float, launches: int = 1) -> float:
        return 0.0

    def now(self) -> float:
        return time.perf_counter()

    def host_compute(self, flops, weight_bytes, act_bytes) -> float:
        return 0.0

    def wait_until(self, t) -> float:
        return 0.0

    def sync(self) -> None:
        pass
