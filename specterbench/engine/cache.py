"""The device expert cache: a byte budget, enforced on every insertion, and the ledger of what it holds.

Layout: **one byte pool** shared by every MoE layer (not fixed slots per layer). An entry is one expert,
``(moe_layer, expert)``, of ``engine.expert_bytes`` bytes; the cache holds at most ``capacity_bytes`` of them.
Entries are kept in least-recently-used order (oldest first), globally and per layer: ``keys()`` and
``layer_keys(layer)`` read them, ``layer_count(layer)`` counts a layer's entries in O(1). A strategy that wants
per-layer quotas (the ``lru`` baseline: mixtral-offloading's per-layer caches) builds them on these views.

Every operation is O(1) (``keys()`` and ``layer_keys()`` copy their view: O(entries returned)).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Sequence

from specterbench.errors import EngineViolation

ExpertKey = tuple[int, int]  # (moe_layer, expert)

# Where a missed expert runs (``Strategy.place_miss``).
FETCH = "fetch"  # copy its weights to the device and compute there (lossless)
ON_HOST = "host"  # compute on the host CPU with the host copy; activations cross the link (lossless)
SUBSTITUTE = "substitute"  # compute with the strategy's own device copy, e.g. 4-bit (lossy: set lossless=False)


class PrefetchResult(enum.Enum):
    """What ``engine.prefetch(key, priority)`` did. Truthy only for :attr:`QUEUED`."""

    QUEUED = "queued"  # a copy was queued; the expert now holds a cache entry (its bytes are charged)
    CACHED = "cached"  # already cached and landed: nothing to do
    IN_FLIGHT = "in flight"  # already cached, its copy is queued or on the link
    NO_ROOM = "no room"  # not enough free bytes: make room first (``engine.make_room``), then prefetch

    def __bool__(self) -> bool:
        return self is PrefetchResult.QUEUED


@dataclass(slots=True, eq=False)
class Slot:
    key: ExpertKey
    nbytes: int
    weights: Any  # (gate_up [2I, H], down [H, I]) on the device (filled when the copy runs)
    transfer: Any  # the clock's Transfer that brings it in
    prefetched: bool  # brought in ahead of need (by a strategy), not by a miss
    used: bool = False
    index: int = -1  # its slot in the engine's slot pool


class DeviceCache:
    """Entries for expert weights on the device, in least-recently-used order (oldest first).

    The cache never holds more than ``capacity_bytes``; an insertion that would exceed it, or an eviction of
    the expert being computed, raises :class:`EngineViolation` — the engine's guarantee of iso-memory.
    """

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = int(capacity_bytes)
        self.slots: OrderedDict[ExpertKey, Slot] = OrderedDict()
        self._layers: dict[int, OrderedDict[ExpertKey, Slot]] = {}
        self._stamp: dict[ExpertKey, int] = {}
        self._clock = 0
        self.used_bytes = 0
        self.peak_bytes = 0
        self.in_use: ExpertKey | None = None
        self.busy: set[ExpertKey] = set()  # experts acquired for the grouped op being assembled: not evictable

    def __contains__(self, key: ExpertKey) -> bool:
        return key in self.slots

    def cached(self, keys: set) -> set:
        """The members of ``keys`` (a set) that are cached: one intersection in C, whichever side is smaller."""
        return keys & self.slots.keys()

    def __len__(self) -> int:
        return len(self.slots)

    def get(self, key: ExpertKey) -> Slot | None:
        return self.slots.get(key)

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def keys(self) -> list[ExpertKey]:
        """Cached experts, least recently used first (a copy: O(entries))."""
        return list(self.slots)

    def layer_keys(self, layer: int) -> list[ExpertKey]:
        """Cached experts of one MoE ``layer``, least recently used first."""
        return list(self._layers.get(layer, ()))

    def iter_layer(self, layer: int) -> Iterator[ExpertKey]:
        """Like :meth:`layer_keys` without the copy (do not evict while iterating)."""
        return iter(self._layers.get(layer, ()))

    def layer_count(self, layer: int) -> int:
        """Entries of one MoE ``layer``: O(1)."""
        return len(self._layers.get(layer, ()))

    def recency(self, key: ExpertKey) -> int:
        """When ``key`` was last inserted or used, as an increasing counter: a smaller value is less recent."""
        return self._stamp[key]

    def touch(self, key: ExpertKey) -> None:
        self.slots.move_to_end(key)
        self._layers[key[0]].move_to_end(key)
        self._clock += 1
        self._stamp[key] = self._clock

    def insert(self, slot: Slot) -> None:
        if slot.key in self.slots:
            raise EngineViolation(f"expert {slot.key} is already cached")
        if self.used_bytes + slot.nbytes > self.capacity_bytes:
            raise EngineViolation(
                f"inserting expert {slot.key} would hold {self.used_bytes + slot.nbytes} bytes, over the budget of "
                f"{self.capacity_bytes}; evict first")
        self.slots[slot.key] = slot
        self._layers.setdefault(slot.key[0], OrderedDict())[slot.key] = slot
        self._clock += 1
        self._stamp[slot.key] = self._clock
        self.used_bytes += slot.nbytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def remove(self, key: ExpertKey) -> Slot:
        if key == self.in_use or key in self.busy:
            raise EngineViolation(f"expert {key} is in use by the layer being computed and cannot be evicted")
        slot = self.slots.pop(key, None)
        if slot is None:
            raise EngineViolation(f"expert {key} is not cached, so it cannot be evicted")
        del self._layers[key[0]][key]
        del self._stamp[key]
        self.used_bytes -= slot.nbytes
        return slot


class Candidates(Sequence):
    """The experts that may be evicted now, least recently used first: a live view, not a copy.

    ``excluded``: what the engine holds back now (in use, busy, on the link); ``protect``: the caller's set, read in
    place, never copied (a planner protects thousands of predicted experts, and make_room builds a view per
    eviction). ``key in candidates`` costs O(1); ``len`` and ``bool`` O(excluded + protect) at most; iterating
    costs what it yields, so ``candidates[0]`` or a loop that stops early stays cheap in a cache of thousands of
    entries; ``in_layer(layer)`` iterates one layer's candidates. Valid until the next eviction.
    """

    __slots__ = ("_cache", "_excluded", "_protect")

    def __init__(self, cache: DeviceCache, excluded: Collection[ExpertKey], protect: Collection[ExpertKey] = ()):
        self._cache, self._excluded = cache, excluded
        self._protect = protect if isinstance(protect, (set, frozenset)) else set(protect)

    def _out(self, key) -> bool:
        return key in self._excluded or key in self._protect

    def __iter__(self) -> Iterator[ExpertKey]:
        ex, pr = self._excluded, self._protect
        return (k for k in self._cache.slots if k not in ex and k not in pr)

    def in_layer(self, layer: int) -> Iterator[ExpertKey]:
        ex, pr = self._excluded, self._protect
        return (k for k in self._cache.iter_layer(layer) if k not in ex and k not in pr)

    def __contains__(self, key) -> bool:
        return key in self._cache.slots and not self._out(key)

    def __len__(self) -> int:
        slots, ex = self._cache.slots, self._excluded
        return (len(slots) - sum(1 for k in ex if k in slots)
                - sum(1 for k in self._protect if k in slots and k not in ex))

    def __bool__(self) -> bool:  # O(1) while entries outnumber exclusions
        return len(self._cache.slots) > len(self._excluded) + len(self._protect) or len(self) > 0

    def __getitem__(self, i):
        if isinstance(i, int) and i >= 0:
            for n, k in enumerate(self):
                if n == i:
                    return k
            raise IndexError("candidate index out of range")
        return list(self)[i]

    def __add__(self, other) -> list:
        return list(self) + list(other)

    def __radd__(self, other) -> list:
        return list(other) + list(self)

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, Candidates)) else NotImplemented

    def __repr__(self) -> str:
        return f"Candidates({list(self)!r})"
