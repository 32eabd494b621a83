"""A quantized weight format: its spec (:class:`QuantSpec` — quantizer, bits, group, the draft-fidelity error
scale), what it stores per tensor (codes and group metadata, known before quantizing), and quantizing a tensor to it.
The quantizers are described in :mod:`specterbench.engine.draft`, which builds the self-draft's copies in them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from specterbench.engine import bitpack, packing
from specterbench.errors import UsageError

SUPPORTED_4BIT_TYPES = ("nf4", "fp4")
QUANTIZERS = ("bnb", "int", "hqq", "sym")


SUPPORTED_BITS = {"bnb": (4, 8), "int": (2, 3, 4, 8), "hqq": (2, 3, 4, 8), "sym": (8,)}


BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


MAX_ERROR_SCALE = 1000.0  # the draft-fidelity calibration's largest scale on a quantization error


@dataclass(frozen=True, slots=True)
class QuantSpec:
    bits: int = 4
    quant_type: str = "nf4"  # bnb 4-bit only: nf4 | fp4
    blocksize: int = 64  # bnb block / int and hqq group size
    quantizer: str = "bnb"
    #: draft-fidelity calibration: the draft quantizes ``W + (s−1)·(Q(W)−W)`` with this same format —
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
        elif self.quantizer == "sym":
            name = "int8/channel"
        else:
            name = f"{self.quantizer}{self.bits}/g{self.blocksize}"
        return name + (f" calibrated ×{self.scale:g}" if self.scale != 1.0 else "")

    def tensor_bytes(self, n: int, cols: int | None = None, kernel: str | None = None, table_itemsize: int = 2) -> int:
        """Device bytes of one weight of ``n`` values quantized with this spec (packed values + metadata); with
        ``cols`` (its input dimension) the groups are those :meth:`weight_bytes` stores. ``kernel="int4mm"``: the
        metadata as torch's int4 kernel keeps it (two values per group in the activations' dtype, ``table_itemsize``
        bytes each: 16-bit on the GPU the clock prices); ``kernel="int8mm"``: the per-channel scales in that dtype.
        ``sym`` without ``cols``: rows of ``blocksize`` values (an upper bound on its per-row scales)."""
        if cols is not None:
            return self.weight_bytes((n // cols, cols), kernel, table_itemsize)
        groups = -(-n // self.blocksize)
        if self.quantizer == "sym":
            return n + groups * (table_itemsize if kernel == "int8mm" else 2)
        if kernel == "int4mm":
            return (n * self.bits + 7) // 8 + groups * 2 * table_itemsize
        if self.quantizer == "bnb":
            return (n * self.bits + 7) // 8 + groups * 4  # fp32 absmax per block
        if self.quantizer == "int":
            return (n * self.bits + 7) // 8 + (groups * (16 + self.bits) + 7) // 8  # fp16 scale, b-bit zero
        packed = -(-groups // 10) * self.blocksize * 4 if self.bits == 3 else (n * self.bits + 7) // 8
        return packed + groups * 4  # hqq: 3-bit packs ten values per int32; fp16 scale and zero per group

    def groups(self, n: int, cols: int | None = None) -> int:
        """Quantization groups stored for a weight of ``n`` values with ``cols`` input columns (bnb: blocks over the
        flattened weight; int and hqq: per row, a row that is not a multiple of the group being one group)."""
        if cols is None or self.quantizer == "bnb":
            return -(-n // self.blocksize)
        rows = n // cols
        if self.quantizer == "sym":
            return rows
        return rows * (cols // self.blocksize if cols % self.blocksize == 0 else 1)

    def weight_bytes(self, shape, kernel: str | None = None, table_itemsize: int = 2) -> int:
        """Device bytes of one weight ``[R, C]`` as :mod:`~specterbench.engine.packing` stores it for ``kernel``:
        packed values plus per-group metadata, groups counted per row (a row shorter than a group is one group).
        Equals :meth:`tensor_bytes` whenever ``C`` is a multiple of the group (every real model)."""
        rows, cols = shape
        n = rows * cols
        if self.quantizer == "bnb":
            return self.tensor_bytes(n)  # blocks run over the flattened weight
        if self.quantizer == "sym":  # int8 codes plus one scale per row (fp16, or the int8 kernel's compute dtype)
            return n + rows * (table_itemsize if kernel == "int8mm" else 2)
        groups = rows * (cols // (self.blocksize if cols % self.blocksize == 0 else cols))
        if kernel == "int4mm":  # the kernel's (scale, zero) table replaces the fp16 scale and 4-bit zero
            return bitpack.packed_bytes(n, self.bits) + 2 * table_itemsize * groups
        if self.quantizer == "int":
            return bitpack.packed_bytes(n, self.bits) + 2 * groups + bitpack.packed_bytes(groups, self.bits)
        return bitpack.packed_bytes(n, self.bits) + 4 * groups  # hqq: fp16 scale and zero

    def bits_per_weight(self, n: int = 1 << 20, kernel: str | None = None, cols: int | None = None) -> float:
        """Stored bits per weight of a weight of ``n`` values (``cols``: its input dimension, where the metadata is
        per row)."""
        if cols is not None:
            n = n // cols * cols
        return 8 * self.tensor_bytes(n, cols=cols, kernel=kernel) / n


def model_error_scale(model) -> float:
    """The draft-fidelity calibration a model carries on its routed experts (``config.draft_error_scale``; 1.0
    when none)."""
    return float(getattr(getattr(model, "config", None), "draft_error_scale", None) or 1.0)


def draft_label(spec: QuantSpec, dense: QuantSpec | None = None, head_error_scale: float = 1.0) -> str:
    """``int3/g128``, or ``int3/g128 + dense int8/g64`` for a draft with its own dense copy (``(head calibrated
    ×h)`` when the copy's output head carries a calibration)."""
    head = f" (head calibrated ×{head_error_scale:g})" if dense and head_error_scale != 1.0 else ""
    return spec.label() + (f" + dense {dense.label()}{head}" if dense else "")


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


def pack(w: torch.Tensor, spec: QuantSpec, compute_dtype: torch.dtype | None = None,
         kernels: bool = True) -> packing.PackedWeight:
    """One 2-D weight quantized with ``spec`` and stored packed (any quantizer); ``compute_dtype`` (default
    ``w``'s) decides whether a low-bit kernel can run it."""
    return packing.PackedWeight(w, spec, compute_dtype or w.dtype, kernels=kernels)


def error_scaled(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The weight a calibrated draft quantizes: ``w + (s−1)·(Q(w)−w)`` (``w`` itself at s = 1)."""
    if spec.scale == 1.0:
        return w
    w = w.float()
    return w + (spec.scale - 1.0) * (_roundtrip(w, spec) - w)


def roundtrip(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """``w`` quantized with ``spec`` (its error scale applied first) and dequantized back, fp32 (the values the draft
    computes with)."""
    return _roundtrip(error_scaled(w, spec), spec)


def _roundtrip(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    if spec.quantizer == "bnb":
        packed, state, _ = quantize(w, spec)
        return dequantize(packed, state, spec).float()
    return pack(w.float(), spec, torch.float32, kernels=False).dequantize(torch.float32)
