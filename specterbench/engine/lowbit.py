"""Low-bit kernels as they run: what each quantized weight format's device kernel achieves, so that a
low-bit draft or target is priced as it runs rather than by its bits alone.

A weight-only low-bit kernel at decode shapes streams packed weights from device memory and unpacks them in
registers (shifts, masks, a rescale by the group's scale and zero) before the tensor-core multiply. The modeled clock
prices it with two figures per format, each with its source:

- ``bandwidth_efficiency`` — the weight-streaming bandwidth the kernel achieves, over the profile's 16-bit figure
  (``mem_bytes_per_s`` is what a bf16 GEMV reaches): the memory side of the op costs ``bytes / (mem_bytes_per_s ·
  efficiency)``;
- ``dequant_ops_per_weight`` — the CUDA-core instructions it spends per weight to unpack and rescale, paid at the
  profile's ``alu_ops_per_s``. Unpacking overlaps the memory stream, so it binds only when it is the slower of the
  two; a packing that is not a power of two (3 bits: values straddle 32-bit words) pays more of it.

An op (:class:`~specterbench.engine.costs.Op`) then costs ``launches · launch_us + max(flops / flops_per_s, bytes /
(mem_bytes_per_s · efficiency), alu_ops / alu_ops_per_s)``. The bytes billed are the bytes stored (packed values
plus per-group metadata at the group size actually used: :meth:`~specterbench.engine.draft.QuantSpec.tensor_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LowBitKernel:
    """The price of one weight format's kernel; ``sources`` say where each figure comes from."""

    name: str
    bandwidth_efficiency: float  # achieved weight-streaming bandwidth over the profile's 16-bit figure
    dequant_ops_per_weight: float  # CUDA-core instructions per weight: unpack + rescale
    sources: tuple[str, ...]

    def __post_init__(self):
        if not 0 < self.bandwidth_efficiency <= 1.5 or self.dequant_ops_per_weight < 0:
            raise ValueError(f"kernel {self.name!r}: efficiency must be in (0, 1.5] and dequant ops >= 0")


GPT_FAST = ("gpt-fast README (pytorch-labs/gpt-fast), Llama-2-7B batch 1 on A100-80GB: bf16 1397.31 GB/s, int8 "
            "weight-only 1069.20 GB/s, int4 g32 (torch int4 mm) 862.69 GB/s achieved")
MARLIN = ("Marlin (Frantar et al., arXiv 2408.11743): FP16xINT4 g128 within 5% of the ideal 3.87x over FP16 up to "
          "batch 32 (72k x 18k, A10); the kernel MoE-SpeQ's draft runs (EVIDENCE.md section 3)")
LLAMA_CPP = ("llama.cpp CUDA, Llama-2-7B decode (llmc benchmark/speed.md): Q4_K_M 7.13, Q3_K_M 8.73, Q2_K 7.93 "
             "ms/token for 4.08 / 3.30 / 2.83 GB of weights: 572 / 378 / 357 GB/s, so the 3-bit kernel streams at "
             "0.66 and the 2-bit at 0.62 of the 4-bit one")
UNPACK = ("dequant instructions counted per weight: 8 and 4 bits unpack a 32-bit register into 4 or 8 halves with "
          "one byte-permute / lop3 per pair (0.5-1) plus half a half2 FMA for scale and zero (Marlin's dequant); 3 "
          "and 2 bits are set so that the 4-bit kernel's streaming plus these instructions reproduce llama.cpp's "
          "3- and 2-bit ratios above at the a100-40g-pcie4 profile (3 bits: 32 values span three words, shifts and "
          "merges across word boundaries)")

BF16 = LowBitKernel("bf16", 1.0, 0.0, ("the profile's own 16-bit figures",))
INT8 = LowBitKernel("int8 weight-only", 1069.20 / 1397.31, 1.0, (GPT_FAST, UNPACK))
INT4 = LowBitKernel("int4 g128 (Marlin-class)", 0.95, 1.5, (MARLIN, UNPACK))
INT4_TORCH = LowBitKernel("4-bit LUT/torch int4 mm", 862.69 / 1397.31, 2.5,
                          (GPT_FAST, UNPACK + "; one table lookup more per weight for nf4/fp4",))
INT3 = LowBitKernel("int3 (non-power-of-two packing)", 0.95, 3.0, (MARLIN, LLAMA_CPP, UNPACK))
INT2 = LowBitKernel("int2", 0.95, 2.1, (MARLIN, LLAMA_CPP, UNPACK))

_BY_BITS = {16: BF16, 8: INT8, 4: INT4, 3: INT3, 2: INT2}


def kernel_for(spec) -> LowBitKernel:
    """The kernel a :class:`~specterbench.engine.draft.QuantSpec`'s weights run with (None: 16-bit weights).

    ``int`` and ``hqq`` are GPTQ-style uniform formats (Marlin-class at 4 bits); ``bnb`` 4-bit (nf4/fp4) is a
    lookup-table format, priced as torch's int4 mm with one lookup more per weight; ``bnb`` 8-bit as int8."""
    if spec is None:
        return BF16
    if spec.quantizer == "bnb" and spec.bits == 4:
        return INT4_TORCH
    return _BY_BITS[spec.bits]


def kernel_for_ratio(bytes_ratio: float) -> LowBitKernel:
    """The kernel implied by a weight's bytes over 16-bit, when the caller names no format (a plugin's
    substitute, ``engine.costs.expert_s(n, 0.26)``): the uniform format of that many bits per weight."""
    bits = 16 * bytes_ratio
    if bits > 12:
        return BF16
    for limit, kernel in ((2.6, INT2), (3.6, INT3), (5.5, INT4), (12, INT8)):
        if bits <= limit:
            return kernel
    return BF16  # pragma: no cover - unreachable


__all__ = ["BF16", "INT2", "INT3", "INT4", "INT4_TORCH", "INT8", "LowBitKernel", "kernel_for", "kernel_for_ratio"]
