"""The measured CUDA clock: the copy scheduler feeds a dedicated copy stream; CUDA events time copies and stalls.

A copy waits in the :class:`~specterbench.engine.scheduler.CopyScheduler` (host side: priorities, demand first,
cancellable) until the copy stream holds less than :data:`DEPTH_S` of link time (bytes at the profile's bandwidth);
then its real copy (pinned host memory → device, non-blocking) is enqueued between two timing events. The scheduler
is pumped at every clock call — every priced op too, so during a draft's forward, while the host waits for host
experts and while it waits for the device at a sync (polled, not a blocking synchronize): landed copies are retired
(their event timing gives the measured link bandwidth), the next copies are enqueued. A demand fetch overtakes
every copy not yet on the stream.

Prices (for strategies' estimates and the stream depth) come from the run's ``--profile`` and host profile, so a
measured and a modeled run take the same decisions. Stalls are the compute stream's waits for copies only (timed
by events); the host's waits for host experts are counted apart (``totals.host_wait_s``).

Host experts run on one :class:`HostPool` per run (one worker thread that leaves the launching thread a core), their
inputs and results through pinned buffers, the results copied back without blocking the host.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Sequence

from specterbench.engine.clocks import Backlog, ClockTotals, HostJob
from specterbench.engine.costs import CostModel, HostOp
from specterbench.engine.scheduler import DEMAND_PRIORITY, CopyScheduler, Transfer

DEPTH_S = 0.010  # link time kept enqueued on the copy stream: enough that it never idles between pumps
MAX_IN_FLIGHT = 64  # and at most this many copies (small experts)
SYNC_POLL_S = 20e-6  # while the host waits for the device, the scheduler is pumped this often


def host_threads() -> int:
    """Threads host experts may use: every core but one, which the launching thread keeps."""
    return max(1, (os.cpu_count() or 1) - 1)


class HostPool:
    """One worker thread for host experts, made once per run and shared by every cell's clock; :meth:`close` at
    the end of the run (the runner does)."""

    def __init__(self):
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specterbench-host-experts")

    def submit(self, fn):
        return self.executor.submit(fn)

    def close(self) -> None:
        self.executor.shutdown(wait=True)


class CudaClock(Backlog):  # pragma: no cover - needs CUDA (tests/engine/test_clock_cuda_fake.py fakes torch.cuda)
    kind = "measured"

    def __init__(self, device, costs: CostModel | None = None, max_in_flight: int | None = None,
                 host_pool: HostPool | None = None, depth_s: float = DEPTH_S):
        import torch

        self.torch = torch
        self.device = device
        self.costs = costs
        self.stream = torch.cuda.Stream(device=device)
        self.depth_s = depth_s
        self.scheduler = CopyScheduler(max_in_flight or MAX_IN_FLIGHT)
        self.totals = ClockTotals()
        self._seq = 0
        self._waits: list[tuple] = []  # (before, after) events around compute-stream waits: the stalls
        self._landed: list[Transfer] = []
        self._pool = host_pool
        self._own_pool = False
        self._host_pending_s = 0.0
        self.host_wait_s = 0.0  # the host waiting for host experts (not a compute-stream stall)

    def depth_bytes(self) -> int:
        """The copy stream's depth in bytes: :attr:`depth_s` of link time at the profile's bandwidth."""
        return max(1, int(self.depth_s * self.costs.profile.link_bytes_per_s))

    @property
    def host_threads_available(self) -> int:
        return host_threads()

    def pump(self) -> None:
        """Retire landed copies and enqueue the next: callable by anyone who has a moment (cheap when idle)."""
        self._pump()

    # ---- link --------------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Retire copies whose events completed; enqueue the next ones while the stream has room."""
        s, torch = self.scheduler, self.torch
        if s.max_in_flight_bytes is None:  # sized once prices are known (the engine may give them after __init__)
            s.max_in_flight_bytes = self.depth_bytes()
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

    def copy_sync(self, key, nbytes: int, copy=None) -> Transfer:
        """``copy`` (a blocking ``copy_`` from pageable host memory) runs on the compute stream, between two timing
        events: the driver stages it through a pinned bounce buffer and PyTorch synchronizes the stream after a
        blocking copy, so the host and the compute stream wait for it; its event time is the link's and a stall."""
        return self._copy_on_stream(key, nbytes, copy, to_host=False)

    def copy_on_compute(self, key, nbytes: int, copy=None, *, to_host: bool = False) -> Transfer:
        """``copy`` (non-blocking ``copy_`` calls from or into pinned memory) is enqueued on the compute stream
        between two timing events, so it runs after the compute queued before it and what is queued after it waits;
        the host then waits for its end event, as Mixtral-Offloading's host does at its next ``.tolist()``. Its event
        time is a stall; a device→host one counts in ``totals.d2h_bytes`` instead of the link's."""
        return self._copy_on_stream(key, nbytes, copy, to_host=to_host)

    def _copy_on_stream(self, key, nbytes: int, copy, *, to_host: bool) -> Transfer:
        torch = self.torch
        self._pump()
        self._seq += 1
        t = Transfer(key, nbytes, DEMAND_PRIORITY, time.perf_counter(), self._seq, copy=copy)
        cur = torch.cuda.current_stream(self.device)
        t.start_event = torch.cuda.Event(enable_timing=True)
        t.start_event.record(cur)
        t.start_s = time.perf_counter()
        if copy is not None:
            copy()
        t.event = torch.cuda.Event(enable_timing=True)
        t.event.record(cur)
        t.event.synchronize()
        t.end_s, t.state = time.perf_counter(), "landed"
        seconds = t.start_event.elapsed_time(t.event) / 1e3
        if to_host:
            self.totals.d2h_busy_s += seconds
            self.totals.d2h_bytes += nbytes
        else:
            self.totals.link_busy_s += seconds
            self.totals.link_bytes += nbytes
        self._waits.append((t.start_event, t.event))  # the compute stream held by the copy: a stall
        self.totals.stalls += 1
        if not to_host:
            self._landed.append(t)
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
                efficiency: float = 1.0, graph_nodes: int = 0) -> float:
        self._pump()  # every op the engine launches is a moment to feed the copy stream
        # the kernel takes the real time
        return self.costs.op_seconds(flops, nbytes, launches, alu_ops, efficiency, graph_nodes)

    def run_on_host(self, fn, op: HostOp, threads: int, *args) -> HostJob:
        """Inputs go to pinned host buffers on the compute stream (an event marks them ready); the run's worker
        thread waits for that event, computes with ``threads`` torch threads while the device carries on, and leaves
        the result in a pinned buffer (copied back without blocking the host, see :func:`join_host`)."""
        torch = self.torch
        host_args = []
        for a in args:
            buf = torch.empty(a.shape, dtype=a.dtype, pin_memory=True)
            buf.copy_(a, non_blocking=True)
            host_args.append(buf)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        if self._pool is None:  # a clock made outside a run gets its own pool, closed with it
            self._pool, self._own_pool = HostPool(), True

        def work():
            ready.synchronize()
            torch.set_num_threads(threads)
            start = time.perf_counter()
            y = fn(*host_args)
            out = torch.empty(y.shape, dtype=y.dtype, pin_memory=True)  # the copy back can run non-blocking
            out.copy_(y)
            return out, time.perf_counter() - start

        estimate = self.costs.host_seconds(op, threads) if self.costs.host else 0.0
        self._host_pending_s += estimate
        return HostJob(None, time.perf_counter() + estimate, self._pool.submit(work), estimate)

    def wait_host(self, jobs: Sequence[HostJob]) -> float:
        """The host waits for the jobs' results, feeding the copy stream meanwhile; the seconds waited (counted
        as ``host_wait_s``: the compute stream itself stalls only if it runs dry, which its events would show)."""
        start = time.perf_counter()
        for job in jobs:
            while not job.future.done():
                self._pump()
                wait([job.future], timeout=SYNC_POLL_S * 10)
            job.result, busy = job.future.result()
            self.totals.host_busy_s += busy
            self._host_pending_s -= job.estimate_s
        waited = time.perf_counter() - start
        self.host_wait_s += waited
        return waited

    def close(self) -> None:
        """Let go of a pool this clock made itself (a run's pool is the runner's to close)."""
        if self._own_pool and self._pool is not None:
            self._pool.close()
        self._pool, self._own_pool = None, False

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
        """Wait for the device, pumping copies meanwhile (a blocking synchronize would leave the link idle)."""
        done = self.torch.cuda.Event()
        done.record(self.torch.cuda.current_stream(self.device))
        while not done.query():
            self._pump()
            time.sleep(SYNC_POLL_S)
        self.torch.cuda.synchronize(self.device)
        for before, after in self._waits:
            self.totals.stall_s += before.elapsed_time(after) / 1e3
        self._waits.clear()
        self._pump()
