"""The host-side copy scheduler: which expert copy the link carries next, for every clock.

Copies are submitted in time order (``issue_s`` never decreases). A copy becomes *eligible* once its issue time has
come; among eligible copies the highest ``priority`` goes first, ties in issue order. A copy whose compute is
waiting (a demand fetch) is promoted to :data:`DEMAND_PRIORITY` and outranks every prefetch. A copy that has not
started can be cancelled (its ``copy`` is dropped at once, so the slot memory it would fill is released). At most
``max_in_flight`` copies — and, with ``max_in_flight_bytes``, at most that many bytes (one copy always may start) —
are started and not yet landed: the modeled clock prices one copy at a time on the link (``max_in_flight=1``,
non-preemptive); the CUDA clock keeps about 10 ms of link time enqueued on its copy stream (a copy on the stream can
no longer be reordered or cancelled, so a demand fetch overtakes everything not yet on it).

Every operation is O(log n) in the number of queued copies: arrivals wait in a FIFO, eligible copies in a heap;
cancellation and promotion are lazy (a stale heap entry is skipped when it reaches the top). Queued bytes and
copies are kept as running totals, so backlog estimates do not scan the queue. :attr:`steps` counts the
scheduler's internal steps (heap pushes and pops, FIFO moves) for the scaling test.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any

DEMAND_PRIORITY = float("inf")  # a demand fetch outranks every prefetch still queued


@dataclass(slots=True, eq=False)
class Transfer:
    """One expert copy. Times are the clock's seconds; ``start_s``/``end_s`` are None until known."""

    key: Any
    nbytes: int
    priority: float
    issue_s: float
    seq: int
    start_s: float | None = None
    end_s: float | None = None
    copy: Any = None  # callable that enqueues the real copy (measured clocks run it when the copy starts)
    event: Any = None  # CUDA event recorded after the copy, measured clock only
    start_event: Any = None
    state: str = "queued"  # queued | eligible | started | landed | cancelled
    _version: int = 0  # bumped by promotion: older heap entries of this copy are stale


class CopyScheduler:
    def __init__(self, max_in_flight: int = 1, max_in_flight_bytes: int | None = None):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if max_in_flight_bytes is not None and max_in_flight_bytes < 1:
            raise ValueError(f"max_in_flight_bytes must be positive, got {max_in_flight_bytes}")
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.in_flight_bytes = 0
        self._arrivals: deque[Transfer] = deque()  # submitted, issue time not yet reached by the link
        self._eligible: list[tuple[float, int, int, Transfer]] = []  # (-priority, seq, version, copy)
        self.in_flight: deque[Transfer] = deque()  # started, not yet landed, in start order
        self.queued_count = 0
        self.queued_bytes = 0
        self.demand_count = 0  # queued copies at DEMAND_PRIORITY
        self.demand_bytes = 0
        self.steps = 0

    def __len__(self) -> int:
        return self.queued_count

    # ---- queue -------------------------------------------------------------------------------------
    def submit(self, t: Transfer) -> None:
        self._arrivals.append(t)
        self.queued_count += 1
        self.queued_bytes += t.nbytes
        if t.priority == DEMAND_PRIORITY:
            self.demand_count += 1
            self.demand_bytes += t.nbytes
        self.steps += 1

    def admit(self, until_s: float) -> None:
        """Make every copy issued at or before ``until_s`` eligible."""
        while self._arrivals and self._arrivals[0].issue_s <= until_s:
            t = self._arrivals.popleft()
            if t.state == "queued":
                t.state = "eligible"
                heapq.heappush(self._eligible, (-t.priority, t.seq, t._version, t))
            self.steps += 1

    def promote(self, t: Transfer, priority: float = DEMAND_PRIORITY) -> None:
        """Raise a queued copy's priority (a demand fetch waiting on it)."""
        if t.state not in ("queued", "eligible") or priority <= t.priority:
            return
        if priority == DEMAND_PRIORITY:
            self.demand_count += 1
            self.demand_bytes += t.nbytes
        t.priority = priority
        t._version += 1
        if t.state == "eligible":
            heapq.heappush(self._eligible, (-priority, t.seq, t._version, t))
            self.steps += 1

    def cancel(self, t: Transfer) -> bool:
        """Drop a copy that has not started; False once it has."""
        if t.state not in ("queued", "eligible"):
            return False
        self._unqueue(t)
        t.state = "cancelled"  # its heap or FIFO entry is skipped later
        t.copy = None  # the slot tensors it would have filled are not kept alive by a stale entry
        return True

    def _unqueue(self, t: Transfer) -> None:
        self.queued_count -= 1
        self.queued_bytes -= t.nbytes
        if t.priority == DEMAND_PRIORITY:
            self.demand_count -= 1
            self.demand_bytes -= t.nbytes

    def _top(self) -> Transfer | None:
        heap = self._eligible
        while heap:
            _, _, version, t = heap[0]
            if t.state == "eligible" and version == t._version:
                return t
            heapq.heappop(heap)
            self.steps += 1
        return None

    def has_eligible(self) -> bool:
        return self._top() is not None

    def earliest_arrival_s(self) -> float | None:
        """Issue time of the oldest copy not yet eligible (None when there is none)."""
        while self._arrivals and self._arrivals[0].state != "queued":
            self._arrivals.popleft()
            self.steps += 1
        return self._arrivals[0].issue_s if self._arrivals else None

    def pop(self) -> Transfer | None:
        """Start the highest-priority eligible copy (None when none is eligible or the stream is full)."""
        if len(self.in_flight) >= self.max_in_flight:
            return None
        t = self._top()
        if t is None:
            return None
        if (self.max_in_flight_bytes is not None and self.in_flight
                and self.in_flight_bytes + t.nbytes > self.max_in_flight_bytes):
            return None
        heapq.heappop(self._eligible)
        self.steps += 1
        self._unqueue(t)
        t.state = "started"
        self.in_flight.append(t)
        self.in_flight_bytes += t.nbytes
        return t

    def landed(self, t: Transfer) -> None:
        """Mark the oldest copy in flight as landed (copies land in start order)."""
        if not self.in_flight or self.in_flight[0] is not t:
            raise ValueError(f"copy of {t.key} is not the oldest in flight")
        self.in_flight.popleft()
        self.in_flight_bytes -= t.nbytes
        t.state = "landed"
        self.steps += 1

    def empty(self) -> bool:
        return self.queued_count == 0

    def pending(self) -> list[Transfer]:
        """Copies not yet started, in the order they would start if all were eligible now: O(queued)."""
        out = [q for q in self._arrivals if q.state == "queued"]
        out += [q for _, _, v, q in self._eligible if q.state == "eligible" and v == q._version]
        return sorted(out, key=lambda q: (-q.priority, q.seq))

    def bytes_ahead_of(self, t: Transfer) -> int:
        """Bytes of queued copies that will start before ``t`` if nothing else arrives: O(queued), for reports
        and strategies that ask (the engine's hot path orders copies with :meth:`order_key` instead)."""
        return sum(q.nbytes for q in self.pending() if q is not t and (q.priority, -q.seq) > (t.priority, -t.seq))

    @staticmethod
    def order_key(t: Transfer) -> tuple:
        """A key that sorts copies by when they will land: landed and in-flight by end time, then queued copies
        by rank (priority, then issue order). O(1)."""
        if t.end_s is not None:
            return (0, t.end_s, 0)
        if t.state == "started":
            return (1, t.seq, 0)
        return (2, -t.priority, t.seq)
