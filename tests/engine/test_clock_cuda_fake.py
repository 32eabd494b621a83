"""The CUDA clock's scheduling logic on a CPU, against a fake ``torch.cuda`` whose copy stream completes events only
when the test says so: priorities, demand first, cancel of copies not started, bounded copies in flight, copies
enqueued only when they start, bandwidth measured from event timings. (The real thing: tests/engine/test_cuda.py.)"""

import pytest
import torch

from specterbench.engine.costs import CostModel
from specterbench.engine.cuda_clock import CudaClock
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.profiles import default_profile
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
    costs = CostModel(default_profile(), geometry_preset("mixtral"))
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
    assert clock.link_bytes_per_s() == default_profile().link_bytes_per_s  # nothing measured yet
    assert clock.expected_arrival(t) >= t.start_s
    land_one(clock)
    assert clock.ready(t) and [x.key for x in clock.drain_landed()] == ["a"]
    assert clock.link_bytes_per_s() == pytest.approx(10**6 / (MS_PER_EVENT / 1e3))
    assert clock.expected_arrival(t) == t.end_s and clock.link_backlog_s() == 0.0


def test_wait_landed_blocks_on_the_event(clock):
    t = clock.issue("a", 1000, 0.0)
    clock.wait_landed(t)
    assert clock.ready(t)


@pytest.fixture
def deep_clock(monkeypatch, clock):
    """A clock whose copy stream holds copies by bytes: ``depth_s`` of link time at the profile's bandwidth."""
    costs = CostModel(default_profile(), geometry_preset("mixtral"))
    return CudaClock("cuda:0", costs)


def test_the_copy_stream_holds_about_ten_ms_of_link_time(deep_clock):
    depth = deep_clock.depth_bytes()
    assert depth == int(0.010 * default_profile().link_bytes_per_s)
    size = depth // 4 + 1  # four fit... almost: three and a bit
    copies = [deep_clock.issue(("e", i), size, 0.0) for i in range(6)]
    started = [deep_clock.started(t) for t in copies]
    assert started == [True, True, True, False, False, False]
    assert deep_clock.scheduler.in_flight_bytes == 3 * size <= depth
    big = deep_clock.issue("huge", 10 * depth, 0.0)
    land_one(deep_clock), land_one(deep_clock), land_one(deep_clock)
    assert deep_clock.started(copies[3]) and not deep_clock.started(big)  # issue order among equals
    assert deep_clock.scheduler.in_flight_bytes <= depth


def test_a_copy_larger_than_the_depth_still_starts_on_an_idle_stream(deep_clock):
    t = deep_clock.issue("huge", 10 * deep_clock.depth_bytes(), 0.0)
    assert deep_clock.started(t)


def test_a_demand_fetch_overtakes_every_copy_not_yet_on_the_stream(deep_clock):
    size = deep_clock.depth_bytes() // 2
    on_stream = [deep_clock.issue(("p", i), size, 5.0) for i in range(2)]
    queued = [deep_clock.issue(("q", i), size, 9.0) for i in range(3)]
    demand = deep_clock.issue("demand", size, 0.0)
    deep_clock.wait(demand)
    assert deep_clock.started(demand) and not any(deep_clock.started(t) for t in queued)
    assert all(deep_clock.started(t) for t in on_stream)


def test_every_priced_op_feeds_the_copy_stream(deep_clock):
    size = deep_clock.depth_bytes() // 2
    first = [deep_clock.issue(("p", i), size, 0.0) for i in range(2)]
    waiting = deep_clock.issue("next", size, 0.0)
    assert not deep_clock.started(waiting)
    land_one(deep_clock)  # the first copy lands while the device computes (a draft step, say)
    deep_clock.compute(1e9, 1e6)  # the engine prices its next kernel: the clock pumps
    assert waiting.state == "started" and first[0].state == "landed"


def test_a_cancelled_copy_lets_go_of_its_slot_tensors(deep_clock):
    import gc
    import weakref

    size = deep_clock.depth_bytes()
    deep_clock.issue("busy", size, 0.0)
    slot = torch.empty(16)
    alive = weakref.ref(slot)
    t = deep_clock.issue("queued", size, 0.0, lambda s=slot: s.zero_())
    del slot
    assert deep_clock.cancel(t)
    gc.collect()
    assert alive() is None and t.copy is None


def test_a_copy_into_a_reused_slot_waits_for_the_compute_streams_reads(deep_clock, monkeypatch):
    from specterbench.engine.residency import slot_copy

    recorded = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: recorded.append(stream))
    evicted = FakeEvent()
    evicted.record(COMPUTE)  # the engine records it on the compute stream when it evicts
    dst, src = (torch.empty(4),), (torch.ones(4),)
    ran = []
    deep_clock.issue("k", 16, 0.0, lambda: (ran.append("copy"), slot_copy(dst, src, evicted)()))
    assert ran == ["copy"] and COMPUTE.waits[-1] is evicted  # the fake's current stream stands for the copy stream
    assert torch.equal(dst[0], src[0]) and recorded == [COMPUTE]


def test_host_waits_are_not_compute_stalls(deep_clock):
    from concurrent.futures import Future

    from specterbench.engine.clocks import HostJob

    done = Future()
    done.set_result((torch.zeros(1), 0.001))
    deep_clock.wait_host([HostJob(None, 0.0, done, 0.0)])
    assert deep_clock.totals.stall_s == 0.0 and deep_clock.totals.stalls == 0
    assert deep_clock.totals.host_busy_s == pytest.approx(0.001)
