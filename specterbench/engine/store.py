"""The host expert store, built layer by layer so that host RAM holds each expert once.

Every routed expert lives in host memory as a pair of per-expert tensors, ``gate_up`` [2I, H] and ``down``
[H, I]. The store is built one MoE layer at a time from the model's fused tensors (``gate_up_proj``
[E, 2I, H], ``down_proj`` [E, H, I]):

- same dtype, no pinning (CPU runs): the per-expert tensors are *views* of the fused ones — no copy at all;
- another dtype: the layer is converted once and its original is freed before the next layer is touched;
- pinned (CUDA runs): a large fused tensor is page-locked *in place* (``cudaHostRegister``), so the views are
  pinned memory and nothing is copied; a small one (or one the driver refuses) is copied into pinned memory and
  its original freed. Registered memory is unregistered when the store goes away.

So the peak while building is the model's own bytes plus one layer, never the model twice (as it would be were the
store built while every original fused tensor is still alive).

``device_expert_bytes`` is what one expert really occupies on the device once copied there in the compute
dtype: the bytes a cache slot must be charged (an fp32 model's slots are twice its bf16 store's).

A quantized target (``spec``: ``--expert-bits`` < 16) is stored **packed**: each layer's experts are quantized from
the model's own values as the layer is taken over (:class:`~specterbench.engine.packing.PackedWeight`: packed codes
plus per-group scale and zero, what :meth:`~specterbench.engine.precision.Precision.expert_bytes` bills), stacked
per layer (``[E, ...]`` per tensor; pinned for CUDA) and the layer's 16-bit tensors freed before the next layer is
touched. An expert is then a pair of :class:`PackedWeight` over its rows of the stacks; copying its
:meth:`~specterbench.engine.packing.PackedWeight.parts` copies it, and its values exist only where it is computed
(dequantized into a reused scratch: :func:`specterbench.engine.moe_layer.expert_forward`).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from specterbench.engine.packing import PackedWeight

ExpertKey = tuple[int, int]  # (moe_layer, expert)

REGISTER_MIN_BYTES = 64 * 2**20  # smaller tensors may share pages with others (heap), so they are copied


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _clear_cuda_error() -> None:  # pragma: no cover - needs CUDA
    """Reset the CUDA runtime's last error after a refused registration, so that the next kernel-launch check of
    torch does not report it; uses the libcudart this process has loaded (found in /proc/self/maps)."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line}
    except OSError:
        return
    for path in paths:
        try:
            ctypes.CDLL(path).cudaGetLastError()
        except (OSError, AttributeError):
            continue


def _register_in_place(tensors: list[torch.Tensor]) -> list[torch.Tensor]:  # pragma: no cover - needs CUDA
    """Page-lock large tensors where they lie; returns the ones registered (to unregister later). Where the
    driver refuses (some sandboxes do), nothing is registered and the caller copies into pinned memory."""
    cudart = torch.cuda.cudart()
    done = []
    for t in tensors:
        if _nbytes(t) < REGISTER_MIN_BYTES:
            continue
        err = cudart.cudaHostRegister(t.data_ptr(), _nbytes(t), 0)
        if int(err) != 0:
            _clear_cuda_error()
            break  # one refusal: the driver will refuse the rest too
        done.append(t)
    return done


def _unregister(tensors: list[torch.Tensor]) -> None:  # pragma: no cover - needs CUDA
    cudart = torch.cuda.cudart()
    for t in tensors:
        cudart.cudaHostUnregister(t.data_ptr())


def _copy_to_pinned(t: torch.Tensor) -> torch.Tensor:  # pragma: no cover - needs CUDA
    return t.pin_memory()


def pin_layer(fused: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """A layer's fused tensors in pinned memory: large ones registered in place, the rest copied (the caller
    drops the unpinned originals). Returns ``(pinned tensors, the registered ones, how many were copied)``."""
    registered = _register_in_place(fused)
    out, copied = [], 0
    for t in fused:
        if any(t is r for r in registered):
            out.append(t)
        else:
            out.append(_copy_to_pinned(t))
            copied += 1
    return out, registered, copied


def expert_tensors(weights) -> tuple[torch.Tensor, ...]:
    """The tensors of one expert's ``(gate_up, down)``: the two tensors, or each packed weight's parts."""
    out = []
    for w in weights:
        out.extend((w,) if isinstance(w, torch.Tensor) else w.parts())
    return tuple(out)


class ExpertStore:
    """Host copies of every routed expert as per-expert tensors (pinned for CUDA), built layer by layer.

    ``blocks``: the model's MoE blocks, each with ``experts.gate_up_proj`` / ``experts.down_proj``; their fused
    tensors are taken over (the modules' parameters are released as each layer is done).
    ``dtype``: the store's dtype (bf16 by default: the bytes the link moves). ``device_dtype``: the dtype an
    expert has on the device (the model's compute dtype), which decides :attr:`device_expert_bytes`.
    """

    def __init__(self, blocks: list[nn.Module], dtype: torch.dtype, pin: bool,
                 device_dtype: torch.dtype | None = None, spec=None):
        self.dtype = dtype
        self.spec = spec  # a QuantSpec: the experts are stored packed (None: 16-bit tensors)
        self.num_layers = len(blocks)
        self.num_experts = blocks[0].experts.gate_up_proj.shape[0]
        self.weights: dict[ExpertKey, tuple[torch.Tensor, torch.Tensor]] = {}
        self.pinned = pin
        self._pageable: dict[ExpertKey, tuple[torch.Tensor, ...]] = {}  # pageable copies of a pinned store's experts
        self.copied_layers = 0  # layers that needed a copy (dtype conversion or pinned copy)
        registered: list[torch.Tensor] = []
        for layer, block in enumerate(blocks):
            experts = block.experts
            fused, copied = [], False
            for name in ("gate_up_proj", "down_proj"):
                t = getattr(experts, name).detach()
                if spec is not None:  # quantized from the model's own values, not from a 16-bit copy of them
                    t, copied = t.to("cpu"), True
                elif t.device.type != "cpu" or t.dtype != dtype:
                    t, copied = t.to("cpu", dtype), True
                fused.append(t)
                setattr(experts, name, None)  # the module lets go: the store holds the only reference
            if spec is not None:
                self._pack_layer(layer, list(fused[0]), list(fused[1]))
                self.copied_layers += 1
                del fused
                continue
            if pin:
                fused, new, n_copied = pin_layer(fused)
                registered.extend(new)
                copied = copied or n_copied > 0
            self.copied_layers += copied
            gate_up, down = fused  # [E, 2I, H], [E, H, I]
            for e in range(gate_up.shape[0]):
                self.weights[(layer, e)] = (gate_up[e], down[e])  # contiguous views, no copy
            del fused, gate_up, down
        self.registered_bytes = sum(_nbytes(t) for t in registered)
        if registered:
            weakref.finalize(self, _unregister, registered)
        self.device_dtype = device_dtype or dtype
        self._measure()

    def _measure(self) -> None:
        gu, dn = self.weights[(0, 0)]
        self.shapes = (tuple(gu.shape), tuple(dn.shape))  # [2I, H], [H, I]
        if self.spec is not None:  # packed: the device holds (and a copy moves) exactly the stored tensors
            self.expert_bytes = self.device_expert_bytes = sum(_nbytes(t) for t in self.tensors((0, 0)))
            return
        self.expert_bytes = _nbytes(gu) + _nbytes(dn)
        itemsize = torch.empty((), dtype=self.device_dtype).element_size()
        self.device_expert_bytes = (gu.numel() + dn.numel()) * itemsize

    def _pack_layer(self, layer: int, gate_ups: list[torch.Tensor], downs: list[torch.Tensor]) -> None:
        """Quantize one layer's experts with :attr:`spec` and keep them as rows of per-layer stacks of their packed
        tensors (pinned for CUDA); ``gate_ups``/``downs``: each expert's weight, any float dtype."""

        stacks, templates = [], []
        for weights in (gate_ups, downs):
            packed = [PackedWeight(w.float(), self.spec, torch.float32, kernels=False) for w in weights]
            parts = [torch.stack(ts) for ts in zip(*(p.parts() for p in packed))]  # each [E, ...]
            templates.append(packed[0])  # its layout (its own tensors go when this layer is done)
            del packed
            if self.pinned:  # pragma: no cover - needs CUDA
                parts = [_copy_to_pinned(t) for t in parts]
            stacks.append(parts)
        for e in range(len(gate_ups)):
            self.weights[(layer, e)] = tuple(t.over([p[e] for p in parts]) for t, parts in zip(templates, stacks))

    def pack(self, spec) -> None:
        """Store every expert packed with ``spec`` from the 16-bit tensors held now, a layer at a time (each layer's
        16-bit tensors are freed before the next is packed). A store already packed with ``spec`` is left alone;
        a store whose memory was page-locked in place cannot be repacked (build it with the spec instead)."""
        if spec == self.spec:
            return
        if self.spec is not None or self.registered_bytes:
            raise ValueError("this expert store cannot be repacked: build the engine with the target's precision")
        self.spec = spec
        for layer in range(self.num_layers):
            pairs = [self.weights[(layer, e)] for e in range(self.num_experts)]
            self._pack_layer(layer, [gu for gu, _ in pairs], [dn for _, dn in pairs])
            del pairs
        self._measure()

    @property
    def packed(self) -> bool:
        return self.spec is not None

    def tensors(self, key: ExpertKey) -> tuple[torch.Tensor, ...]:
        """Every tensor that holds expert ``key``: a copy of these is a copy of the expert (16-bit: its two weights;
        packed: each weight's codes and group metadata)."""
        return expert_tensors(self.weights[key])

    def values(self, key: ExpertKey, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``key``'s weights as dense tensors of ``dtype`` (default the store's; new tensors when packed: the
        values a quantized target computes with, e.g. for a draft to quantize)."""
        dtype = dtype or self.dtype
        if self.spec is None:
            return tuple(w.to(dtype) for w in self.weights[key])
        return tuple(w.dequantize(dtype) for w in self.weights[key])

    def pageable(self, key: ExpertKey) -> tuple:
        """``key``'s weights in pageable (ordinary, unpinned) host memory, the source of a synchronous pageable copy
        (``on-demand.pageable``: what accelerate's offload hooks copy from). Unpinned stores hand out their own
        tensors; a pinned store makes a pageable copy of an expert the first time it is asked (host memory grows by
        the experts copied that way)."""
        if not self.pinned:
            return self.weights[key]
        if key not in self._pageable:
            self._pageable[key] = tuple(torch.empty(t.shape, dtype=t.dtype).copy_(t) for t in self.tensors(key))
        return self._pageable[key]

    @property
    def total_params(self) -> int:
        """Weights of every routed expert (a quantized copy's bytes over ``2 * total_params`` is its ratio over
        16-bit, the cost model's unit whatever the target's precision)."""
        (a, b), (c, d) = self.shapes
        return (a * b + c * d) * len(self.weights)

    @property
    def total_bytes(self) -> int:
        return self.expert_bytes * len(self.weights)

    @property
    def total_device_bytes(self) -> int:
        """All experts' bytes as they would sit on the device (compute dtype)."""
        return self.device_expert_bytes * len(self.weights)
