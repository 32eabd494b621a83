"""Model specs: how a name resolves to a transformers MoE model and its tokenizer.

Three kinds: ``tiny-random-*`` (seeded random init of each supported family, for tests of the seam),
embedded models trained by the project and shipped inside the package, and real presets found on local disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .errors import ModelError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    family: str
    description: str
    load: Callable[[], tuple[torch.nn.Module, object]]  # -> (model in eval mode, tokenizer or None)
    kind: str = "random"  # random | embedded | preset


class ByteTokenizer:
    """UTF-8 bytes as token ids, for random-init models that have no trained tokenizer."""

    vocab_size = 256
    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def _tiny_config(family: str):
    import transformers as tf

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
            **{**common, "num_hidden_layers": 3, "num_key_value_heads": 4}, intermediate_size=96, moe_intermediate_size=32,
            n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1,
            n_group=4, topk_group=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=16)
    raise ModelError(f"no tiny config for family {family!r}")


def tiny_random(family: str, seed: int = 0):
    """A seeded random-init model of ``family`` whose weights are exactly representable in bf16."""
    from transformers import AutoModelForCausalLM

    config = _tiny_config(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3: give the bias some real effect
                buf.copy_(torch.randn_like(buf) * 0.01)
    return model.eval(), ByteTokenizer()


TINY_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3")


def tiny_random_specs() -> list[ModelSpec]:
    return [
        ModelSpec(name=f"tiny-random-{fam.replace('_', '-')}", family=fam, kind="random",
                  description=f"seeded random-init {fam} (2-3 layers, hidden 64) for seam tests; routing has no "
                              f"structure",
                  load=lambda fam=fam: tiny_random(fam))
        for fam in TINY_FAMILIES
    ]
