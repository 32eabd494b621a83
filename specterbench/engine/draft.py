"""Quantized copies of the routed experts with bitsandbytes: the self-draft's experts (and lossy fallbacks).

``BitsAndBytesConfig`` only quantizes ``nn.Linear``; fused expert tensors are quantized here per expert slice
(``gate_up`` [2I, H] and ``down`` [H, I]) with ``bitsandbytes.functional``. Bytes are the real packed bytes
plus the per-block scales, and are charged to the strategy that keeps the copies on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specterbench.errors import UsageError

SUPPORTED_BITS = (4, 8)
SUPPORTED_4BIT_TYPES = ("nf4", "fp4")


@dataclass(frozen=True, slots=True)
class QuantSpec:
    bits: int = 4
    quant_type: str = "nf4"  # 4-bit only: nf4 | fp4
    blocksize: int = 64

    def __post_init__(self):
        if self.bits not in SUPPORTED_BITS:
            raise UsageError(f"unsupported draft bit width {self.bits}; supported: "
                             f"{', '.join(map(str, SUPPORTED_BITS))}")
        if self.bits == 4 and self.quant_type not in SUPPORTED_4BIT_TYPES:
            raise UsageError(f"unsupported 4-bit type {self.quant_type!r}; supported: "
                             f"{', '.join(SUPPORTED_4BIT_TYPES)}")
        if self.blocksize not in (64, 128, 256, 512, 1024, 2048, 4096):
            raise UsageError(f"unsupported blocksize {self.blocksize}; use a power of two from 64 to 4096")

    OPTIONS = ("bits", "quant_type", "blocksize")  # the strategy options that choose a quantization

    @classmethod
    def from_options(cls, options: dict) -> "QuantSpec":
        """The spec named by a strategy's options (``--set specter.bits=4``), defaults elsewhere."""
        try:
            bits, blocksize = int(options.get("bits", 4)), int(options.get("blocksize", 64))
        except (TypeError, ValueError):
            raise UsageError(f"bits and blocksize must be integers, got {options.get('bits')!r} and "
                             f"{options.get('blocksize')!r}") from None
        return cls(bits=bits, quant_type=options.get("quant_type", "nf4"), blocksize=blocksize)

    def label(self) -> str:
        return f"{self.quant_type if self.bits == 4 else 'int8'}/b{self.blocksize}"


def quantized_bytes(engine, spec: QuantSpec) -> int:
    """Device bytes of every routed expert quantized with ``spec``: packed weights plus fp32 per-block scales.
    Known before quantizing, so a budget can be checked first; equals :attr:`QuantizedExperts.nbytes`."""
    total = 0
    for gate_up, down in engine.store.weights.values():
        for w in (gate_up, down):
            n = w.numel()
            total += (n * spec.bits + 7) // 8 + -(-n // spec.blocksize) * 4
    return total


def shared_quantized(engine, spec: QuantSpec) -> "QuantizedExperts":
    """One quantized copy per (engine, spec), shared by the cells that use it (quantizing takes seconds)."""
    drafts = engine.__dict__.setdefault("_quantized_experts", {})
    if spec not in drafts:
        drafts[spec] = QuantizedExperts(engine, spec)
    return drafts[spec]


def quantize(w: torch.Tensor, spec: QuantSpec):
    """Returns ``(packed, state, nbytes)`` for one 2-D weight."""
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


class QuantizedExperts:
    """Every routed expert quantized and resident on the device; callable in place of the offloaded cache.

    On CUDA the packed weights are dequantized per call (the draft really reads 4-bit bytes). On a CPU host the
    dequantized values are kept once (identical numbers, faster), while the bytes charged stay the packed ones.
    Each call records the experts it routed to, so a strategy can read the draft's routing.
    """

    def __init__(self, engine, spec: QuantSpec):
        self.engine = engine
        self.spec = spec
        self.on_the_fly = engine.device.type == "cuda"
        self.packed: dict = {}
        self.dense: dict = {}
        self.nbytes = 0
        for key, (gate_up, down) in engine.store.weights.items():
            pair = []
            for w in (gate_up, down):
                packed, state, n = quantize(w.to(engine.device), spec)
                self.nbytes += n
                pair.append((packed, state))
            if self.on_the_fly:
                self.packed[key] = tuple(pair)
            else:
                self.dense[key] = tuple(dequantize(p, s, spec).to(engine.compute_dtype) for p, s in pair)
        self.bytes_ratio = self.nbytes / engine.total_expert_bytes  # ≈ 0.28 for nf4 with fp32 scales
        self.routing: list[tuple[int, list[int], list[int]]] = []  # (layer, experts, tokens per expert)

    def weights(self, key):
        if self.on_the_fly:
            return tuple(dequantize(p, s, self.spec).to(self.engine.compute_dtype) for p, s in self.packed[key])
        return self.dense[key]

    def __call__(self, layer, act_fn, hidden, top_k_index, top_k_weights):  # [T, H], [T, k], [T, k]
        engine = self.engine
        counts = torch.bincount(top_k_index.reshape(-1), minlength=engine.num_experts)
        experts = counts.nonzero().flatten().tolist()
        self.routing.append((layer, experts, counts[experts].tolist()))
        out = torch.zeros_like(hidden)
        for e in experts:
            token_idx, pos = torch.where(top_k_index == e)
            gate_up, down = self.weights((layer, e))
            gate, up = F.linear(hidden[token_idx], gate_up).chunk(2, dim=-1)
            y = F.linear(act_fn(gate) * up, down) * top_k_weights[token_idx, pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
            engine.charge_expert(len(token_idx), self.bytes_ratio)
        return out
