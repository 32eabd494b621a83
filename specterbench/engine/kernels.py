"""What the engine launches: one description of its kernels, and the counter that checks it.

:class:`KernelCounts` says how many kernel-launching ops each part of a decode step issues — the model's own dense
part of a layer (attention, norms, rotary, router, shared experts), the per-forward part (embedding, masks, final
norm, head), the engine's grouped expert op, one expert of the per-expert path, the on-device sampler. The cost
model (:mod:`specterbench.engine.costs`) charges launches from it and nothing else; the expert figures are the
engine's own code (:data:`GROUPED_EXPERT_LAUNCHES`, :data:`PER_EXPERT_LAUNCHES`), the dense figures are counted on
the engine's own model once (:mod:`specterbench.engine.launch_count`), so a family whose attention issues more ops is
priced for them. ``tests/engine/test_kernels.py`` counts whole decode steps and holds the description to them.

:class:`LaunchCounter` is a ``TorchDispatchMode`` that counts aten ops which launch a kernel on a device: views and
bare allocations are not counted; a read of device values by the host (:func:`host_read`, the engine's only way to
learn a layer's experts) counts as one, as its copy would on a GPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: ops that allocate or re-describe memory without launching a kernel
_NOT_KERNELS = frozenset({aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
                          aten._unsafe_view.default,
                          aten.empty_like.default,
                          aten.new_empty_strided.default, aten.lift_fresh.default, aten.resize_.default,
                          aten.set_.source_Storage_storage_offset, aten.set_.source_Tensor})

#: the expert op of one MoE layer (:func:`specterbench.engine.moe_layer.grouped_experts`) by the slot pool's mode, at
#: most, whatever T and top-k — ``grouped``: slot lookup, sort, offsets, token rows, gather, two grouped GEMMs,
#: activation, gating product, un-permute, weighted combine; ``gathered``: slot lookup, two weight gathers, two batched
#: GEMMs, activation, gating product, weighted combine, the token rows' copy (T > 1) — plus the host read of the routing
EXPERT_OP_LAUNCHES = {"grouped": 11, "gathered": 9}
GROUPED_EXPERT_LAUNCHES = EXPERT_OP_LAUNCHES["gathered"]  # the default description's (CPU)
HOST_READ_LAUNCHES = 1
#: one expert through the per-expert path (the draft's experts, formats with no grouped kernel): gather its rows,
#: two GEMMs, activation, gating product, scale, scatter-add; plus, once per layer, the host read and the zeroed output
PER_EXPERT_LAUNCHES = 7
PER_EXPERT_LAYER_LAUNCHES = HOST_READ_LAUNCHES + 1
#: the on-device Gumbel-max sampler over one row of logits (:mod:`specterbench.engine.sampling`)
SAMPLE_LAUNCHES = 14


@dataclass(frozen=True, slots=True)
class KernelCounts:
    """Kernel-launching ops of each part of a forward (see the module docstring)."""

    moe_layer_dense: int = 40  # a MoE layer's non-routed part: attention, norms, rotary, router, shared experts
    moe_layer_captured: int = 0  # of those, the capturable pieces' (router, shared experts; engine.graphs)
    moe_layer_pieces: int = 0  # eager launches their replays add per MoE layer (input copy and replay, each)
    dense_layer: int = 36  # a dense (non-MoE) decoder layer
    forward: int = 20  # once per forward: embedding, rotary tables, masks, final norm, head, logits
    grouped_experts: int = GROUPED_EXPERT_LAUNCHES + HOST_READ_LAUNCHES
    per_expert: int = PER_EXPERT_LAUNCHES
    per_expert_layer: int = PER_EXPERT_LAYER_LAUNCHES
    sample: int = SAMPLE_LAUNCHES
    #: a quantized target's experts, run one by one from their packed slots (dequantized into the scratch, or a
    #: low-bit kernel): launches per expert and once per layer, counted on the engine's own path
    #: (:func:`specterbench.engine.moe_layer.count_packed_launches`); 0: the target's experts are 16-bit (grouped op)
    target_expert: int = 0
    target_layer: int = 0
    counted_on: str = "default (transformers Mixtral, counted)"


DEFAULT_KERNELS = KernelCounts()


class LaunchCounter(TorchDispatchMode):
    """Counts kernel-launching aten ops while active; ``sections`` attributes them to named parts."""

    active: "LaunchCounter | None" = None

    def __init__(self):
        super().__init__()
        self.total = 0
        self.ops: dict[str, int] = {}
        self.sections: dict[str, int] = {}
        self._section: list[str] = []
        self._paused = 0

    def __enter__(self):
        self._outer, LaunchCounter.active = LaunchCounter.active, self
        return super().__enter__()

    def __exit__(self, *exc):
        LaunchCounter.active = self._outer
        return super().__exit__(*exc)

    def add(self, name: str, n: int = 1) -> None:
        if self._paused:
            return
        self.total += n
        self.ops[name] = self.ops.get(name, 0) + n
        if self._section:
            self.sections[self._section[-1]] = self.sections.get(self._section[-1], 0) + n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (func.is_view or func in _NOT_KERNELS):
            self.add(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def section(self, name: str):
        self._section.append(name)
        try:
            yield
        finally:
            self._section.pop()

    @contextlib.contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1


def host_read(t: torch.Tensor) -> list:
    """``t.tolist()``: the host reads device values (one copy and sync on a GPU; counted as one launch)."""
    if LaunchCounter.active is not None:
        LaunchCounter.active.add("host_read")
    return t.tolist()


def section(name: str):
    """Attribute the ops of a block to ``name`` in the active counter (nothing when none counts)."""
    counter = LaunchCounter.active
    return counter.section(name) if counter is not None else contextlib.nullcontext()
