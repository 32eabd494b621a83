"""The measured CUDA clock: the copy scheduler feeds a dedicated copy stream; CUDA events time copies and stalls.

A copy waits in the :class:`~specterbench.engine.scheduler.CopyScheduler` (host side: priorities, demand first,
cancellable) until fewer than ``max_in_flight`` copies are on the copy stream; then its real copy (pinned host
memory → device, non-blocking) is enqueued between two timing events. The scheduler is pumped at every clock call:
landed copies are retired (their event timing gives the measured link bandwidth), the next copies are enqueued.
Host experts run in one worker thread beside the device kernels, with the thread count the strategy allows.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from specterbench.engine.clocks import ClockTotals, HostJob, _Backlog
from specterbench.engine.costs import CostModel, HostOp
from specterbench.engine.scheduler import DEMAND_PRIORITY, CopyScheduler, Transfer


class CudaClock(_Backlog):  # pragma: no cover - needs CUDA
    kind = "measured"

    def __init__(self, device, costs: CostModel | None = None, max_in_flight: int = 2):
        import torch

        self.torch = torch
        self.device = device
        self.costs = costs
        self.stream = torch.cuda.Stream(device=device)
        self.scheduler = CopyScheduler(max_in_flight)
        self.totals = ClockTotals()
        self._seq = 0
        self._waits: list[tuple] = []  # (before, after) events around compute-stream waits: the stalls
        self._landed: list[Transfer] = []
        self._worker: ThreadPoolExecutor | None = None
        self._host_pending_s = 0.0

    @property
    def host_threads_available(self) -> int:
        return os.cpu_count() or 1

    # ---- link --------------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Retire copies whose events completed; enqueue the next ones while the stream has room."""
        s, torch = self.scheduler, self.torch
        while s.in_flight and s.in_flight[0].event.query():
            t = s.in_flight[0]
            s.landed(t)
            t.end_s = time.perf_counter()
            self.totals.link_busy_s += t.start_event.elapsed_time(t.event) / 1e3
            self.totals.link_bytes += t.nbytes
            self._landed.append(t)
        s.admit(time.perf_counter())
        while (t := s.pop()) is not None:
            with torch.cuda.stream(self.stream):
                t.start_event = torch.cuda.Event(enable_timing=True)
                t.start_event.record(self.stream)
                if t.copy is not None:
                    t.copy()
                t.event = torch.cuda.Event(enable_timing=True)
                t.event.record(self.stream)
            t.start_s = time.perf_counter()

    def issue(self, key, nbytes: int, priority: float, copy=None) -> Transfer:
        self._seq += 1
        t = Transfer(key, nbytes, priority, time.perf_counter(), self._seq, copy=copy)
        self.scheduler.submit(t)
        self._pump()
        return t

    def started(self, t: Transfer) -> bool:
        self._pump()
        return t.start_s is not None

    def ready(self, t: Transfer) -> bool:
        self._pump()
        return t.state == "landed"

    def _bandwidth(self) -> float:
        return self.link_bytes_per_s()

    def _copy_s(self, nbytes: int) -> float:
        return self.costs.profile.link_latency_us * 1e-6 + nbytes / self._bandwidth()

    def _in_flight_left_s(self) -> float:
        now = time.perf_counter()
        return sum(max(0.0, t.start_s + self._copy_s(t.nbytes) - now) for t in self.scheduler.in_flight)

    def expected_arrival(self, t: Transfer) -> float:
        self._pump()
        if t.end_s is not None:
            return t.end_s
        if t.start_s is not None:
            return t.start_s + self._copy_s(t.nbytes)
        return (time.perf_counter() + self._in_flight_left_s()
                + self._copy_s(self.scheduler.bytes_ahead_of(t) + t.nbytes))

    def cancel(self, t: Transfer) -> bool:
        self._pump()
        return self.scheduler.cancel(t)

    def _block_until_started(self, t: Transfer) -> None:
        self.scheduler.promote(t, DEMAND_PRIORITY)
        self._pump()
        while t.start_s is None:  # the stream is full: the host waits for its oldest copy, never spins
            self.scheduler.in_flight[0].event.synchronize()
            self._pump()

    def wait(self, t: Transfer) -> float:
        """The compute stream waits for ``t``'s event; the stall is timed by events and counted at :meth:`sync`
        (so this returns 0.0: the host does not know it yet)."""
        self._pump()
        if t.start_s is None:
            self._block_until_started(t)
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

    def wait_landed(self, t: Transfer) -> float:
        start = time.perf_counter()
        if t.start_s is None:
            self._block_until_started(t)
        t.event.synchronize()
        self._pump()
        return time.perf_counter() - start

    def in_flight(self) -> Sequence[Transfer]:
        self._pump()
        return self.scheduler.in_flight

    def drain_landed(self) -> list[Transfer]:
        self._pump()
        out, self._landed = self._landed, []
        return out

    def link_backlog_s(self, priority: float | None = None) -> float:
        self._pump()
        return self._in_flight_left_s() + self._queued_seconds(priority)

    def link_bytes_per_s(self) -> float:
        t = self.totals
        return t.link_bytes / t.link_busy_s if t.link_busy_s > 0 else self.costs.profile.link_bytes_per_s

    # ---- compute -----------------------------------------------------------------------------------
    def compute(self, flops: float, nbytes: float, launches: int = 1, alu_ops: float = 0.0,
                efficiency: float = 1.0) -> float:
        return self.costs.op_seconds(flops, nbytes, launches, alu_ops, efficiency)  # the kernel takes the real time

    def run_on_host(self, fn, op: HostOp, threads: int, *args) -> HostJob:
        """Inputs go to pinned host buffers on the compute stream (an event marks them ready); the worker thread
        waits for that event, then computes with ``threads`` torch threads while the device carries on."""
        torch = self.torch
        host_args = []
        for a in args:
            buf = torch.empty(a.shape, dtype=a.dtype, pin_memory=True)
            buf.copy_(a, non_blocking=True)
            host_args.append(buf)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specterbench-host-experts")

        def work():
            ready.synchronize()
            torch.set_num_threads(threads)
            start = time.perf_counter()
            y = fn(*host_args)
            return y, time.perf_counter() - start

        estimate = self.costs.host_seconds(op, threads) if self.costs.host else 0.0
        self._host_pending_s += estimate
        return HostJob(None, time.perf_counter() + estimate, self._worker.submit(work), estimate)

    def wait_host(self, jobs: Sequence[HostJob]) -> float:
        start = time.perf_counter()
        for job in jobs:
            job.result, busy = job.future.result()
            self.totals.host_busy_s += busy
            self._host_pending_s -= job.estimate_s
        stall = time.perf_counter() - start
        if stall > 0 and jobs:
            self.totals.stall_s += stall
            self.totals.stalls += 1
        return stall

    def host_backlog_s(self) -> float:
        return max(0.0, self._host_pending_s)  # the cost model's estimate of the jobs not yet joined

    def now(self) -> float:
        return time.perf_counter()

    def settle(self) -> None:
        self._pump()
        while not self.scheduler.empty() or self.scheduler.in_flight:
            if self.scheduler.in_flight:
                self.scheduler.in_flight[0].event.synchronize()
            self._pump()
        self.sync()

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)
        for before, after in self._waits:
            self.totals.stall_s += before.elapsed_time(after) / 1e3
        self._waits.clear()
        self._pump()
