"""torch's low-bit matmuls: the int4 and int8 weight-only kernels, the int4 kernel's weight layout, and probes that
say whether each runs (and matches dequantization) on a device and dtype.

:class:`~specterbench.engine.packing.PackedWeight` computes from these when its format has one; a format without one
is dequantized into a scratch buffer instead. The probes run once per (device, dtype).
"""

from __future__ import annotations

import functools

import torch

INT4_GROUPS = (32, 64, 128, 256)  # group sizes torch's int4 weight-only kernels take


INT4_INNER_K_TILES = 2


# ---- the int4 kernel -------------------------------------------------------------------------------
def int4_layout(codes: torch.Tensor) -> torch.Tensor:
    """Codes uint8 [N, K] in the int4 kernel's layout for their device (CPU: from int32; CUDA: from nibbles)."""
    if codes.device.type == "cpu":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), INT4_INNER_K_TILES)
    nibbles = (codes[:, ::2] << 4 | codes[:, 1::2]).contiguous()  # pragma: no cover - needs CUDA
    return torch.ops.aten._convert_weight_to_int4pack(nibbles, INT4_INNER_K_TILES)  # pragma: no cover


# the ops' default overloads, bound once: the same aten kernels (and the same dispatch a LaunchCounter counts), without
# the overload packet's per-call resolution (~1 µs a call, ~700 calls a draft step at DeepSeek-V3 geometry)
INT4_MM_CPU = torch.ops.aten._weight_int4pack_mm_for_cpu.default


INT8_MM = torch.ops.aten._weight_int8pack_mm.default


def int4_op(device: torch.device):
    """torch's int4 weight-only matmul for ``device``: ``(x, layout, group, scale_zero) -> x @ W.T``."""
    return INT4_MM_CPU if device.type == "cpu" else torch.ops.aten._weight_int4pack_mm.default


def int4_mm(x: torch.Tensor, layout: torch.Tensor, group: int, scale_zero: torch.Tensor) -> torch.Tensor:
    return int4_op(x.device)(x, layout, group, scale_zero)


@functools.lru_cache(maxsize=None)
def int4_kernel_works(device: str, dtype: torch.dtype) -> bool:
    """Whether torch's int4 weight-only matmul runs on ``device`` for ``dtype`` and matches dequantization: a probe
    once per (device, dtype); False where the op is missing or refuses (e.g. CUDA before sm80, fp32 on CUDA)."""
    try:
        gen = torch.Generator().manual_seed(0)
        n, k, g = 64, 256, 64
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8).to(device)
        scale = (torch.rand(n, k // g, generator=gen) + 0.5).to(device)
        zero = torch.randint(0, 16, (n, k // g), generator=gen).float().to(device)
        x = torch.randn(3, k, generator=gen).to(device, dtype)
        table = torch.stack([scale.t(), ((8 - zero) * scale).t()], -1).to(dtype).contiguous()  # [G, N, 2]
        y = int4_mm(x, int4_layout(codes), g, table)
        w = ((codes.float().view(n, -1, g) - zero[..., None]) * scale[..., None]).view(n, k)
        want = x.float() @ w.t()
        return bool(torch.allclose(y.float(), want, rtol=0.05, atol=0.05 * float(want.abs().mean())))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


# ---- the int8 kernel -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def int8_kernel_works(device: str, dtype: torch.dtype) -> bool:
    """Whether torch's int8 weight-only matmul (``aten._weight_int8pack_mm``: int8 codes [N, K], one scale per
    output channel in the activations' dtype) runs on ``device`` for ``dtype`` and matches dequantization: a probe
    once per (device, dtype); False where the op is missing or refuses."""
    try:
        gen = torch.Generator().manual_seed(0)
        n, k = 64, 256
        codes = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).to(device)
        scale = (torch.rand(n, generator=gen) + 0.5).to(device, dtype)
        x = torch.randn(3, k, generator=gen).to(device, dtype)
        y = torch.ops.aten._weight_int8pack_mm(x, codes, scale)
        want = x.float() @ (codes.float() * scale.float()[:, None]).t()
        return bool(torch.allclose(y.float(), want, rtol=0.05, atol=0.05 * float(want.abs().mean())))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
