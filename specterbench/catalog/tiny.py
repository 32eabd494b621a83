"""Tiny random-init models of each supported family (tests of the seam) and random models with a real model's
routing geometry at a small hidden size (what the engine launches per token)."""

from __future__ import annotations

import torch
import transformers as tf
from transformers import AutoModelForCausalLM

from specterbench.errors import ModelError


class ByteTokenizer:
    """UTF-8 bytes as token ids, for random-init models that have no trained tokenizer."""

    vocab_size = 256
    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def tiny_config(family: str):
    """The config of ``family``'s tiny random model: 2-3 layers, hidden 64, a few experts."""
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    if family == "mixtral":
        return tf.MixtralConfig(**common, intermediate_size=96, num_local_experts=8, num_experts_per_tok=2)
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(**common, intermediate_size=96, moe_intermediate_size=32, num_experts=16,
                                 num_experts_per_tok=4, shared_expert_intermediate_size=64, decoder_sparse_step=1,
                                 mlp_only_layers=[])
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(**common, intermediate_size=96, moe_intermediate_size=32, num_experts=16,
                                 num_experts_per_tok=4, decoder_sparse_step=1, mlp_only_layers=[], head_dim=16)
    if family == "olmoe":
        return tf.OlmoeConfig(**common, intermediate_size=32, num_experts=16, num_experts_per_tok=4)
    if family == "deepseek_v3":  # MLA: as many KV heads as query heads (GQA here breaks cached multi-token passes)
        return tf.DeepseekV3Config(
            **{**common, "num_hidden_layers": 3, "num_key_value_heads": 4}, intermediate_size=96,
            moe_intermediate_size=32,
            n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1,
            n_group=4, topk_group=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=16)
    if family == "deepseek_v2":
        return tf.DeepseekV2Config(
            **{**common, "num_hidden_layers": 3, "num_key_value_heads": 4}, intermediate_size=96,
            moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
            first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=16, topk_method="greedy")
    if family == "phimoe":
        return tf.PhimoeConfig(**common, intermediate_size=96, num_local_experts=8, num_experts_per_tok=2)
    raise ModelError(f"no tiny config for family {family!r}")


def tiny_random(family: str, seed: int = 0):
    """A seeded random-init model of ``family`` whose weights are exactly representable in bf16."""
    config = tiny_config(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3: give the bias some real effect
                buf.copy_(torch.randn_like(buf) * 0.01)
    return model.eval(), ByteTokenizer()


#: routing geometry of real models (experts per MoE layer, MoE layers, top-k, family) for random-init models at small
#: hidden sizes: what the engine launches per token depends on this and on the family's code, not on hidden
ROUTING_GEOMETRIES = {
    "mixtral": (8, 32, 2, "mixtral"),
    "qwen1.5-moe": (60, 24, 4, "qwen2_moe"),
    "deepseek-v2-lite": (64, 26, 6, "deepseek_v2"),
}


def routing_geometry_random(name: str, hidden: int = 64, seed: int = 0):
    """A random-init model with the routing geometry of :data:`ROUTING_GEOMETRIES` ``[name]`` (shared experts and a
    first dense layer where the real model has them) at hidden size ``hidden``."""
    import transformers as tf
    experts, moe_layers, top_k, family = ROUTING_GEOMETRIES[name]
    common = dict(vocab_size=256, hidden_size=hidden, num_attention_heads=4, max_position_embeddings=512,
                  tie_word_embeddings=False)
    if family == "mixtral":
        config = tf.MixtralConfig(**common, num_hidden_layers=moe_layers, num_key_value_heads=2,
                                  intermediate_size=2 * hidden, num_local_experts=experts, num_experts_per_tok=top_k)
    elif family == "qwen2_moe":
        config = tf.Qwen2MoeConfig(**common, num_hidden_layers=moe_layers, num_key_value_heads=4,
                                   intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
                                   num_experts=experts, num_experts_per_tok=top_k,
                                   shared_expert_intermediate_size=2 * hidden, decoder_sparse_step=1,
                                   mlp_only_layers=[])
    else:
        config = tf.DeepseekV2Config(**common, num_hidden_layers=moe_layers + 1, num_key_value_heads=4,
                                     intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
                                     n_routed_experts=experts, num_experts_per_tok=top_k, n_shared_experts=2,
                                     first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
                                     qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, topk_method="greedy")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model.eval()


TINY_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "phimoe")
