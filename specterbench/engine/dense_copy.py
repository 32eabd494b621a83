"""The draft's dense copy: its own low-bit copy of everything else a draft reads per token — attention, shared
experts, dense MLPs and the output head (every ``nn.Linear`` of the model; routers and the embedding stay shared).

:class:`QuantizedDense` packs them in the formats of :mod:`specterbench.engine.draft` (int8 per output channel on
torch's int8 weight-only matmul by default; ``int`` per group, dequantized, at 4 and 3 bits); ``with copy:`` swaps it
in for the draft's forward (``engine.forward(..., dense=copy)``), and the modeled clock prices it at its bits and
kernel. Its bytes are known before packing (:func:`dense_quantized_bytes`), charged to the strategy that keeps it,
and freed with the cell's other copies (:func:`~specterbench.engine.draft.release_drafts`).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from specterbench.engine import bitpack, packing
from specterbench.engine.draft import (
    QuantSpec,
    itemsize,
    kernel_name_for,
    price_kernel,
    priced_share,
    scratch_elems,
    shared,
)
from specterbench.engine.geometry import PRICED_DTYPE_BYTES
from specterbench.engine.quant_spec import MAX_ERROR_SCALE, SUPPORTED_BITS, error_scaled
from specterbench.errors import UsageError

DENSE_BITS = (16, 8, 4, 3)  # the draft's dense weights: 16 = shared with the target (no copy)
DENSE_QUANTIZERS = ("sym", "int")  # a dense copy's formats: int8 per channel (the int8 kernel's), int per group


def model_head_error_scale(model) -> float:
    """The draft-fidelity calibration a model carries on its draft's output head, applied where the draft has a
    dense copy (``config.draft_head_error_scale``; 1.0 when none)."""
    return float(getattr(getattr(model, "config", None), "draft_head_error_scale", None) or 1.0)


def dense_copy_specs(model, spec: QuantSpec) -> list[tuple[nn.Linear, QuantSpec]]:
    """Each linear layer a dense copy replaces with the spec it is quantized with: ``spec``, and for the output
    head ``spec`` at the model's head calibration (:func:`model_head_error_scale`)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_scale = spec.head_error_scale if spec.head_error_scale is not None else model_head_error_scale(model)
    head_spec = dataclasses.replace(spec, error_scale=spec.scale * head_scale)
    return [(m, head_spec if m is head else spec) for m in dense_linears(model)]


def dense_spec(bits, blocksize: int = 64, head_error_scale=None, quantizer=None) -> QuantSpec | None:
    """The spec of a draft's dense copy at ``bits``, None for 16 (no copy); a one-line UsageError for bits outside
    :data:`DENSE_BITS`. ``quantizer`` (None: the default of the width): ``sym`` at 8 bits — int8 codes and one scale
    per output channel, computed by torch's int8 weight-only matmul where it runs — and the project's ``int``
    (asymmetric, per group of ``blocksize``) at 4 and 3 bits; ``int`` at 8 bits names an int8/g64 copy,
    dequantized into a 16-bit scratch."""
    try:
        n = int(bits)
    except (TypeError, ValueError):
        n = None
    if n not in DENSE_BITS:
        raise UsageError(f"option dense_bits={bits} is invalid: use one of {', '.join(map(str, DENSE_BITS))} "
                         f"(16: the draft shares the target's attention, shared experts and head)")
    if head_error_scale is not None:
        try:
            head_error_scale = float(head_error_scale)
        except (TypeError, ValueError):
            raise UsageError(f"head_error_scale must be a number from 1 to {MAX_ERROR_SCALE:g}, got "
                             f"{head_error_scale!r}") from None
    if n == 16:
        return None
    quantizer = quantizer if quantizer is not None else ("sym" if n == 8 else "int")
    if quantizer not in DENSE_QUANTIZERS or n not in SUPPORTED_BITS[quantizer]:
        raise UsageError(f"option dense_quantizer={quantizer} is invalid at dense_bits={n}: use "
                         f"{' or '.join(q for q in DENSE_QUANTIZERS if n in SUPPORTED_BITS[q])}")
    try:
        blocksize = int(blocksize)
    except (TypeError, ValueError):
        raise UsageError(f"dense_blocksize must be an integer, got {blocksize!r}") from None
    return QuantSpec(bits=n, blocksize=blocksize, quantizer=quantizer, head_error_scale=head_error_scale)


def dense_params(geometry) -> float:
    """Weights a draft's dense copy holds at ``geometry``: every layer's non-routed part but the routers (as
    the modeled clock reads them) and the output head."""
    g = geometry
    dense = (g.layers - g.moe_layers) * g.layer_dense_params(moe=False)
    moe = g.moe_layers * (g.layer_dense_params(moe=True) - g.hidden * g.num_experts)
    return g.layer_scale * (dense + moe) + g.vocab * g.hidden


def dense_quantized_bytes(engine, spec: QuantSpec | None) -> int:
    """Device bytes of a dense copy with ``spec`` in the engine's byte units, its scratch included. At the model's
    own geometry: what the copy really stores. At a projection: its share of the expert bytes at the priced
    geometry (what the real model's copy would take of its budget), the scratch scaled alike."""
    if spec is None:
        return 0
    linears = dense_linears(engine.model)
    kernels = [kernel_name_for(tuple(m.weight.shape), spec, engine) for m in linears]
    real = sum(spec.weight_bytes(tuple(m.weight.shape), k, itemsize(engine.compute_dtype))
               for m, k in zip(linears, kernels))
    g = engine.geometry
    if g is engine.own_geometry or not real:
        return real + _dense_scratch_real_bytes(engine, spec)
    # at a projection the real model's linears run the kernel the stand-in's run (one for all, or dequantized)
    kernel = kernels[0] if len(set(kernels)) == 1 else "dequant"
    packed = (dense_params(g) * spec.bits_per_weight(kernel=kernel, cols=g.hidden) / 8 / g.all_expert_bytes
              * engine.total_expert_bytes)  # per-row metadata (``sym``) at rows of ``hidden`` inputs
    largest = g.hidden * max(g.heads * g.head_dim, g.dense_intermediate, g.shared_intermediate)  # one linear
    return int(round(packed)) + (0 if kernel != "dequant" else priced_share(engine, largest))


def dense_linears(model) -> list[nn.Linear]:
    """The linear layers a dense copy replaces: plain ``nn.Linear``s but the tiny per-layer shared-expert gates
    (a router that subclasses ``nn.Linear`` with its own forward, like PhiMoE's, stays the target's)."""
    return [m for name, m in model.named_modules()
            if type(m) is nn.Linear and "shared_expert_gate" not in name.split(".")]  # .piece: a captured one


def dense_scratch_rows(model) -> int:
    """Scratch elements of a dense copy: the largest linear but the output head, which is dequantized a block of
    rows at a time through the same buffer (so the scratch stays a small share of the copy)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    sizes = [m.weight.numel() for m in dense_linears(model) if m is not head]
    if not sizes:
        sizes = [m.weight.numel() for m in dense_linears(model)]
    return max(sizes, default=0)


def _dense_scratch_real_bytes(engine, spec: QuantSpec) -> int:
    linears = dense_linears(engine.model)
    cap = dense_scratch_rows(engine.model)
    elems = max((scratch_elems(tuple(m.weight.shape), spec, kernel_name_for(tuple(m.weight.shape), spec, engine),
                                rows=max(1, cap // m.weight.shape[1])) for m in linears), default=0)
    return elems * itemsize(engine.compute_dtype) + bitpack.unpack_table_bytes(spec.bits)


class QuantizedDense:
    """The draft's own low-bit copy of the dense weights, packed; ``with copy:`` routes every replaced linear layer
    through it (the target's layers come back on exit). ``bytes_ratio``: what its kernels read per weight over
    16-bit — the packed bytes, plus a 16-bit write and read of the scratch where a weight is dequantized."""

    def __init__(self, engine, spec: QuantSpec):
        self.engine, self.spec = engine, spec
        self.nbytes = dense_quantized_bytes(engine, spec)
        pairs = dense_copy_specs(engine.model, spec)  # the output head at the model's head calibration
        self.head_error_scale = (spec.head_error_scale if spec.head_error_scale is not None
                                 else model_head_error_scale(engine.model))
        self.modules = [m for m, _ in pairs]
        cap = dense_scratch_rows(engine.model)
        self.packed = [packing.PackedWeight(error_scaled(m.weight.detach(), s).to(m.weight.dtype), s,
                                            engine.compute_dtype) for m, s in pairs]
        elems = max((p.scratch_elems(rows=max(1, cap // p.shape[1])) for p in self.packed), default=0)
        self.scratch = torch.empty(elems, dtype=engine.compute_dtype, device=engine.device)
        weights = sum(p.shape[0] * p.shape[1] for p in self.packed) or 1
        # read at the priced dtype (an int4 kernel's table in 16-bit), over 16-bit weights
        stored = sum(8 * s.weight_bytes(p.shape, p.kernel, PRICED_DTYPE_BYTES)
                     for p, (_, s) in zip(self.packed, pairs)) / weights / 16
        dequant = sum(p.shape[0] * p.shape[1] for p in self.packed if p.kernel == "dequant") / weights
        self.kernels = sorted({p.kernel for p in self.packed})
        self.kernel = price_kernel(self.kernels, spec)  # how the modeled clock prices the kernels that read this copy
        self.bytes_ratio = stored + 2 * dequant  # a dequantized weight: 16-bit written to scratch and read back
        self._active = False
        self._bound = None  # each module's forward through this copy, made on the first entry

    def _forward(self, i: int, x: torch.Tensor) -> torch.Tensor:  # [..., C] -> [..., R]
        m = self.modules[i]
        shape = x.shape
        y = self.packed[i].linear(x.reshape(-1, shape[-1]), self.scratch, m.bias)
        return y.reshape(*shape[:-1], y.shape[-1])

    def _direct(self, i: int):
        """Module ``i``'s forward straight to its low-bit kernel (no bias, one op: :meth:`PackedWeight.kernel_op`), or
        None: the same op :meth:`_forward` reaches, without its per-call branching (a dense copy runs ~230 linears a
        draft step at DeepSeek-V3 geometry)."""
        op, rows = self.packed[i].kernel_op(), self.packed[i].shape[0]
        if op is None or self.modules[i].bias is not None:
            return None

        def forward(x):  # [..., C] -> [..., R]
            return op(x.reshape(-1, x.shape[-1]).contiguous()).view(*x.shape[:-1], rows)

        return forward

    def __enter__(self):
        # an instance attribute ``forward``: nn.Module.__call__ uses it. Written into each module's dict (what
        # nn.Module.__setattr__ ends in for a plain value) from forwards bound once: entering is per draft step, and
        # a __setattr__ and a new partial per linear (~230 at DeepSeek-V3 geometry) would be a share of its host time
        if self._bound is None:
            self._bound = [self._direct(i) or functools.partial(self._forward, i) for i in range(len(self.modules))]
        for m, forward in zip(self.modules, self._bound):
            m.__dict__["forward"] = forward
        self._active = True
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            m.__dict__.pop("forward", None)
        self._active = False
        return False

    def allocated_bytes(self) -> int:
        if not self.packed:
            return 0  # released
        held = sum(p.nbytes() for p in self.packed) + bitpack.storage_bytes(self.scratch)
        return held + bitpack.unpack_table_bytes(self.spec.bits)

    def release(self) -> None:
        if self._active:
            self.__exit__()
        self.packed, self.scratch, self._bound = [], torch.empty(0), None


def shared_dense(engine, spec: QuantSpec | None) -> QuantizedDense | None:
    """One dense copy per (engine, spec) within a cell; None for no copy."""
    return None if spec is None else shared(engine, "_quantized_dense", spec, QuantizedDense)
