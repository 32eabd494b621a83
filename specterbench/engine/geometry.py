"""Byte and FLOP geometry of an MoE model, the modeled clock's price list.

By default a model is priced at its own size. A geometry preset (a real model's sizes) may price a small
model's real routing at the sizes of a large one; then every figure is labelled with the geometry's name.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass

from specterbench.errors import ModelError, UsageError

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
    layer_scale: float = 1.0  # real layers each modeled layer stands for (a projection at a larger geometry)
    projected_from: str | None = None  # the model whose routing is priced at this geometry
    expert_bits_per_weight: float | None = None  # stored bits of a quantized expert (None: dtype_bytes * 8)
    precision: str = "bf16"  # the target's precision label (engine.precision.Precision.label())

    def label(self) -> str:
        at = "" if self.precision == "bf16" else f", {self.precision}"
        if self.projected_from is None:
            return f"{self.name} (own geometry{at})"
        return (f"{self.projected_from} routing priced at {self.name} geometry{at} (modeled projection: each of "
                f"{self.moe_layers} MoE layers stands for {self.layer_scale:.2f} real layers)")

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_intermediate

    @property
    def expert_bytes(self) -> int:
        """Stored bytes of one expert: 16-bit, or packed codes plus group metadata for a quantized target."""
        if self.expert_bits_per_weight is None:
            return self.expert_params * self.dtype_bytes
        return int(round(self.expert_params * self.expert_bits_per_weight / 8))

    @property
    def all_expert_bytes(self) -> int:
        return int(self.expert_bytes * self.num_experts * self.moe_layers * self.layer_scale)

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


# Published configs of the real models (config.json on the Hugging Face hub, read off their model cards).
# DeepSeek-V2-Lite's MLA attention is priced as 16-head MHA of head_dim 128 (≈ 16.8M vs ≈ 13.8M weights/layer).
GEOMETRY_PRESETS: dict[str, Geometry] = {
    "mixtral": Geometry("mixtral", hidden=4096, expert_intermediate=14336, num_experts=8, top_k=2, moe_layers=32,
                        layers=32, heads=32, kv_heads=8, head_dim=128, vocab=32000),
    "qwen-moe": Geometry("qwen-moe", hidden=2048, expert_intermediate=1408, num_experts=60, top_k=4, moe_layers=24,
                         layers=24, heads=16, kv_heads=16, head_dim=128, vocab=151936, shared_intermediate=5632),
    "deepseek-v2-lite": Geometry("deepseek-v2-lite", hidden=2048, expert_intermediate=1408, num_experts=64, top_k=6,
                                 moe_layers=26, layers=27, heads=16, kv_heads=16, head_dim=128, vocab=102400,
                                 shared_intermediate=2816, dense_intermediate=10944),
    "olmoe": Geometry("olmoe", hidden=2048, expert_intermediate=1024, num_experts=64, top_k=8, moe_layers=16,
                      layers=16, heads=16, kv_heads=16, head_dim=128, vocab=50304),
    "phi-moe": Geometry("phi-moe", hidden=4096, expert_intermediate=6400, num_experts=16, top_k=2, moe_layers=32,
                        layers=32, heads=32, kv_heads=8, head_dim=128, vocab=32064),
    # Qwen/Qwen3-30B-A3B config.json: 48 layers, all MoE, 128 experts top-8, moe_intermediate_size 768, 32 query and
    # 4 KV heads of 128, no shared expert
    "qwen3-30b-a3b": Geometry("qwen3-30b-a3b", hidden=2048, expert_intermediate=768, num_experts=128, top_k=8,
                              moe_layers=48, layers=48, heads=32, kv_heads=4, head_dim=128, vocab=151936),
    # deepseek-ai/DeepSeek-V3 config.json: 61 layers, the first 3 dense (intermediate 18432), 58 MoE layers of 256
    # routed experts top-8 (moe_intermediate_size 2048) and one shared expert. Its MLA attention (q_lora 1536,
    # kv_lora 512, 128 heads: ~187M weights a layer, 576 cached values a token) is priced as 88 query heads and 2
    # KV heads of 144: ~186M weights and the same 576 cached values
    "deepseek-v3": Geometry("deepseek-v3", hidden=7168, expert_intermediate=2048, num_experts=256, top_k=8,
                            moe_layers=58, layers=61, heads=88, kv_heads=2, head_dim=144, vocab=129280,
                            shared_intermediate=2048, dense_intermediate=18432),
}
# deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct config.json: the DeepSeek-V2-Lite architecture, the same sizes
GEOMETRY_PRESETS["deepseek-coder-v2-lite"] = dataclasses.replace(GEOMETRY_PRESETS["deepseek-v2-lite"],
                                                                 name="deepseek-coder-v2-lite")


def geometry_preset(name: str) -> Geometry:
    if name not in GEOMETRY_PRESETS:
        close = difflib.get_close_matches(name, GEOMETRY_PRESETS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"unknown geometry {name!r}; {hint}available: {', '.join(GEOMETRY_PRESETS)}")
    return GEOMETRY_PRESETS[name]


def project(own: Geometry, preset: str) -> Geometry:
    """Price ``own``'s routing at a real model's sizes.

    Per-layer costs (attention, router, shared expert, each expert's bytes and FLOPs) are the real model's;
    routing, expert count and top-k stay the small model's; each small MoE layer stands for
    ``real MoE layers / small MoE layers`` real ones, so every per-layer cost — compute and copies — is
    multiplied by that ratio, and the output head is charged once per token.
    """
    real = geometry_preset(preset)
    return dataclasses.replace(real, num_experts=own.num_experts, top_k=own.top_k, moe_layers=own.moe_layers,
                               layers=own.layers, layer_scale=real.moe_layers / own.moe_layers,
                               projected_from=own.name)
