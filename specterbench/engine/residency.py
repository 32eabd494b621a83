"""What a strategy may do to the device cache through the engine: prefetch, cancel, evict, make room, ask.

:class:`CacheControl` is the part of :class:`~specterbench.engine.engine.Engine` that queues copies into the
cache and takes them out. Every call is O(1) in the cache's size (``evictable()`` builds a list: O(cache)); the
eviction candidates a strategy receives are a live view (:class:`~specterbench.engine.cache.Candidates`).
"""

from __future__ import annotations

from typing import Collection

import torch

from specterbench.engine.cache import Candidates, ExpertKey, PrefetchResult, Slot
from specterbench.engine.store import expert_tensors
from specterbench.errors import EngineViolation


def slot_copy(dst, src, reuse_after=None):
    """The copy of one expert into its slot, run by the clock when the copy starts (on the measured CUDA clock:
    inside the copy stream's context). ``reuse_after``: the compute stream's event at the last eviction — the copy
    stream waits for it, so that no queued read of an evicted slot sees this copy's bytes; the slot's tensors are
    then marked as used by the copy stream, so that freeing them never hands their memory out while it is written."""

    def copy():
        if reuse_after is not None:  # pragma: no cover - needs CUDA (tests/engine/test_clock_cuda_fake.py fakes it)
            stream = torch.cuda.current_stream(dst[0].device)
            stream.wait_event(reuse_after)
        for d, w in zip(dst, src):  # the expert's tensors: two weights, or each packed weight's codes and metadata
            d.copy_(w, non_blocking=True)
        if reuse_after is not None:  # pragma: no cover - needs CUDA
            for d in dst:
                d.record_stream(stream)

    return copy


class CacheControl:
    """Mixed into the engine: needs ``cache``, ``pool`` (:class:`~specterbench.engine.pool.SlotPool`), ``clock``,
    ``store``, ``strategy``, ``stats``, ``device``, ``expert_bytes``, ``priced_expert_bytes``, ``pageable_copies``
    and ``swap_copies``."""

    def prefetch(self, key: ExpertKey, priority: float = 0.0) -> PrefetchResult:
        """Queue a copy of ``key`` into free bytes (never evicts: call :meth:`make_room` first). Higher
        ``priority`` starts earlier (ties in issue order); see :mod:`specterbench.strategy`."""
        self._check_key("prefetch", key)
        slot = self.cache.get(key)
        if slot is not None:
            return PrefetchResult.CACHED if self.clock.ready(slot.transfer) else PrefetchResult.IN_FLIGHT
        if self.cache.free_bytes < self.expert_bytes:
            return PrefetchResult.NO_ROOM
        self._fetch(key, priority, prefetched=True, protect=())
        return PrefetchResult.QUEUED

    def cancel(self, key: ExpertKey) -> bool:
        """Drop the queued copy of ``key`` and its entry (its bytes are free again). False when ``key`` is not
        cached or its copy has started (then wait for it, or evict it once it has landed)."""
        slot = self.cache.get(key)
        if slot is None or key == self.cache.in_use or not self.clock.cancel(slot.transfer):
            return False
        self.stats.prefetch_cancelled += 1
        self._unledger(slot)
        self._drop(key)
        slot.transfer.copy = None  # the scheduler dropped its copy; the slot went back to the pool
        return True

    def evict(self, key: ExpertKey) -> None:
        """Drop a cached expert; a copy not yet started is cancelled, one on the link cannot be evicted, and one the
        running layer is routed to cannot be evicted before the layer has computed it (from ``before_layer``,
        ``on_miss`` or ``place_miss``)."""
        slot = self.cache.get(key)
        if slot is not None and self._routed_guard and key in self._pending and key != self.cache.in_use:
            raise EngineViolation(f"evicting expert {key}, which the running layer is routed to and has not computed "
                                  f"yet, is refused (spare the layer's experts, engine.routing.experts, or evict "
                                  f"from after_layer)")
        if slot is None:
            raise EngineViolation(f"expert {key} is not cached, so it cannot be evicted")
        if not self.clock.ready(slot.transfer):
            if not self.clock.cancel(slot.transfer):
                raise EngineViolation(f"expert {key} is still being copied and cannot be evicted until it lands")
            self.stats.prefetch_cancelled += 1
            self._unledger(slot)
            slot.weights = slot.transfer.copy = None
        else:
            if slot.prefetched and not slot.used:
                self.stats.prefetch_wasted += 1
            if self.swap_copies:
                self._write_back(key, slot)
        self._drop(key)

    def _write_back(self, key: ExpertKey, slot: Slot) -> None:
        """Swap copies (``engine.use_swap_copies``): the evicted expert goes device→host into its store tensors
        before its slot is given back, on the compute stream (after every read of the slot queued there, before the
        copy that reuses it), as Mixtral-Offloading's ``ExpertCache._swap`` copies the evicted expert into a spare
        pinned host buffer that becomes its host copy. The values are the ones fetched, so the store is unchanged in
        value — a later fetch of ``key`` copies what this wrote."""
        src = expert_tensors(slot.weights)

        def copy():
            for d, w in zip(self.store.tensors(key), src):  # 16-bit weights, or each packed weight's parts
                d.copy_(w, non_blocking=True)

        self.clock.copy_on_compute(key, self.priced_expert_bytes, copy, to_host=True)
        self.stats.d2h_bytes += self.store.expert_bytes

    def _check_key(self, call: str, key) -> None:
        """A key that names no expert of this model is a named error, not a KeyError from the store."""
        try:
            layer, expert = key
            ok = 0 <= int(layer) < self.num_layers and 0 <= int(expert) < self.num_experts
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise EngineViolation(f"{call}({key!r}): no such expert; keys are (moe_layer, expert) with moe_layer in "
                                  f"0..{self.num_layers - 1} and expert in 0..{self.num_experts - 1}")

    def candidates(self, protect: Collection[ExpertKey] = ()) -> Candidates:
        """Cached experts that may be evicted now (not in use, not on the link, not in ``protect``), least
        recently used first: a live view (see :class:`~specterbench.engine.cache.Candidates`)."""
        excluded = set(self.cache.busy)
        if self.cache.in_use is not None:
            excluded.add(self.cache.in_use)
        for t in self.clock.in_flight():
            excluded.add(t.key)
        return Candidates(self.cache, excluded, protect)  # ``protect`` read in place (a set), not copied

    def evictable(self) -> list[ExpertKey]:
        """Cached experts that may be evicted now, least recently used first (a list: O(cache))."""
        return list(self.candidates())

    def make_room(self, nbytes: int, protect=(), needed: ExpertKey | None = None, force: bool = False) -> bool:
        """Evict the strategy's choices until ``nbytes`` are free. False when nothing more may be evicted, or
        when the strategy declines (``choose_victim`` returned None) and ``force`` is not set; with ``force``
        the least recently used candidate goes, so that a forward always makes progress. When only copies on
        the link stand in the way, the host waits for the first to land (never spinning)."""
        cache = self.cache
        while cache.free_bytes < nbytes:
            candidates = self.candidates(protect)
            if not candidates:
                landing = [t for t in self.clock.in_flight() if t.key not in protect and t.key in cache]
                if not landing:
                    return False
                self.clock.wait_landed(landing[0])
                continue
            victim = self.strategy.choose_victim(candidates, needed)
            if victim is None:
                if not force:
                    return False
                victim = candidates[0]
            if victim not in candidates:
                raise EngineViolation(f"strategy {self.strategy.name!r} chose {victim} to evict, which is not "
                                      f"evictable now (in use, mid-copy, protected or not cached)")
            self.evict(victim)
        return True

    def link_bytes_per_s(self) -> float | None:
        """The link bandwidth measured from copies that have moved so far (None before the first; the profile's
        figure: ``engine.costs.link_bytes_per_s()``)."""
        t = self.clock.totals
        return t.link_bytes / t.link_busy_s if t.link_busy_s > 0 else None

    def expected_arrival(self, key: ExpertKey) -> float | None:
        """Clock time (seconds, ``clock.now()``'s scale) when ``key``'s copy lands — in the past once landed;
        for a queued copy, if nothing outranks it later. None when ``key`` is not cached."""
        slot = self.cache.get(key)
        return None if slot is None else self.clock.expected_arrival(slot.transfer)

    def landed(self, key: ExpertKey) -> bool:
        """Whether ``key`` is cached and its copy has landed."""
        slot = self.cache.get(key)
        return slot is not None and self.clock.ready(slot.transfer)

    def wait_for(self, keys) -> None:
        """A barrier: the compute stream waits until every cached one of ``keys`` has landed (queued copies
        among them become demand fetches)."""
        for key in keys:
            slot = self.cache.get(key)
            if slot is not None:
                self.clock.wait(slot.transfer)

    def _fetch(self, key: ExpertKey, priority: float, *, prefetched: bool, protect, force=False) -> Slot | None:
        if not self.make_room(self.expert_bytes, protect=protect, needed=key, force=force):
            return None
        pageable = self.pageable_copies
        src = self.store.pageable(key) if pageable else self.store.weights[key]
        pool = self.pool
        slot = Slot(key, self.expert_bytes, None, None, prefetched)
        if not pool.free:  # the cache's capacity grew past the pool (or a strategy changed it behind our back)
            pool.grow(max(pool.slots + 1, self.cache.capacity_bytes // self.expert_bytes))
        slot.index = pool.take(key, slot)
        slot.weights = pool.weights(slot.index)  # views of the pool's rows: (gate_up [2I, H], down [H, I]) or packed

        def copy(i=slot.index):  # run by the clock when the copy starts (measured) or at once (modeled)
            # the pool's rows now (a grown pool re-points them), after the slot's previous readers on the compute
            # stream are done (the event recorded when it was freed)
            slot_copy(expert_tensors(slot.weights), expert_tensors(src), pool.reuse_event(i))()

        def copy_pageable():  # on the compute stream, which has passed every read of the slot: blocking copies
            for d, w in zip(expert_tensors(slot.weights), expert_tensors(src)):  # 16-bit weights or packed parts
                d.copy_(w)

        def copy_swap():  # on the compute stream after the victim's write-back: non-blocking, from pinned memory
            for d, w in zip(expert_tensors(slot.weights), expert_tensors(src)):
                d.copy_(w, non_blocking=True)

        try:
            self.cache.insert(slot)
        except Exception:
            pool.release(key, slot.index)
            raise
        if pageable:  # accelerate's path: tensor by tensor, synchronous, the compute stream waits
            slot.transfer = self.clock.copy_sync(key, self.priced_expert_bytes, copy_pageable)
        elif self.swap_copies:  # Mixtral-Offloading's path: on the compute stream, serial with compute
            slot.transfer = self.clock.copy_on_compute(key, self.priced_expert_bytes, copy_swap)
        else:
            slot.transfer = self.clock.issue(key, self.priced_expert_bytes, priority, copy)
        moved = self.store.expert_bytes  # the link ledger: what crosses the link (the cache charges expert_bytes)
        self.stats.h2d_bytes += moved
        if prefetched:
            self.stats.prefetch_issued += 1
            self.stats.prefetch_bytes += moved
        else:
            self.stats.demand_bytes += moved
        return slot

    def _drop(self, key: ExpertKey) -> None:
        """Take ``key`` out of the cache and give its pool slot back."""
        slot = self.cache.remove(key)
        self.pool.release(key, slot.index)

    def _unledger(self, slot: Slot) -> None:
        moved = self.store.expert_bytes
        self.stats.h2d_bytes -= moved
        if slot.prefetched:
            self.stats.prefetch_bytes -= moved
        else:
            self.stats.demand_bytes -= moved
