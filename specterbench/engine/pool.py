"""The cache's slot pool on the device: every cached expert's weights in two stacked tensors.

``gate_up`` [S, 2I, H] and ``down`` [S, H, I] hold S slots; a cache entry owns one slot (its weights are views of
the pool's rows) and ``table`` [L, E] maps every (MoE layer, expert) to its slot, or to ``S`` when it holds none.
So a layer's experts run as **one grouped GEMM per projection over the pool** with the routed expert ids remapped
to slots on the device (:func:`specterbench.engine.moe_layer.grouped_experts`). ``mode`` says how: ``grouped``
(``F.grouped_mm``, on CUDA where it runs for the dtype and shapes) or ``gathered`` (each routing's slot weights
gathered into one batched GEMM: on the CPU, whose ``grouped_mm`` walks every group serially — O(slots) per call, and
a cache holds thousands — and wherever the grouped kernel is refused).

A quantized target's pool (``template``: the store's packed expert, :mod:`specterbench.engine.store`) runs in mode
``packed``: each weight's packed tensors (codes, per-group scale and zero) are stacked over the slots — ``gate_up``
and ``down`` are tuples of ``[S, ...]`` tensors, each slot's rows exactly the bytes the cache charges and a copy
moves — and a slot's weights are :class:`~specterbench.engine.packing.PackedWeight` views of its rows, computed one
expert at a time (no grouped kernel reads packed formats; :func:`specterbench.engine.moe_layer.run_on_device`).

The pool holds as many slots as the cache's byte budget allows; when a strategy releases device bytes to the cache,
the pool grows (a new pair of tensors, rows copied once, entries re-pointed). On CUDA a slot freed by an eviction
records an event on the compute stream; the copy that reuses it waits for that event on the copy stream, so an
evicted slot is never overwritten while queued kernels still read it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class SlotPool:
    """S slots of expert weights on ``device`` in ``dtype``, and the (layer, expert) → slot table."""

    def __init__(self, slots: int, gate_up_shape, down_shape, num_layers: int, num_experts: int,
                 dtype: torch.dtype, device: torch.device, template=None):
        self.dtype, self.device = dtype, torch.device(device)
        self.gate_up_shape, self.down_shape = tuple(gate_up_shape), tuple(down_shape)  # [2I, H], [H, I]
        self.template = template  # packed: one expert's (gate_up, down) PackedWeights, whose layout every slot holds
        self.slots = 0
        self.gate_up, self.down = self._allocate(0)  # [S, 2I, H], [S, H, I] (packed: tuples of [S, ...] parts)
        self.table = torch.zeros(num_layers, num_experts, dtype=torch.long, device=self.device)  # [L, E]
        # on the CPU the table's own memory, written in place: a tensor op per cache entry costs far more than the write
        self._cells = self.table.numpy() if self.device.type == "cpu" else None
        self.owner: list = []  # slot -> the cache entry (Slot) living in it, or None
        self.free: list[int] = []
        self.freed_event: dict[int, object] = {}  # CUDA: slot -> event after the last kernel that read it
        self.group_ends = torch.zeros(0, dtype=torch.long, device=self.device)  # [S]: 0..S-1
        self.grow(slots)
        if template is not None:
            self.mode = "packed"
        else:
            self.mode = "grouped" if self.device.type == "cuda" and _grouped_mm_works(self) else "gathered"

    def _allocate(self, slots: int):
        if self.template is None:
            return (torch.empty(slots, *self.gate_up_shape, dtype=self.dtype, device=self.device),
                    torch.empty(slots, *self.down_shape, dtype=self.dtype, device=self.device))
        return tuple(tuple(torch.empty(slots, *p.shape, dtype=p.dtype, device=self.device) for p in w.parts())
                     for w in self.template)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the pool holds (the slots' weights)."""
        if self.template is None:
            return (self.gate_up, self.down)
        return (*self.gate_up, *self.down)

    def allocated_bytes(self) -> int:
        """Storage bytes of the slots' tensors (the table aside): what the cache's slots really occupy."""
        return sum(t.untyped_storage().nbytes() for t in self.tensors())

    def grow(self, slots: int) -> None:
        """Hold at least ``slots`` slots (never shrinks); cached entries keep their rows."""
        if slots <= self.slots:
            return
        old = self.slots
        gate_up, down = self._allocate(slots)
        if old:
            if self.device.type == "cuda":  # pragma: no cover - needs CUDA
                torch.cuda.synchronize(self.device)  # copies already on the copy stream land in the old rows first
            new = (gate_up, down) if self.template is None else (*gate_up, *down)
            for dst, src in zip(new, self.tensors()):
                dst[:old].copy_(src)
        self.gate_up, self.down = gate_up, down
        self.table.masked_fill_(self.table == old, slots)  # the "no slot" mark moves to the new end
        if not old:
            self.table.fill_(slots)
        self.owner.extend([None] * (slots - old))
        self.free.extend(range(slots - 1, old - 1, -1))  # pop() hands out low slots first
        self.slots = slots
        self.group_ends = torch.arange(slots, device=self.device)
        for i, entry in enumerate(self.owner[:old]):
            if entry is not None:
                entry.weights = self.weights(i)

    def weights(self, i: int):
        """Views of slot ``i``: ``(gate_up [2I, H], down [H, I])`` (packed: PackedWeights over its rows)."""
        if self.template is not None:
            return tuple(w.over([p[i] for p in parts]) for w, parts in zip(self.template, (self.gate_up, self.down)))
        return self.gate_up[i], self.down[i]

    def take(self, key, entry) -> int:
        """A free slot for ``key`` (the cache checked the bytes first)."""
        i = self.free.pop()
        self.owner[i] = entry
        self._set(key, i)
        return i

    def _set(self, key, i: int) -> None:
        if self._cells is not None:
            self._cells[key] = i
        else:  # pragma: no cover - needs CUDA
            self.table[key] = i

    def release(self, key, i: int) -> None:
        """Slot ``i`` of ``key`` is free again (on CUDA once the kernels queued so far have read it)."""
        self.owner[i] = None
        self._set(key, self.slots)
        if self.device.type == "cuda":  # pragma: no cover - needs CUDA
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.freed_event[i] = event
        self.free.append(i)

    def reuse_event(self, i: int):
        """The compute stream's event recorded when slot ``i`` was last freed (None: none pending, or not CUDA): a
        copy into the slot waits for it on the copy stream (:func:`~specterbench.engine.residency.slot_copy`)."""
        return self.freed_event.pop(i, None)


def _grouped_mm_works(pool: SlotPool) -> bool:
    """Whether ``F.grouped_mm`` runs on this device, dtype and shapes (strides of 16-byte multiples; bf16 on some
    GPUs); otherwise the pool runs ``gathered``."""
    if not hasattr(F, "grouped_mm"):
        return False
    two_i, h = pool.gate_up_shape
    try:
        x = torch.zeros(2, h, dtype=pool.dtype, device=pool.device)
        w = torch.zeros(2, two_i, h, dtype=pool.dtype, device=pool.device)
        a = torch.zeros(2, two_i // 2, dtype=pool.dtype, device=pool.device)
        d = torch.zeros(2, h, two_i // 2, dtype=pool.dtype, device=pool.device)
        offs = torch.tensor([1, 2], dtype=torch.int32, device=pool.device)
        F.grouped_mm(x, w.transpose(1, 2), offs=offs)
        F.grouped_mm(a, d.transpose(1, 2), offs=offs)
        return True
    except (RuntimeError, TypeError, NotImplementedError):
        return False
