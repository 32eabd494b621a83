"""The bookkeeping on every expert access: the device cache and the modeled clock's timeline."""

from __future__ import annotations

import pytest

from specterbench.engine.cache import DeviceCache, Slot
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_profile
from specterbench.engine.scheduler import DEMAND_PRIORITY

LAYERS, EXPERTS, TOP_K = 32, 8, 2  # Mixtral-8x7B's shape
EXPERT_BYTES = 1000
KEYS = [(layer, e) for layer in range(LAYERS) for e in range(EXPERTS)]


def _full_cache(fraction: float = 0.5) -> DeviceCache:
    cache = DeviceCache(int(fraction * len(KEYS)) * EXPERT_BYTES)
    for key in KEYS[: int(fraction * len(KEYS))]:
        cache.insert(Slot(key, EXPERT_BYTES, None, None, prefetched=False))
    return cache


def test_cache_lookup(benchmark):
    """What the engine does per routed expert: membership, get, touch (half the lookups miss)."""
    cache = _full_cache()

    def lookups():
        hits = 0
        for key in KEYS:
            if key in cache:
                cache.get(key)
                cache.touch(key)
                hits += 1
        return hits

    assert benchmark.pedantic(lookups, rounds=200, iterations=10, warmup_rounds=20) == len(KEYS) // 2
    benchmark.extra_info["lookups_per_round"] = len(KEYS)


def test_cache_insert_evict(benchmark):
    """Fill a cache and empty it again, oldest first: insert and remove with the budget check."""
    cache = DeviceCache(len(KEYS) * EXPERT_BYTES)
    slots = [Slot(key, EXPERT_BYTES, None, None, prefetched=True) for key in KEYS]

    def churn():
        for slot in slots:
            cache.insert(slot)
        for key in cache.keys():
            cache.remove(key)

    benchmark.pedantic(churn, rounds=200, iterations=5, warmup_rounds=20)
    assert cache.used_bytes == 0
    benchmark.extra_info["slots_per_round"] = len(KEYS)


@pytest.mark.parametrize("profile", [default_profile()], ids=lambda p: p.name)
def test_modeled_clock_layer(benchmark, profile):
    """One decode token's timeline at Mixtral's geometry: per layer, prefetch the next layer's experts, wait for
    this layer's, charge their compute (issue / expected_arrival / wait / compute)."""
    geometry = geometry_preset("mixtral")
    clock = ModeledClock(profile, geometry)
    nbytes = geometry.expert_bytes

    def token():
        pending = [clock.issue((0, e), nbytes, DEMAND_PRIORITY) for e in range(TOP_K)]
        for layer in range(LAYERS):
            ahead = [clock.issue((layer + 1, e), nbytes, -float(layer)) for e in range(TOP_K)]
            for t in pending:
                clock.expected_arrival(t)
            for t in pending:
                clock.wait(t)
                clock.compute(2 * geometry.expert_params, nbytes, launches=3)
            pending = ahead
        for t in pending:
            clock.wait(t)

    benchmark.pedantic(token, rounds=100, iterations=5, warmup_rounds=10)
    assert not clock.queued
    benchmark.extra_info["layers"] = LAYERS
