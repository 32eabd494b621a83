"""Byte and FLOP geometry of an MoE model, the modeled clock's price list.

By default a model is priced at its own size. A geometry preset (issue: real-model presets) may price a small
model's real routing at the sizes of a large one; then every figure is labelled with the geometry's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelError

PRICED_DTYPE_BYTES = 2  # the modeled clock prices weights and activations as bf16, as served on a GPU


@dataclass(frozen=True, slots=True)
class Geometry:
    name: str
    hidden: int
    expert_intermediate: int
    num_experts: int
    top_k: int
    moe_layers: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    shared_intermediate: int = 0  # summed over shared experts; 0 when the family has none
    dense_intermediate: int = 0  # MLP size of dense (non-MoE) layers, e.g. DeepSeek's first_k_dense
    dtype_bytes: int = PRICED_DTYPE_BYTES

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_intermediate

    @property
    def expert_bytes(self) -> int:
        return self.expert_params * self.dtype_bytes

    @property
    def all_expert_bytes(self) -> int:
        return self.expert_bytes * self.num_experts * self.moe_layers

    @property
    def attn_params(self) -> int:
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_o + k_v

    def layer_dense_params(self, moe: bool) -> int:
        """Weights read by the non-routed part of one decoder layer (attention, router, shared/dense MLP)."""
        if moe:
            return self.attn_params + self.hidden * self.num_experts + 3 * self.hidden * self.shared_intermediate
        return self.attn_params + 3 * self.hidden * self.dense_intermediate


def _get(config, *names, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def geometry_from_config(config, name: str, moe_layers: int) -> Geometry:
    """Read the geometry of a transformers MoE config (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V3)."""
    hidden = config.hidden_size
    experts = _get(config, "num_local_experts", "num_experts", "n_routed_experts")
    top_k = _get(config, "num_experts_per_tok", "moe_topk")
    inter = _get(config, "moe_intermediate_size", default=None) or config.intermediate_size
    if experts is None or top_k is None:
        raise ModelError(f"{name}: config has no routed experts (num_experts / num_experts_per_tok)")
    heads = config.num_attention_heads
    head_dim = _get(config, "head_dim", default=hidden // heads)
    shared = _get(config, "shared_expert_intermediate_size", default=0) or 0
    n_shared = _get(config, "n_shared_experts", default=0) or 0
    if n_shared:
        shared = n_shared * inter
    return Geometry(
        name=name,
        hidden=hidden,
        expert_intermediate=inter,
        num_experts=experts,
        top_k=top_k,
        moe_layers=moe_layers,
        layers=config.num_hidden_layers,
        heads=heads,
        kv_heads=_get(config, "num_key_value_heads", default=heads),
        head_dim=head_dim,
        vocab=config.vocab_size,
        shared_intermediate=shared,
        dense_intermediate=config.intermediate_size if moe_layers < config.num_hidden_layers else 0,
    )
