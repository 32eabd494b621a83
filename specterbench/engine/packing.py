"""Packed low-bit weights: the codes and scales a draft really keeps, and the kernels that compute from them.

A :class:`PackedWeight` is one 2-D weight ``[R, C]`` quantized with a :class:`~specterbench.engine.draft.QuantSpec`
and stored as what its spec charges — packed codes plus per-group metadata, never a 16-bit copy:

- ``int``: codes packed at ``bits`` bits (8 values in ``bits`` bytes), an fp16 scale and a ``bits``-bit zero point
  per group of ``blocksize`` along the input dimension; value = ``(q - zero) · scale``;
- ``hqq``: the same packing, fp16 scale and fp16 (fractional) zero per group;
- ``bnb``: bitsandbytes' own packed nf4/fp4 nibbles or 8-bit codes with an fp32 absmax per block (one shared code
  table per format and device);
- ``sym``: int8 codes ``[R, C]`` (−127…127) and one scale per output channel (row), symmetric (no zero, no groups) —
  the layout torch's int8 weight-only matmul takes and gpt-fast's ``WeightOnlyInt8Linear`` keeps; value =
  ``q · scale``.

Computing ``x @ W.T`` (:meth:`PackedWeight.linear`) takes the low-bit kernel that exists for the format:

- ``int4`` with a group of 32–256: torch's int4 weight-only matmul (``aten._weight_int4pack_mm_for_cpu`` on the CPU,
  ``aten._weight_int4pack_mm`` on CUDA) on the kernel's own nibble layout and its per-group ``(scale, zero)`` table,
  built once when the weight is packed and stored in the compute dtype in place of the fp16 scale and 4-bit zero
  (two values per group in the compute dtype, what :meth:`QuantSpec.weight_bytes` bills for this kernel) — one
  launch per call, no scratch;
- ``sym`` int8: torch's int8 weight-only matmul (``aten._weight_int8pack_mm``) on the int8 codes and the per-channel
  scales, stored in the compute dtype as the op takes them — one launch per call, no scratch. torch 2.13's CPU build
  registers it for CPU (fp32, bf16, fp16 activations; checked by
  :func:`~specterbench.engine.lowbit_ops.int8_kernel_works`); torch's source also has MPS and CUDA implementations
  (``aten/src/ATen/native/cuda/int8mm.cu``: one thread per output element, activations and scales converted to fp32
  around it) — the modeled clock prices the layout at gpt-fast's int8 weight-only
  figure (:data:`~specterbench.engine.lowbit.INT8`, the same codes and per-channel scales), which that simple CUDA
  kernel is not known to reach; a measured CUDA run says what it does;
- bitsandbytes 4-bit on CUDA: ``bnb.matmul_4bit`` (gemv on packed nibbles);
- everything else: the weight is dequantized, a block of rows at a time, into the caller's reused scratch buffer and
  multiplied there — no allocation per call that outlives it.

:func:`kernel_name` says which one a weight runs, so the cost model prices that one. Storage sizes are
:meth:`PackedWeight.nbytes`: ``untyped_storage().nbytes()`` of every tensor held.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specterbench.engine.bitpack import pack_bits, storage_bytes, unpack_bits
from specterbench.engine.lowbit_ops import (
    INT4_GROUPS,
    INT4_INNER_K_TILES,
    INT8_MM,
    int4_kernel_works,
    int4_layout,
    int4_mm,
    int4_op,
    int8_kernel_works,
)
from specterbench.errors import UsageError

LOWBIT_KERNELS = ("int4mm", "int8mm", "bnb-gemv")  # kernels that compute from the packed weight (no scratch)


# ---- one packed weight -----------------------------------------------------------------------------
_BNB_CODES: dict = {}  # (quant type, device) -> the one code table every bitsandbytes state of that kind shares


class PackedWeight:
    """One weight ``[R, C]`` as packed codes plus per-group metadata (see the module docstring).

    ``kernel``: ``int4mm`` | ``int8mm`` | ``bnb-gemv`` | ``dequant`` — what :meth:`linear` runs.
    ``scratch_elems(rows)``: the scratch elements :meth:`linear` needs when it may dequantize ``rows`` rows at a time.
    """

    __slots__ = ("shape", "spec", "group", "codes", "scale", "zero", "state", "kernel", "table")

    def __init__(self, w: torch.Tensor, spec, compute_dtype: torch.dtype, kernels: bool = True):
        self.shape = tuple(w.shape)
        self.spec = spec
        self.codes = self.scale = self.zero = self.state = self.table = None
        rows, cols = self.shape
        self.group = spec.blocksize if cols % spec.blocksize == 0 else cols  # a row shorter than a group: one
        if spec.quantizer == "bnb":
            self._quantize_bnb(w)
        elif spec.quantizer == "int":
            self._quantize_int(w.float())
        elif spec.quantizer == "sym":
            self.group = cols  # one scale per output channel
            self._quantize_sym(w.float())
        else:
            self._quantize_hqq(w.float())
        self.kernel = "dequant"
        if not kernels:
            pass
        elif (spec.quantizer == "int" and spec.bits == 4 and self.group in INT4_GROUPS and rows % 16 == 0
                and cols % (16 * INT4_INNER_K_TILES) == 0 and int4_kernel_works(str(w.device), compute_dtype)):
            # the kernel's (scale, zero) table [G, N, 2], built once: value = (q - 8)·scale + (8 - zero)·scale
            s = self.scale.t().float()  # [G, N]
            table = torch.stack([s, (8 - self._zero().t().float()) * s], -1)
            self.table = table.to(compute_dtype).contiguous()  # the kernel takes it in the activations' dtype
            self.codes = int4_layout(self._codes_2d())
            self.scale = self.zero = None  # the table holds them
            self.kernel = "int4mm"
        elif spec.quantizer == "sym" and int8_kernel_works(str(w.device), compute_dtype):
            self.scale = self.scale.to(compute_dtype)  # the op takes its scales in the activations' dtype
            self.kernel = "int8mm"
        elif spec.quantizer == "bnb" and spec.bits == 4 and w.device.type == "cuda":  # pragma: no cover - CUDA
            self.kernel = "bnb-gemv"

    # ---- quantizing ------------------------------------------------------------------------------
    def _quantize_int(self, w: torch.Tensor) -> None:
        rows, cols = self.shape
        g, bits = self.group, self.spec.bits
        x = w.reshape(rows, cols // g, g)  # [R, G, g]
        qmax = (1 << bits) - 1
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        scale = ((hi - lo) / qmax).clamp_min(1e-8).half()  # stored fp16
        s = scale.float()
        zero = (-lo / s).round().clamp(0, qmax)
        q = (x / s + zero).round().clamp(0, qmax)
        self.codes = pack_bits(q.to(torch.uint8), bits)
        self.scale = scale.reshape(rows, cols // g)  # [R, G] fp16
        self.zero = pack_bits(zero.to(torch.uint8), bits)  # R·G values at ``bits`` bits

    def _quantize_sym(self, w: torch.Tensor) -> None:
        amax = w.abs().amax(-1, keepdim=True)  # [R, 1]
        scale = (amax / 127).clamp_min(1e-8).half()  # fp16 (the int8 kernel keeps it in the compute dtype)
        self.codes = (w / scale.float()).round().clamp(-127, 127).to(torch.int8)  # [R, C]
        self.scale = scale.reshape(-1)  # [R]

    def _quantize_hqq(self, w: torch.Tensor) -> None:

        try:
            from hqq.core.quantize import Quantizer
        except ImportError:
            raise UsageError("quantizer 'hqq' needs the hqq package: pip install --no-deps hqq termcolor") from None
        rows, cols = self.shape
        wq, meta = Quantizer.quantize(w, nbits=self.spec.bits, group_size=self.group, optimize=True, axis=1,
                                      bitpack=False, device=str(w.device), compute_dtype=torch.float32)
        self.codes = pack_bits(wq.reshape(-1).to(torch.uint8), self.spec.bits)
        self.scale = meta["scale"].reshape(rows, cols // self.group).half()
        self.zero = meta["zero"].reshape(rows, cols // self.group).half()

    def _quantize_bnb(self, w: torch.Tensor) -> None:
        import bitsandbytes.functional as bnbf

        if self.spec.bits == 4:
            packed, state = bnbf.quantize_4bit(w.contiguous(), blocksize=self.spec.blocksize,
                                               quant_type=self.spec.quant_type, compress_statistics=False)
        else:
            packed, state = bnbf.quantize_blockwise(w.contiguous(), blocksize=self.spec.blocksize)
        key = (self.spec.bits, self.spec.quant_type, str(state.code.device))
        state.code = _BNB_CODES.setdefault(key, state.code)  # one table per format, not one per weight
        self.codes, self.state = packed, state

    # ---- the tensors held, and a weight over other tensors of the same layout --------------------
    def parts(self) -> tuple[torch.Tensor, ...]:
        """The tensors this weight holds, in a fixed order: ``(codes, scale, zero)`` (int, hqq; one ``table`` in place
        of scale and zero for the int4 kernel) or ``(codes, absmax)`` (bnb). Copying them copies the weight."""
        if self.state is not None:
            return (self.codes, self.state.absmax)
        if self.kernel == "int4mm":
            return (self.codes, self.table)
        return (self.codes, self.scale, self.zero)

    def over(self, parts) -> "PackedWeight":
        """A weight of this one's shape, spec and layout whose tensors are ``parts`` (same shapes and dtypes as
        :meth:`parts`; e.g. rows of a stacked store or of a device slot): no copy, no quantizing."""
        w = object.__new__(PackedWeight)
        w.shape, w.spec, w.group, w.kernel = self.shape, self.spec, self.group, self.kernel
        w.codes = w.scale = w.zero = w.state = w.table = None
        if self.state is not None:
            import copy

            w.codes, absmax = parts
            w.state = copy.copy(self.state)  # the shared code table and block size; its own absmax
            w.state.absmax = absmax
        elif self.kernel == "int4mm":
            w.codes, w.table = parts
        else:
            w.codes, w.scale, w.zero = parts
        return w

    # ---- sizes -----------------------------------------------------------------------------------
    def nbytes(self) -> int:
        """Storage bytes of every tensor held (a shared bitsandbytes code table is not counted per weight)."""
        held = (storage_bytes(self.codes) + storage_bytes(self.scale) + storage_bytes(self.zero)
                + storage_bytes(self.table))
        if self.state is not None:
            held += storage_bytes(self.state.absmax)
        return held

    def scratch_elems(self, rows: int | None = None) -> int:
        """Scratch elements :meth:`linear` needs: ``rows`` dequantized rows (all of them by default); none where a
        low-bit kernel computes from the packed weight."""
        r, c = self.shape
        if self.kernel in LOWBIT_KERNELS:
            return 0
        return min(r, rows or r) * c

    # ---- values ----------------------------------------------------------------------------------
    def _codes_2d(self) -> torch.Tensor:
        r, c = self.shape
        return unpack_bits(self.codes, self.spec.bits, r * c).view(r, c)

    def _zero(self) -> torch.Tensor:  # [R, G]: uint8 (int), fp16 (hqq)
        r, c = self.shape
        if self.spec.quantizer == "hqq":
            return self.zero
        return unpack_bits(self.zero, self.spec.bits, r * (c // self.group)).view(r, -1)

    def dequantize_rows(self, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        """Rows ``start:stop`` dequantized into ``out`` (a contiguous [stop - start, C] buffer); returns ``out``.
        The arithmetic is the quantizer's own: ``(q - zero) · scale`` in fp32 per group, then ``out``'s dtype."""
        r, c = self.shape
        n = stop - start
        if self.spec.quantizer == "bnb":
            full = self.dequantize(out.dtype)
            return out.copy_(full[start:stop])
        g, bits = self.group, self.spec.bits
        if self.spec.quantizer == "sym":  # q · scale per output channel, in fp32, rounded once
            return out.copy_(self.codes[start:stop].float() * self.scale[start:stop, None].float())
        if self.kernel == "int4mm":  # the kernel's layout holds the codes: read them back through the kernel
            return out.copy_(self._int4_weight()[start:stop])
        if bits == 8:
            codes = self.codes[start * c:stop * c].view(n, c)
        elif (start * c) % 8 == 0:  # whole 8-value words (C is a multiple of 8 in every model)
            lo, hi = start * c, stop * c
            codes = unpack_bits(self.codes[lo // 8 * bits:-(-hi // 8) * bits], bits, n * c).view(n, c)
        else:
            codes = self._codes_2d()[start:stop]
        o = out.view(n, c // g, g)  # in place: no temporary the size of the weight beyond the codes
        o.copy_(codes.view(n, c // g, g))
        o.sub_(self._zero()[start:stop].unsqueeze(-1))  # q - zero: exact (integers below 256)
        o.mul_(self.scale[start:stop].unsqueeze(-1))  # times the fp16 scale, computed in fp32, rounded once
        return out

    def _int4_weight(self) -> torch.Tensor:
        """The dequantized weight [R, C] read back through the int4 kernel (in its table's dtype): identity rows
        times ``W.T``, a block of input columns at a time (exact: one nonzero term per output)."""
        r, c = self.shape
        dev, kdtype = self.codes.device, self.table.dtype
        out = torch.empty(r, c, dtype=kdtype, device=dev)
        for lo in range(0, c, 256):
            hi = min(c, lo + 256)
            eye = torch.zeros(hi - lo, c, dtype=kdtype, device=dev)
            eye[:, lo:hi] = torch.eye(hi - lo, dtype=kdtype, device=dev)
            out[:, lo:hi] = self.linear(eye).t()  # [hi - lo, R] -> columns lo:hi of W
        return out

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole weight dequantized into a new tensor (for substitutes and tests, not the hot path)."""
        if self.spec.quantizer == "bnb":
            import bitsandbytes.functional as bnbf

            w = (bnbf.dequantize_4bit(self.codes, self.state) if self.spec.bits == 4
                 else bnbf.dequantize_blockwise(self.codes, self.state))
            return w.to(dtype)
        if self.kernel == "int4mm":
            return self._int4_weight().to(dtype)
        out = torch.empty(self.shape, dtype=dtype, device=self.scale.device)
        return self.dequantize_rows(0, self.shape[0], out)

    # ---- compute ---------------------------------------------------------------------------------
    def kernel_op(self):
        """``x -> x @ W.T`` for a contiguous ``x`` [T, C] as one call of this weight's low-bit kernel, its operands
        bound (what :meth:`linear` runs for it); None where the weight is dequantized or on bitsandbytes."""
        if self.kernel == "int4mm":
            return lambda x, op=int4_op(self.codes.device), c=self.codes, g=self.group, t=self.table: op(x, c, g, t)
        if self.kernel == "int8mm":
            return lambda x, op=INT8_MM, c=self.codes, s=self.scale: op(x, c, s)
        return None

    def linear(self, x: torch.Tensor, scratch: torch.Tensor | None = None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T (+ bias)`` for ``x`` [T, C]; ``scratch``: a flat buffer of ``x``'s dtype with at least
        :meth:`scratch_elems` elements (its size decides how many rows are dequantized at a time; unused by the
        low-bit kernels)."""
        r, c = self.shape
        if self.kernel == "int4mm":
            y = int4_mm(x.contiguous(), self.codes, self.group, self.table)
            return y if bias is None else y + bias
        if self.kernel == "int8mm":
            y = INT8_MM(x.contiguous(), self.codes, self.scale)
            return y if bias is None else y + bias
        if self.kernel == "bnb-gemv":  # pragma: no cover - needs CUDA
            import bitsandbytes as bnb

            y = bnb.matmul_4bit(x, self.codes.t(), quant_state=self.state)
            return y if bias is None else y + bias
        step = max(1, min(r, scratch.numel() // c))
        if step >= r:
            return F.linear(x, self.dequantize_rows(0, r, scratch[:r * c].view(r, c)), bias)
        out = torch.empty(*x.shape[:-1], r, dtype=x.dtype, device=x.device)
        for start in range(0, r, step):
            stop = min(r, start + step)
            w = self.dequantize_rows(start, stop, scratch[:(stop - start) * c].view(stop - start, c))
            out[..., start:stop] = F.linear(x, w, None if bias is None else bias[start:stop])
        return out


class StackedWeights:
    """One layer's same-shaped :class:`PackedWeight` s of every expert (``int`` or ``hqq``, dequantized), their
    tensors stacked ``[E, ...]`` and each weight re-pointed to its row (the storage is held once), so that the
    experts a step routes to dequantize in one pass: :meth:`dequantize` gathers their rows, unpacks them together and
    applies zero and scale with the arithmetic of :meth:`PackedWeight.dequantize_rows`."""

    def __init__(self, weights: list[PackedWeight]):
        w0 = weights[0]
        self.shape, self.spec, self.group = w0.shape, w0.spec, w0.group
        self.codes = torch.stack([w.codes for w in weights])  # [E, packed bytes]
        self.scale = torch.stack([w.scale for w in weights])  # [E, R, G] fp16
        self.zero = torch.stack([w.zero for w in weights])  # [E, packed bytes] (int) or [E, R, G] fp16 (hqq)
        for i, w in enumerate(weights):
            w.codes, w.scale, w.zero = self.codes[i], self.scale[i], self.zero[i]

    @staticmethod
    def fits(shape, spec) -> bool:
        """Whether weights of ``shape`` stack: every expert's codes a whole number of packed words."""
        rows, cols = shape
        return spec.quantizer in ("int", "hqq") and (spec.bits == 8 or (rows * cols) % 8 == 0)

    def nbytes(self) -> int:
        return storage_bytes(self.codes) + storage_bytes(self.scale) + storage_bytes(self.zero)

    def dequantize(self, experts: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        """The weights of ``experts`` (long [n], on the device) dequantized into ``scratch``: [n, R, C]."""
        r, c = self.shape
        g, bits, n = self.group, self.spec.bits, experts.shape[0]
        out = scratch[:n * r * c].view(n, r, c // g, g)
        codes = self.codes.index_select(0, experts)  # [n, packed bytes]
        out.copy_(unpack_bits(codes.view(-1), bits, n * r * c).view(n, r, c // g, g))
        zero = self.zero.index_select(0, experts)
        if self.spec.quantizer != "hqq":  # bits-bit zeros, each expert's padded to whole words
            per = zero.shape[1] * 8 // bits if bits < 8 else zero.shape[1]
            zero = unpack_bits(zero.view(-1), bits, n * per).view(n, per)[:, :r * (c // g)].view(n, r, c // g)
        out.sub_(zero.unsqueeze(-1))  # q - zero: exact (integers below 256)
        out.mul_(self.scale.index_select(0, experts).unsqueeze(-1))  # times the fp16 scale, rounded once
        return out.view(n, r, c)
