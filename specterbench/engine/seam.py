"""The seam into transformers: find fused-experts MoE blocks, keep their experts on the host, stand in for them.

Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3 and Phi-MoE blocks call ``self.experts(hidden, top_k_index,
top_k_weights)`` with fused expert tensors (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]).
:class:`OffloadedExperts` takes that call's place and hands it to the engine, which asks its cache for experts by
``(moe_layer, expert)``; :class:`ExpertStore` holds every expert's weights in host memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from specterbench.engine.cache import ExpertKey
from specterbench.errors import ModelError

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine

SUPPORTED_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "phimoe")


def router_of(block: nn.Module) -> nn.Module:
    """The block's router: ``gate`` in most families, ``router`` in Phi-MoE."""
    return getattr(block, "gate", None) or getattr(block, "router")


def find_moe_blocks(model: nn.Module) -> list[nn.Module]:
    """Every MoE block whose experts are fused ``gate_up_proj`` (E, 2I, H) / ``down_proj`` (E, H, I) tensors."""
    blocks = []
    for module in model.modules():
        experts = getattr(module, "experts", None)
        gate_up = getattr(experts, "gate_up_proj", None)
        routed = hasattr(module, "gate") or hasattr(module, "router")
        if routed and isinstance(gate_up, torch.Tensor) and gate_up.dim() == 3:
            blocks.append(module)
    if not blocks:
        arch = getattr(model.config, "model_type", type(model).__name__)
        raise ModelError(f"model type {arch!r} has no MoE block with fused experts; supported families: "
                         f"{', '.join(SUPPORTED_FAMILIES)}")
    return blocks


class ExpertStore:
    """Host copies of every routed expert as contiguous per-expert tensors; pinned memory on CUDA."""

    def __init__(self, blocks: list[nn.Module], dtype: torch.dtype, pin: bool):
        self.dtype = dtype
        self.num_layers = len(blocks)
        self.num_experts = blocks[0].experts.gate_up_proj.shape[0]
        self.weights: dict[ExpertKey, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer, block in enumerate(blocks):
            gate_up, down = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
            for e in range(gate_up.shape[0]):
                pair = (gate_up[e].to("cpu", dtype).contiguous(), down[e].to("cpu", dtype).contiguous())
                self.weights[(layer, e)] = tuple(t.pin_memory() for t in pair) if pin else pair
        gu, dn = self.weights[(0, 0)]
        self.expert_bytes = gu.numel() * gu.element_size() + dn.numel() * dn.element_size()

    @property
    def total_bytes(self) -> int:
        return self.expert_bytes * len(self.weights)


class OffloadedExperts(nn.Module):
    """Drop-in for a fused experts module: same call signature, weights fetched through the engine."""

    def __init__(self, engine: "Engine", layer: int, act_fn):
        super().__init__()
        object.__setattr__(self, "_engine", engine)  # not a submodule: the engine owns the model
        self.layer = layer
        self.act_fn = act_fn

    def forward(self, hidden_states, top_k_index, top_k_weights):  # [T, H], [T, k], [T, k]
        return self._engine.run_moe_layer(self.layer, self.act_fn, hidden_states, top_k_index, top_k_weights)
