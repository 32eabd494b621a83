import pytest

from specterbench.engine.geometry import Geometry
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import HardwareProfile
from specterbench.errors import UsageError

GEO = Geometry("g", hidden=8, expert_intermediate=8, num_experts=4, top_k=2, moe_layers=1, layers=1, heads=1,
               kv_heads=1, head_dim=8, vocab=16)


def clock(link_bytes_per_s=1e6, latency_us=0.0):
    # 1 MB/s link, no latency, no launch overhead, compute time = bytes / 1e6: easy hand arithmetic
    profile = HardwareProfile("test", "test", flops_per_s=1e30, mem_bytes_per_s=1e6, link_bytes_per_s=link_bytes_per_s,
                              link_latency_us=latency_us, launch_us=0.0, device_memory_bytes=1, sources=("test",))
    return ModeledClock(profile, GEO)


def test_prefetch_fully_overlapped_by_compute_has_no_stall():
    c = clock()
    t = c.issue("a", 1000, priority=0)  # lands at 1 ms
    c.compute(0, 2000)  # 2 ms of compute
    assert c.wait(t) == 0.0
    assert c.now() == pytest.approx(0.002)


def test_transfer_longer_than_compute_stalls_for_the_difference():
    c = clock()
    t = c.issue("a", 3000, priority=0)  # lands at 3 ms
    c.compute(0, 1000)  # 1 ms
    assert c.wait(t) == pytest.approx(0.002)
    assert c.now() == pytest.approx(0.003)
    assert c.totals.stalls == 1


def test_link_serves_one_copy_at_a_time():
    c = clock()
    a = c.issue("a", 1000, 0)
    b = c.issue("b", 1000, 0)
    c.wait(b)
    assert (a.start_s, a.end_s, b.start_s, b.end_s) == pytest.approx((0, 0.001, 0.001, 0.002))


def test_higher_priority_queued_copy_goes_first_and_demand_jumps_the_queue():
    c = clock()
    busy = c.issue("busy", 1000, 0)
    low = c.issue("low", 1000, priority=1)
    high = c.issue("high", 1000, priority=5)
    demand = c.issue("demand", 1000, priority=-1)
    c.wait(demand)  # a wait makes the copy a demand fetch: served as soon as the link frees
    assert busy.end_s == pytest.approx(0.001)
    assert demand.start_s == pytest.approx(0.001)
    assert high.start_s is None and low.start_s is None
    c.compute(0, 10_000)  # let the link drain without demanding either
    assert c.ready(low) and c.ready(high)
    assert high.start_s < low.start_s


def test_copy_issued_later_cannot_start_before_it_is_issued():
    c = clock()
    c.compute(0, 5000)  # 5 ms
    t = c.issue("a", 1000, 0)
    c.wait(t)
    assert t.start_s == pytest.approx(0.005) and c.now() == pytest.approx(0.006)


def test_cancel_only_before_the_copy_starts():
    c = clock()
    a = c.issue("a", 1000, 0)
    b = c.issue("b", 1000, 0)
    c.compute(0, 500)  # a has started, b is queued
    assert not c.cancel(a)
    assert c.cancel(b)
    assert c.queued == []


def test_link_latency_is_charged_per_copy():
    c = clock(latency_us=100.0)
    t = c.issue("a", 1000, 0)
    c.wait(t)
    assert c.now() == pytest.approx(0.0011)


def test_profile_missing_a_field_names_it():
    with pytest.raises(UsageError, match="link_bytes_per_s"):
        HardwareProfile.from_dict({"name": "x", "accelerator": "y", "flops_per_s": 1, "mem_bytes_per_s": 1,
                                   "link_latency_us": 1, "launch_us": 1, "device_memory_bytes": 1, "sources": []})
