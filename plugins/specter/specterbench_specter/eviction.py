"""Specter's eviction order: calibration residents, transients by recency, and the window's predictions kept.

Room is made by evicting transients the window does not need ahead (least recently used first), then residents it
does not need ahead (least popular first), then predicted ones of layers the verification has passed, then the one
needed last; the plan's own copies take only the room of transients, never a resident's, because a one-window
prediction must not displace the calibration's popular experts, which no later step brings back. Each choice is made
without scanning the cache: the transients sit in a heap by recency, the residents are walked in popularity order.
"""

from __future__ import annotations

import heapq

import torch


class CacheOrder:
    """Mixed into :class:`~.specter.Specter`: needs ``engine``, ``slots``, ``plan_on``, ``verifying``,
    ``window_draft``, ``transients`` and ``transient_heap``."""

    residents: frozenset = frozenset()
    popularity: dict = {}  # (layer, expert) -> rank in the calibration counts (0: most used); empty: no calibration
    residents_by_unpopularity: tuple = ()
    parked = ()  # transients' heap entries set aside while the window predicts them
    planning = False  # inside the plan's copies (after a draft step, before the verification)
    verify_layer = -1

    def load_residents(self, engine, calibration) -> None:
        """Frequency-aware residency: the cache starts with the calibration set's most popular experts (all
        slots but one layer's top-k, as cpu-experts pins them); they are given up least popular first."""
        self.popularity: dict = {}
        if calibration is None:
            return
        counts = calibration.counts.flatten().float()  # [layers * experts]
        order = torch.argsort(counts, descending=True, stable=True).tolist()
        self.popularity = {divmod(i, engine.num_experts): rank for rank, i in enumerate(order)}  # 0: most used
        n = max(0, self.slots - engine.top_k)
        self.residents = {divmod(i, engine.num_experts) for i in order[:n]}
        self.residents_by_unpopularity = [divmod(i, engine.num_experts) for i in reversed(order[:n])]
        for key in sorted(self.residents):
            if key not in engine.cache and engine.make_room(engine.expert_bytes, protect=self.residents, needed=key):
                engine.prefetch(key)

    def choose_victim(self, candidates, needed):
        victim = self._victim(candidates)
        if needed is not None:
            self._track(needed)  # about to be fetched: a transient from now on
        return victim

    def _track(self, key) -> None:
        """Keep ``key`` among the transients (a heap by recency, refreshed lazily as the cache touches them)."""
        if key not in self.residents and key not in self.transients:
            cache = self.engine.cache
            stamp = cache.recency(key) if key in cache else -1
            self.transients[key] = stamp
            heapq.heappush(self.transient_heap, (stamp, key))

    def _victim(self, candidates):
        """Transients not needed ahead least recently used first, then residents not needed ahead least popular
        first, then experts of layers the verification has passed; without scanning the cache: the transients sit
        in a heap by recency (stale entries refreshed or dropped as they surface), the residents are walked in
        popularity order, and each walk stops at the first fit. "Needed ahead": the draft routed to it in this
        window, at a layer the verification has not passed (a predicted expert of a passed layer is just a
        transient). A copy of the plan (``planning``) takes only the room of transients not needed ahead: a
        one-window prediction never displaces the calibration's popular residents, which no later step brings back."""
        predicted = self.window_draft if self.plan_on else {}  # spec-host: no draft-guided eviction
        cache, heap, aside = self.engine.cache, self.transient_heap, []
        passed = self.verify_layer if self.verifying else -1

        def unneeded(k):
            return k[0] < passed or k[1] not in predicted.get(k[0], ())

        best = None
        while heap:
            stamp, k = heap[0]
            if k not in cache or k in self.residents:
                heapq.heappop(heap)
                del self.transients[k]
            elif (now := cache.recency(k)) != stamp:
                heapq.heapreplace(heap, (now, k))
                self.transients[k] = now
            elif not unneeded(k):  # needed ahead: stays so until the window ends
                self.parked.append(heapq.heappop(heap))
            elif k in candidates:
                best = k
                break
            else:  # in use, on the link or protected: may be a candidate at the next call
                aside.append(heapq.heappop(heap))
        for item in aside:
            heapq.heappush(heap, item)
        if best is not None:  # least recently used first
            return best
        if self.planning:
            return None
        # residents the window does not need, least popular first; those evicted since (most of the walk) skipped by
        # a C-level dict lookup, not a Python check each
        for k in filter(cache.slots.__contains__, self.residents_by_unpopularity):
            if k in candidates and unneeded(k):
                return k
        untracked = next((k for k in candidates if unneeded(k)), None)  # e.g. landed since the last layer
        if untracked is not None:
            return untracked
        done = next((k for k in candidates if k[0] < self.verify_layer), None)  # layers the verification passed
        if done is not None:
            return done
        # all predicted and still ahead: give up the one needed last (latest layer, fewest draft tokens)
        return max(candidates, key=lambda k: (k[0], -predicted.get(k[0], {}).get(k[1], 0)))

    def on_copy_landed(self, key):
        super().on_copy_landed(key)
        self._track(key)
