"""Quantized copies of the routed experts: the self-draft's experts (and lossy fallbacks).

``BitsAndBytesConfig`` only quantizes ``nn.Linear``; fused expert tensors are quantized here per expert slice
(``gate_up`` [2I, H] and ``down`` [H, I]). Three quantizers:

- ``bnb``: bitsandbytes blockwise nf4/fp4 (4-bit) or int8 (8-bit), fp32 absmax per block;
- ``int``: the project's own asymmetric round-to-nearest per group along the input dimension, 2/3/4/8 bits, an
  fp16 scale and a ``bits``-bit zero point per group — at 4 bits and group 128 this is GPTQ INT4 g128's layout
  (4 + 20/128 ≈ 4.16 bits per weight), the artifact's draft;
- ``hqq``: Half-Quadratic Quantization (the ``hqq`` package, optional), 2/3/4/8 bits, fp16 scale and zero per group.

Bytes are the packed bytes plus the per-group metadata, known before quantizing (a budget can be checked
first), and are charged to the strategy that keeps the copies on the device. The modeled clock prices the
draft's routed experts of one layer as one fused low-bit MoE kernel (as the artifact runs them).

:class:`QuantizedDense` is the draft's optional low-bit copy of everything else it reads per token — attention,
shared experts, dense MLPs and the output head (every ``nn.Linear`` of the model; routers and the embedding
stay shared): swapped in for the draft's forward (``engine.forward(..., dense=copy)``) and priced at its bits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specterbench.engine.routing import group_tokens
from specterbench.errors import UsageError

QUANTIZERS = ("bnb", "int", "hqq")
SUPPORTED_BITS = {"bnb": (4, 8), "int": (2, 3, 4, 8), "hqq": (2, 3, 4, 8)}
SUPPORTED_4BIT_TYPES = ("nf4", "fp4")
DENSE_BITS = (16, 8, 4, 3)  # the draft's dense weights: 16 = shared with the target (no copy)
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
MAX_ERROR_SCALE = 1000.0  # the draft-fidelity calibration's largest scale on a quantization error


@dataclass(frozen=True, slots=True)
class QuantSpec:
    bits: int = 4
    quant_type: str = "nf4"  # bnb 4-bit only: nf4 | fp4
    blocksize: int = 64  # bnb block / int and hqq group size
    quantizer: str = "bnb"
    #: draft-fidelity calibration (issue 24): the draft quantizes ``W + (s−1)·(Q(W)−W)`` with this same format —
    #: real codes of the format that err more as ``s`` grows (about (s−1)× W's own rounding error from s ≈ 4; below
    #: that the points mostly keep their codes and the wider group ranges move the grid; draft_calibration.json
    #: records the realized RMS ratio); None: the model's calibration (``config.draft_error_scale``, from an
    #: embedded model's draft_calibration.json; 1.0 when it has none)
    error_scale: float | None = None
    #: a dense copy's only: the calibration of its output head (None: the model's ``config.draft_head_error_scale``)
    head_error_scale: float | None = None

    def __post_init__(self):
        if self.quantizer not in QUANTIZERS:
            raise UsageError(f"unknown quantizer {self.quantizer!r}; supported: {', '.join(QUANTIZERS)}")
        bits = SUPPORTED_BITS[self.quantizer]
        if self.bits not in bits:
            raise UsageError(f"unsupported draft bit width {self.bits} for quantizer {self.quantizer!r}; "
                             f"supported: {', '.join(map(str, bits))}")
        if self.quantizer == "bnb" and self.bits == 4 and self.quant_type not in SUPPORTED_4BIT_TYPES:
            raise UsageError(f"unsupported 4-bit type {self.quant_type!r}; supported: "
                             f"{', '.join(SUPPORTED_4BIT_TYPES)}")
        if self.blocksize not in BLOCKSIZES or (self.quantizer == "bnb" and self.blocksize < 64):
            raise UsageError(f"unsupported blocksize {self.blocksize}; use a power of two from "
                             f"{32 if self.quantizer != 'bnb' else 64} to 4096")
        for name in ("error_scale", "head_error_scale"):
            value = getattr(self, name)
            if value is not None and not 1.0 <= value <= MAX_ERROR_SCALE:
                raise UsageError(f"{name}={value} is out of range: use a scale on the draft's quantization error "
                                 f"from 1 (none) to {MAX_ERROR_SCALE:g}")

    #: the strategy options that choose a quantization
    OPTIONS = ("bits", "quant_type", "blocksize", "quantizer", "error_scale")

    @property
    def scale(self) -> float:
        """The error scale this spec quantizes with (1.0 while it is the model's and not yet resolved)."""
        return 1.0 if self.error_scale is None else self.error_scale

    def for_model(self, model) -> "QuantSpec":
        """This spec with the model's own calibration where it names none (:func:`model_error_scale`)."""
        if self.error_scale is not None:
            return self
        return dataclasses.replace(self, error_scale=model_error_scale(model))

    @classmethod
    def from_options(cls, options: dict, **defaults) -> "QuantSpec":
        """The spec named by a strategy's options (``--set specter.bits=4``); ``defaults`` (or the class
        defaults) elsewhere."""
        base = {**{f.name: f.default for f in dataclasses.fields(cls)}, **defaults}
        try:
            bits = int(options.get("bits", base["bits"]))
            blocksize = int(options.get("blocksize", base["blocksize"]))
        except (TypeError, ValueError):
            raise UsageError(f"bits and blocksize must be integers, got {options.get('bits')!r} and "
                             f"{options.get('blocksize')!r}") from None
        scale = options.get("error_scale", base["error_scale"])
        try:
            scale = None if scale is None else float(scale)
        except (TypeError, ValueError):
            raise UsageError(f"error_scale must be a number from 1 to {MAX_ERROR_SCALE:g}, got {scale!r}") from None
        return cls(bits=bits, quant_type=str(options.get("quant_type", base["quant_type"])), blocksize=blocksize,
                   quantizer=str(options.get("quantizer", base["quantizer"])), error_scale=scale)

    def label(self) -> str:
        if self.quantizer == "bnb":
            name = f"{self.quant_type if self.bits == 4 else 'int8'}/b{self.blocksize}"
        else:
            name = f"{self.quantizer}{self.bits}/g{self.blocksize}"
        return name + (f" calibrated ×{self.scale:g}" if self.scale != 1.0 else "")

    def tensor_bytes(self, n: int) -> int:
        """Device bytes of one weight of ``n`` values quantized with this spec (packed values + metadata)."""
        groups = -(-n // self.blocksize)
        if self.quantizer == "bnb":
            return (n * self.bits + 7) // 8 + groups * 4  # fp32 absmax per block
        if self.quantizer == "int":
            return (n * self.bits + 7) // 8 + (groups * (16 + self.bits) + 7) // 8  # fp16 scale, b-bit zero
        packed = -(-groups // 10) * self.blocksize * 4 if self.bits == 3 else (n * self.bits + 7) // 8
        return packed + groups * 4  # hqq: 3-bit packs ten values per int32; fp16 scale and zero per group

    def bits_per_weight(self, n: int = 1 << 20) -> float:
        return 8 * self.tensor_bytes(n) / n


def quantized_bytes(engine, spec: QuantSpec) -> int:
    """Device bytes of every routed expert quantized with ``spec``; equals :attr:`QuantizedExperts.nbytes`."""
    return sum(spec.tensor_bytes(w.numel()) for pair in engine.store.weights.values() for w in pair)


def _shared(engine, store: str, spec: QuantSpec, make):
    """The one copy per (engine, ``store``, spec), made by ``make(engine, spec)`` the first time; a parked copy
    comes back to the device."""
    copies = engine.__dict__.setdefault(store, {})
    if spec not in copies:
        copies[spec] = make(engine, spec)
    copies[spec].unpark()
    return copies[spec]


def shared_quantized(engine, spec: QuantSpec) -> "QuantizedExperts":
    """One quantized copy per (engine, spec), shared by the cells that use it (quantizing takes seconds); a
    parked copy comes back to the device. A spec without an error scale takes the model's calibration (the
    copy's ``spec`` says which)."""
    return _shared(engine, "_quantized_experts", spec.for_model(engine.model), QuantizedExperts)


def model_error_scale(model) -> float:
    """The draft-fidelity calibration a model carries on its routed experts (``config.draft_error_scale``; 1.0
    when none)."""
    return float(getattr(getattr(model, "config", None), "draft_error_scale", None) or 1.0)


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


def dense_spec(bits, blocksize: int = 64, head_error_scale=None) -> QuantSpec | None:
    """The spec of a draft's dense copy at ``bits`` (the project's int quantizer), None for 16 (no copy); a
    one-line UsageError for bits outside :data:`DENSE_BITS`."""
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
    return None if n == 16 else QuantSpec(bits=n, blocksize=blocksize, quantizer="int",
                                          head_error_scale=head_error_scale)


def dense_params(geometry) -> float:
    """Weights a draft's dense copy holds at ``geometry``: every layer's non-routed part but the routers (as
    the modeled clock reads them) and the output head."""
    g = geometry
    dense = (g.layers - g.moe_layers) * g.layer_dense_params(moe=False)
    moe = g.moe_layers * (g.layer_dense_params(moe=True) - g.hidden * g.num_experts)
    return g.layer_scale * (dense + moe) + g.vocab * g.hidden


def dense_quantized_bytes(engine, spec: QuantSpec | None) -> int:
    """Device bytes of a dense copy with ``spec`` in the engine's byte units: its share of the expert bytes at
    the priced geometry (a projection charges what the real model's copy would take of its budget)."""
    if spec is None:
        return 0
    g = engine.geometry
    real = dense_params(g) * spec.bits_per_weight() / 8
    return int(round(real / g.all_expert_bytes * engine.total_expert_bytes))


def dense_linears(model) -> list[nn.Linear]:
    """The linear layers a dense copy replaces: all but the tiny per-layer shared-expert gates."""
    return [m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and not name.endswith("shared_expert_gate")]


class QuantizedDense:
    """The draft's own low-bit copy of the dense weights; ``with copy:`` swaps it into the model (the target's
    weights come back on exit). ``bytes_ratio``: the copy's bytes per weight over 16-bit."""

    def __init__(self, engine, spec: QuantSpec):
        self.engine, self.spec = engine, spec
        self.nbytes = dense_quantized_bytes(engine, spec)
        self.bytes_ratio = spec.bits_per_weight() / 16
        pairs = dense_copy_specs(engine.model, spec)  # the output head at the model's head calibration
        self.head_error_scale = (spec.head_error_scale if spec.head_error_scale is not None
                                 else model_head_error_scale(engine.model))
        self.modules = [m for m, _ in pairs]
        self.weights = [nn.Parameter(roundtrip(m.weight.detach().float(), s).to(m.weight.dtype),
                                     requires_grad=False) for m, s in pairs]
        self._saved: list = []

    def __enter__(self):
        self._saved = [m._parameters["weight"] for m in self.modules]
        for m, w in zip(self.modules, self.weights):
            m._parameters["weight"] = w
        return self

    def __exit__(self, *exc):
        for m, w in zip(self.modules, self._saved):
            m._parameters["weight"] = w
        self._saved = []
        return False

    def park(self) -> None:
        if self.engine.device.type != "cpu":  # pragma: no cover - needs CUDA
            self.weights = [nn.Parameter(w.data.to("cpu"), requires_grad=False) for w in self.weights]

    def unpark(self) -> None:
        if self.engine.device.type != "cpu":  # pragma: no cover - needs CUDA
            self.weights = [nn.Parameter(w.data.to(self.engine.device), requires_grad=False) for w in self.weights]


def shared_dense(engine, spec: QuantSpec | None) -> QuantizedDense | None:
    """One dense copy per (engine, spec), shared by the cells that use it; None for no copy."""
    return None if spec is None else _shared(engine, "_quantized_dense", spec, QuantizedDense)


def draft_label(spec: QuantSpec, dense: QuantSpec | None = None, head_error_scale: float = 1.0) -> str:
    """``int3/g128``, or ``int3/g128 + dense int8/g64`` for a draft with its own dense copy (``(head calibrated
    ×h)`` when the copy's output head carries a calibration)."""
    head = f" (head calibrated ×{head_error_scale:g})" if dense and head_error_scale != 1.0 else ""
    return spec.label() + (f" + dense {dense.label()}{head}" if dense else "")


def park_unclaimed(engine, strategy=None) -> None:
    """Between cells (top of ``Engine.configure``): every shared quantized copy moves to host memory, so that
    no cell holds device bytes it is not charged for; the strategy that uses one brings it back through
    :func:`shared_quantized` in its ``attach`` (and is charged for it by its ``device_bytes``)."""
    for draft in (*engine.__dict__.get("_quantized_experts", {}).values(),
                  *engine.__dict__.get("_quantized_dense", {}).values()):
        draft.park()


def _int_roundtrip(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Asymmetric round-to-nearest per group of ``blocksize`` along the input dim; returns the dequantized
    weight (fp16 scale, integer zero point, as stored)."""
    rows, cols = w.shape
    g = spec.blocksize if cols % spec.blocksize == 0 else cols  # a row shorter than a group is one group
    x = w.float().reshape(rows, cols // g, g)  # [R, G, g]
    qmax = (1 << spec.bits) - 1
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / qmax).clamp_min(1e-8).half().float()
    zero = (-lo / scale).round().clamp(0, qmax)
    q = (x / scale + zero).round().clamp(0, qmax)
    return ((q - zero) * scale).reshape(rows, cols)


def _hqq_roundtrip(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    try:
        from hqq.core.quantize import Quantizer
    except ImportError:
        raise UsageError("quantizer 'hqq' needs the hqq package: pip install --no-deps hqq termcolor") from None
    g = spec.blocksize if w.numel() % spec.blocksize == 0 else w.shape[1]
    wq, meta = Quantizer.quantize(w.float(), nbits=spec.bits, group_size=g, optimize=True, axis=1,
                                  device=str(w.device), compute_dtype=torch.float32)
    meta["scale"], meta["zero"] = meta["scale"].half().float(), meta["zero"].half().float()  # stored in fp16
    return Quantizer.dequantize(wq, meta).reshape(w.shape)


def _to(t, device):  # pragma: no cover - needs CUDA
    """A dense tensor, or a bitsandbytes (packed, state) pair, on ``device``."""
    if isinstance(t, tuple):
        packed, state = t
        state.to(device)
        return packed.to(device), state
    return t.to(device)


def quantize(w: torch.Tensor, spec: QuantSpec):
    """bitsandbytes only: ``(packed, state, nbytes)`` for one 2-D weight."""
    import bitsandbytes.functional as bnbf

    if spec.bits == 4:
        packed, state = bnbf.quantize_4bit(w.contiguous(), blocksize=spec.blocksize, quant_type=spec.quant_type,
                                           compress_statistics=False)
    else:
        packed, state = bnbf.quantize_blockwise(w.contiguous(), blocksize=spec.blocksize)
    nbytes = packed.numel() * packed.element_size() + state.absmax.numel() * state.absmax.element_size()
    return packed, state, nbytes


def dequantize(packed, state, spec: QuantSpec) -> torch.Tensor:
    import bitsandbytes.functional as bnbf

    if spec.bits == 4:
        return bnbf.dequantize_4bit(packed, state)
    return bnbf.dequantize_blockwise(packed, state)


def error_scaled(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The weight a calibrated draft quantizes: ``w + (s−1)·(Q(w)−w)`` (``w`` itself at s = 1)."""
    if spec.scale == 1.0:
        return w
    w = w.float()
    return w + (spec.scale - 1.0) * (_roundtrip(w, spec) - w)


def roundtrip(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """``w`` quantized with ``spec`` (its error scale applied first) and dequantized back (the values the draft
    computes with)."""
    return _roundtrip(error_scaled(w, spec), spec)


def _roundtrip(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    if spec.quantizer == "bnb":
        packed, state, _ = quantize(w, spec)
        return dequantize(packed, state, spec)
    if spec.quantizer == "int":
        return _int_roundtrip(w, spec)
    return _hqq_roundtrip(w, spec)


class QuantizedExperts:
    """Every routed expert quantized and resident on the device; callable in place of the offloaded cache.

    On CUDA a bitsandbytes 4-bit draft keeps only the packed weights and computes with bitsandbytes' packed
    4-bit kernels (``matmul_4bit``: gemv on packed nibbles for one token), never a full 16-bit copy per call.
    Elsewhere the dequantized values are kept once (identical numbers, faster), while the bytes charged stay
    the packed ones. Each call records the experts it routed to, so a strategy can read the draft's routing.
    """

    def __init__(self, engine, spec: QuantSpec):
        self.engine = engine
        self.spec = spec
        self.packed_kernels = engine.device.type == "cuda" and spec.quantizer == "bnb" and spec.bits == 4
        self.packed: dict = {}
        self.dense: dict = {}
        self.nbytes = quantized_bytes(engine, spec)
        for key, pair in engine.store.weights.items():
            if self.packed_kernels:  # pragma: no cover - needs CUDA
                self.packed[key] = tuple(quantize(error_scaled(w.to(engine.device), spec), spec)[:2] for w in pair)
            else:
                self.dense[key] = tuple(roundtrip(w.to(engine.device).float(), spec).to(engine.compute_dtype)
                                        for w in pair)
        self.bytes_ratio = self.nbytes / engine.total_expert_bytes  # ≈ 0.28 nf4/b64, ≈ 0.26 int4/g128
        self.routing: list[tuple[int, list[int], list[int]]] = []  # (layer, experts, tokens per expert)

    def _move(self, device) -> None:
        if self.engine.device.type == "cpu":
            return  # host memory already: nothing to move
        for store in (self.packed, self.dense):  # pragma: no cover - needs CUDA
            for key, pair in store.items():
                store[key] = tuple(_to(t, device) for t in pair)

    def park(self) -> None:
        """To host memory (no device bytes held)."""
        self._move("cpu")

    def unpark(self) -> None:
        self._move(self.engine.device)

    def weights(self, key):
        """Dense weights of one quantized expert (a substitute for a missed one)."""
        if self.packed_kernels:  # pragma: no cover - needs CUDA
            return tuple(dequantize(p, s, self.spec).to(self.engine.compute_dtype) for p, s in self.packed[key])
        return self.dense[key]

    def _linear(self, x, key, i):
        if self.packed_kernels:  # pragma: no cover - needs CUDA
            import bitsandbytes as bnb

            packed, state = self.packed[key][i]
            return bnb.matmul_4bit(x, packed.t(), quant_state=state)  # gemv on packed nibbles for one token
        return F.linear(x, self.dense[key][i])

    def __call__(self, layer, act_fn, hidden, top_k_index, top_k_weights):  # [T, H], [T, k], [T, k]
        groups = group_tokens(top_k_index, top_k_weights, self.engine.num_experts)
        self.routing.append((layer, groups.experts, groups.tokens_per_expert))
        out = torch.zeros_like(hidden)  # [T, H]
        for e, token_idx, scale in groups:  # token_idx [n], scale [n, 1]
            gate, up = self._linear(hidden[token_idx], (layer, e), 0).chunk(2, dim=-1)
            y = self._linear(act_fn(gate) * up, (layer, e), 1) * scale  # [n, H]
            out.index_add_(0, token_idx, y.to(out.dtype))
        self.charge_fused(groups.tokens_per_expert)
        return out

    def charge_fused(self, n_tokens) -> None:
        """Modeled cost of one layer's routed experts as one fused low-bit MoE kernel (the cost model's
        ``experts_fused``: every routed expert's FLOPs and quantized bytes, one expert's launches)."""
        engine = self.engine
        engine.charge(engine.clock.costs.experts_fused(n_tokens, self.bytes_ratio))
