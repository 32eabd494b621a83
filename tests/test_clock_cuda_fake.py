"""The CUDA clock's scheduling logic on a CPU, against a fake ``torch.cuda`` whose copy stream completes events only
when the test says so: priorities, demand first, cancel of copies not started, bounded copies in flight, copies
enqueued only when they start, bandwidth measured from event timings. (The real thing: tests/test_cuda.py.)"""

import pytest
import torch

from specterbench.engine.costs import CostModel
from specterbench.engine.cuda_clock import CudaClock
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.profiles import BUILTIN_PROFILES
from specterbench.engine.scheduler import DEMAND_PRIORITY

MS_PER_EVENT = 2.0  # fake device time between consecutive events on the copy stream


class FakeStream:
    def __init__(self, device=None):
        self.pending = []  # events recorded and not yet complete, in order
        self.waits = []

    def wait_event(self, event):
        self.waits.append(event)


class FakeEvent:
    clock_ms = 0.0

    def __init__(self, enable_timing=False):
        self.done, self.t_ms, self.stream = False, None, None

    def record(self, stream=None):
        self.stream = stream
        if stream is None or stream is COMPUTE:
            self._complete()
        else:
            stream.pending.append(self)

    def _complete(self):
        FakeEvent.clock_ms += MS_PER_EVENT
        self.done, self.t_ms = True, FakeEvent.clock_ms

    def query(self):
        return self.done

    def synchronize(self):
        while not self.done:
            self.stream.pending.pop(0)._complete()

    def elapsed_time(self, other):
        return other.t_ms - self.t_ms


COMPUTE = FakeStream()


class _StreamContext:
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        return False


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", _StreamContext)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: COMPUTE)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    costs = CostModel(BUILTIN_PROFILES[0], geometry_preset("mixtral"))
    return CudaClock("cuda:0", costs, max_in_flight=1)


def land_one(clock):
    clock.stream.pending.pop(0)._complete()  # the copy's start event
    clock.stream.pending.pop(0)._complete()  # its end event


def test_the_copy_runs_only_when_it_starts_and_higher_priority_starts_first(clock):
    ran = []
    busy = clock.issue("busy", 1000, 0.0, lambda: ran.append("busy"))
    low = clock.issue("low", 1000, 1.0, lambda: ran.append("low"))
    high = clock.issue("high", 1000, 5.0, lambda: ran.append("high"))
    assert ran == ["busy"] and clock.started(busy) and not clock.started(low)  # one copy in flight at most
    land_one(clock)
    assert clock.ready(busy) and clock.started(high) and not clock.started(low)
    assert ran == ["busy", "high"]


def test_cancel_drops_a_queued_copy_only(clock):
    busy = clock.issue("busy", 1000, 0.0)
    queued = clock.issue("queued", 1000, 0.0)
    assert not clock.cancel(busy)
    assert clock.cancel(queued)
    land_one(clock)
    assert clock.ready(busy) and not clock.started(queued) and clock.scheduler.empty()


def test_waiting_on_a_queued_copy_makes_it_a_demand_fetch_and_times_the_stall(clock):
    clock.issue("busy", 1000, 0.0)
    prefetch = clock.issue("prefetch", 1000, 9.0)
    demand = clock.issue("demand", 1000, -1.0)
    clock.wait(demand)  # the host waits for the stream's oldest copy (no spinning), then enqueues the demand one
    assert clock.started(demand) and not clock.started(prefetch)
    assert demand.priority == DEMAND_PRIORITY and COMPUTE.waits[-1] is demand.event
    assert clock.totals.stalls == 1
    clock.sync()
    assert clock.totals.stall_s >= 0


def test_bandwidth_and_arrival_come_from_the_events(clock):
    t = clock.issue("a", 10**6, 0.0)
    assert clock.link_bytes_per_s() == BUILTIN_PROFILES[0].link_bytes_per_s  # nothing measured yet
    assert clock.expected_arrival(t) >= t.start_s
    land_one(clock)
    assert clock.ready(t) and [x.key for x in clock.drain_landed()] == ["a"]
    assert clock.link_bytes_per_s() == pytest.approx(10**6 / (MS_PER_EVENT / 1e3))
    assert clock.expected_arrival(t) == t.end_s and clock.link_backlog_s() == 0.0


def test_wait_landed_blocks_on_the_event(clock):
    t = clock.issue("a", 1000, 0.0)
    clock.wait_landed(t)
    assert clock.ready(t)
