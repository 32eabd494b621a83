"""Prefetch planners: what the draft's routing over a window says to copy before the verification.

- :class:`ArtifactPlanner` — the Specter artifact's bandwidth-aware planner (provenance in docs/strategies.md,
  ``specter-artifact``): a cold start that observes the first ``int(0.2·K)`` draft steps, then at chunk boundaries
  the top-M experts of every layer by the draft's routing counts (M = the layer's slot group), each chunk as long as
  the copies just issued take at the link-bandwidth moving average (starting at 12 GB/s) in units of the draft-step
  moving average; nothing is planned at the last step; the verification waits until every planned copy has landed.
- :class:`LookaheadPlanner` — Specter's own: every expert the draft routed to, earliest layer first and most
  used first within a layer, as far as the cache allows, in chunks the link moves during one draft step; no
  barrier (a late copy is waited for by the layer that needs it, not by the whole verification).
"""

from __future__ import annotations

import math
from collections import Counter


def top_m(counts: dict[int, Counter], m: int) -> dict[int, list[int]]:
    """Per layer, the ``m`` experts the draft routed most tokens to (ties: lower expert id first)."""
    return {layer: [e for e, _ in sorted(c.items(), key=lambda x: (-x[1], x[0]))[:m]]
            for layer, c in sorted(counts.items())}


def issue_layer_plan(engine, layer: int, experts: list[int], protect: set) -> tuple[list, int]:
    """Bring ``experts`` of ``layer`` in (touching those cached), the layer's verification order as priority.
    Returns (keys now planned, bytes newly issued)."""
    planned, issued = [], 0
    for e in experts:
        key = (layer, e)
        if key in engine.cache:
            engine.cache.touch(key)
        elif not (engine.make_room(engine.expert_bytes, protect=protect, needed=key)
                  and engine.prefetch(key, priority=-float(layer))):
            continue
        else:
            issued += engine.priced_expert_bytes
        planned.append(key)
    return planned, issued



def by_layer(keys) -> dict[int, set]:
    """``{layer: {expert, ...}}`` of ``(layer, expert)`` keys (what a planner issued, as :meth:`predicted` reports)."""
    out: dict[int, set] = {}
    for layer, e in keys:
        out.setdefault(layer, set()).add(e)
    return out

class ArtifactPlanner:
    """The artifact's cold start / prefetch overlap / final cleanup phases over one window."""

    def __init__(self, engine, slots_per_layer: int, initial_fraction: float = 0.2, bandwidth_gbps: float = 12.0):
        self.engine = engine
        self.m = max(1, slots_per_layer)
        self.initial_fraction = initial_fraction
        self.bw_bytes_per_s = bandwidth_gbps * 1e9  # moving averages, kept across windows
        self.draft_step_s = 1e-3
        self.link_tail_s = 0.0  # when the copies of the last chunk land
        self.boundaries: list[dict] = []
        self.begin(0)

    def begin(self, k: int) -> None:
        self.k = k
        self.counts: dict[int, Counter] = {}
        self.phase = "cold_start"
        self.next_boundary = max(1, int(self.initial_fraction * k))
        self.planned: set = set()

    def after_step(self, step: int, routing, step_s: float) -> None:
        self.draft_step_s = 0.75 * self.draft_step_s + 0.25 * max(step_s, 1e-9)
        if self.phase == "final_cleanup":
            return
        for layer, experts, counts in routing:
            self.counts.setdefault(layer, Counter()).update(dict(zip(experts, counts)))
        done = step + 1
        if done < self.next_boundary:
            return
        if done >= self.k:  # nothing planned at the last step
            self.phase = "final_cleanup"
            self.counts = {}
            return
        engine = self.engine
        start = engine.clock.now()
        plans = top_m(self.counts, self.m)
        protect = {(l, e) for l, es in plans.items() for e in es} | self.planned
        issued, arrivals = 0, [start]
        for layer, experts in plans.items():
            keys, nbytes = issue_layer_plan(engine, layer, experts, protect)
            self.planned.update(keys)
            issued += nbytes
            arrivals += [engine.expected_arrival(k) for k in keys]
        if issued:  # the chunk's copies as the copy stream times them: from when the stream reaches them
            last = max(a for a in arrivals if a is not None)
            elapsed = max(last - max(start, self.link_tail_s), 1e-9)
            self.link_tail_s = last
            self.bw_bytes_per_s = 0.75 * self.bw_bytes_per_s + 0.25 * issued / elapsed
        chunk = max(1, math.ceil(issued / self.bw_bytes_per_s / self.draft_step_s))
        filled = len(plans) == engine.num_layers and all(len(es) >= self.m for es in plans.values())
        self.next_boundary = min(self.k, done + chunk)
        self.phase = "final_cleanup" if filled or self.next_boundary == self.k else "prefetch_overlap"
        self.boundaries.append({"at": done, "next": self.next_boundary, "issued_bytes": issued})

    def barrier(self) -> None:
        """Before verification: the compute stream waits for every planned copy still in flight."""
        self.engine.wait_for(sorted(self.planned))


class LookaheadPlanner:
    """Every predicted expert, earliest layer first, bandwidth-sized chunks per draft step, no barrier."""

    def __init__(self, engine):
        self.engine = engine
        self.begin()

    def begin(self) -> None:
        self.counts: dict[int, Counter] = {}
        self._predicted: set = set()  # every (layer, expert) in counts, kept as they grow (the plan's protection)
        self.planned: set = set()  # issued or found cached this window
        self.issued: set = set()  # copies issued this window

    def predicted(self) -> set:
        return set(self._predicted)

    def waiting(self) -> list:
        """Predicted experts not yet planned, earliest needed first (layer, then most routed, then number)."""
        planned = self.planned
        order = sorted((layer, -n, e) for layer, c in self.counts.items() for e, n in c.items()
                       if (layer, e) not in planned)  # plain tuples: no key function per entry
        return [(layer, e) for layer, _, e in order]

    def after_step(self, routing, step_s: float, chunk_s: float | None = None) -> None:
        for layer, experts, counts in routing:
            self.counts.setdefault(layer, Counter()).update(dict(zip(experts, counts)))
            self._predicted.update((layer, e) for e in experts)
        engine = self.engine
        bw = engine.link_bytes_per_s()
        span = step_s if chunk_s is None else chunk_s
        chunk = None if bw is None or span <= 0 else max(1, int(bw * span // engine.priced_expert_bytes))
        self.issue(chunk)

    def issue(self, n: int | None = None, from_layer: int = 0) -> None:
        """Bring in up to ``n`` (None: all) predicted experts not yet planned, earliest needed first, while the cache
        has room for them; ``from_layer``: only layers from there on (and only their predictions are protected, so
        that the layers before give their slots)."""
        engine = self.engine
        # the predictions protected from eviction: the set itself where every layer's are (make_room reads it in
        # place: nothing in this loop adds to it), else those of the layers from ``from_layer`` on
        protect = self._predicted if from_layer == 0 else {key for key in self._predicted if key[0] >= from_layer}
        waiting = [key for key in self.waiting() if key[0] >= from_layer]
        for key in waiting[:n]:
            if key in engine.cache:
                engine.cache.touch(key)
            elif engine.make_room(engine.expert_bytes, protect=protect, needed=key) and engine.prefetch(
                    key, priority=-float(key[0])):  # the verification needs earlier layers first
                self.issued.add(key)
            else:
                return  # the cache holds only predicted experts: the budget allows no more
            self.planned.add(key)
