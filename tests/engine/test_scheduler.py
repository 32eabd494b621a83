"""The host-side copy scheduler every clock shares: priorities, demand first, cancel, bounded copies in flight."""

import pytest

from specterbench.engine.scheduler import DEMAND_PRIORITY, CopyScheduler, Transfer


def copy(key, priority=0.0, issue_s=0.0, seq=None, nbytes=10):
    copy.seq = getattr(copy, "seq", 0) + 1
    return Transfer(key, nbytes, priority, issue_s, seq if seq is not None else copy.seq)


def started(s, until_s=0.0):
    s.admit(until_s)
    out = []
    while (t := s.pop()) is not None:
        out.append(t.key)
        s.landed(t)
    return out


def test_higher_priority_starts_first_and_ties_go_in_issue_order():
    s = CopyScheduler()
    for key, prio in (("a", 0), ("b", 5), ("c", 0), ("d", 5)):
        s.submit(copy(key, prio))
    assert started(s) == ["b", "d", "a", "c"]


def test_a_demand_fetch_outranks_every_prefetch():
    s = CopyScheduler()
    low, high = copy("low", 1), copy("high", 100)
    s.submit(low)
    s.submit(high)
    s.promote(low, DEMAND_PRIORITY)
    assert s.demand_count == 1 and s.demand_bytes == 10
    assert started(s) == ["low", "high"]


def test_a_copy_not_yet_issued_is_not_eligible():
    s = CopyScheduler()
    s.submit(copy("now", 0, issue_s=0.0))
    s.submit(copy("later", 99, issue_s=1.0))
    assert started(s, until_s=0.5) == ["now"]
    assert s.earliest_arrival_s() == 1.0
    assert started(s, until_s=1.0) == ["later"]


def test_cancel_drops_a_queued_copy_and_refuses_a_started_one():
    s = CopyScheduler(max_in_flight=1)
    a, b = copy("a"), copy("b")
    s.submit(a)
    s.submit(b)
    s.admit(0.0)
    assert s.pop() is a
    assert not s.cancel(a)
    assert s.cancel(b) and b.state == "cancelled"
    assert s.empty() and s.queued_bytes == 0
    s.landed(a)
    assert s.pop() is None


def test_copies_in_flight_are_bounded():
    s = CopyScheduler(max_in_flight=2)
    for key in "abc":
        s.submit(copy(key))
    s.admit(0.0)
    first, second = s.pop(), s.pop()
    assert s.pop() is None  # the stream is full
    s.landed(first)
    assert s.pop().key == "c"
    with pytest.raises(ValueError, match="oldest in flight"):
        s.landed(first)
    assert second.state == "started"


def test_pending_lists_queued_copies_in_start_order():
    s = CopyScheduler()
    for key, prio in (("a", 0), ("b", 2), ("c", 1)):
        s.submit(copy(key, prio))
    s.admit(0.0)
    s.submit(copy("d", 3, issue_s=5.0))  # not yet eligible
    assert [t.key for t in s.pending()] == ["d", "b", "c", "a"]
    assert s.bytes_ahead_of(s.pending()[-1]) == 30


def test_max_in_flight_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        CopyScheduler(max_in_flight=0)
