"""The device expert cache: a byte budget, enforced on every insertion, and the ledger of what it holds."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from specterbench.errors import EngineViolation

ExpertKey = tuple[int, int]  # (moe_layer, expert)


@dataclass(slots=True, eq=False)
class Slot:
    key: ExpertKey
    nbytes: int
    weights: Any  # (gate_up [2I, H], down [H, I]) on the device, or None while a modeled copy is queued
    transfer: Any  # the clock's Transfer that brought it in
    prefetched: bool  # brought in ahead of need (by a strategy), not by a miss
    used: bool = False


class DeviceCache:
    """Slots for expert weights on the device, in least-recently-used order (oldest first).

    The cache never holds more than ``capacity_bytes``; an insertion that would exceed it, or an eviction of
    the expert being computed, raises :class:`EngineViolation` — the engine's guarantee of iso-memory.
    """

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = int(capacity_bytes)
        self.slots: OrderedDict[ExpertKey, Slot] = OrderedDict()
        self.used_bytes = 0
        self.peak_bytes = 0
        self.in_use: ExpertKey | None = None

    def __contains__(self, key: ExpertKey) -> bool:
        return key in self.slots

    def __len__(self) -> int:
        return len(self.slots)

    def get(self, key: ExpertKey) -> Slot | None:
        return self.slots.get(key)

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def keys(self) -> list[ExpertKey]:
        """Cached experts, least recently used first."""
        return list(self.slots)

    def touch(self, key: ExpertKey) -> None:
        self.slots.move_to_end(key)

    def insert(self, slot: Slot) -> None:
        if slot.key in self.slots:
            raise EngineViolation(f"expert {slot.key} is already cached")
        if self.used_bytes + slot.nbytes > self.capacity_bytes:
            raise EngineViolation(
                f"inserting expert {slot.key} would hold {self.used_bytes + slot.nbytes} bytes, over the budget of "
                f"{self.capacity_bytes}; evict first")
        self.slots[slot.key] = slot
        self.used_bytes += slot.nbytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def remove(self, key: ExpertKey) -> Slot:
        if key == self.in_use:
            raise EngineViolation(f"expert {key} is in use by the layer being computed and cannot be evicted")
        slot = self.slots.pop(key, None)
        if slot is None:
            raise EngineViolation(f"expert {key} is not cached, so it cannot be evicted")
        self.used_bytes -= slot.nbytes
        return slot
