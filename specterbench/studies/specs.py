"""What each embedded model is: geometry, the real model it stands in for, and how it is trained.

The routing levers (see the model cards and :mod:`specterbench.studies.realism`): ``aux_batch`` is the
per-layer Switch-style load-balancing loss over the whole batch, ``aux_seq`` the same computed within each
sequence (DeepSeek-V2's expert-level balance loss); balance within a sequence works directly against local
routing consistency (arXiv 2505.16056 reports the trade-off), balance over the batch much less so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specterbench.errors import UsageError

CONTEXT = 256


@dataclass(frozen=True)
class Spec:
    name: str
    arch: str  # "mixtral" | "qwen2_moe" | "deepseek_v2" | "llama" (a dense draft)
    config: dict
    steps: int
    stands_for: str  # key of published_routing.json
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_frac: float = 0.04
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 50
    aux_batch: float = 0.01  # per-layer load balance over the batch
    aux_seq: float = 0.0  # per-layer load balance within each sequence (the realism lever)
    #: weight of the expert-reliance loss: hinge pushing the cross-entropy of the same batch with the routed experts
    #: removed (zero output) up to ``removed_ce_floor`` nats (see train.reliance_loss); 0 = off
    aux_removed: float = 0.0
    removed_ce_floor: float = 8.0
    probe_windows: int = 24  # held-out windows for the routing probe logged at each evaluation


_ROPE = {"rope_type": "default", "rope_theta": 10000.0}

SPECS: dict[str, Spec] = {
    "tiny-mixtral": Spec(
        name="tiny-mixtral",
        arch="mixtral",
        stands_for="mixtral-8x7b",
        config=dict(
            hidden_size=256, intermediate_size=160, num_hidden_layers=6, num_attention_heads=8,
            num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2,
            max_position_embeddings=CONTEXT, rms_norm_eps=1e-5, tie_word_embeddings=True,
            router_aux_loss_coef=0.0, router_jitter_noise=0.0, rope_parameters=_ROPE,
        ),
        steps=200,
        aux_seq=0.015,
        aux_removed=1.0,
    ),
    "tiny-qwen-moe": Spec(
        name="tiny-qwen-moe",
        arch="qwen2_moe",
        stands_for="qwen1.5-moe-a2.7b",
        config=dict(
            hidden_size=192, intermediate_size=384, num_hidden_layers=6, num_attention_heads=6,
            num_key_value_heads=2, num_experts=60, num_experts_per_tok=4, moe_intermediate_size=32,
            shared_expert_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=False,
            qkv_bias=True, max_position_embeddings=CONTEXT, rms_norm_eps=1e-6, tie_word_embeddings=True,
            use_sliding_window=False, router_aux_loss_coef=0.0, rope_parameters=_ROPE,
        ),
        steps=150,
        aux_seq=0.03,
        aux_removed=1.0,
    ),
    "tiny-deepseek": Spec(
        name="tiny-deepseek",
        arch="deepseek_v2",
        stands_for="deepseek-v2-lite",
        config=dict(
            hidden_size=192, intermediate_size=384, num_hidden_layers=7, num_attention_heads=6,
            num_key_value_heads=6, head_dim=32, n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
            moe_intermediate_size=32, first_k_dense_replace=1, kv_lora_rank=64, q_lora_rank=None,
            qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, topk_method="greedy", n_group=None,
            topk_group=None, norm_topk_prob=False, routed_scaling_factor=1.0,
            max_position_embeddings=CONTEXT, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_parameters=_ROPE,
        ),
        steps=100,
        aux_batch=0.01,
        aux_seq=0.0,
        aux_removed=1.0,
    ),
}

#: the dense drafts ``spec-small`` proposes with: same tokenizer, corpus and recipe as the stand-ins, no routing
DRAFT_SPECS: dict[str, Spec] = {
    "tiny-draft": Spec(
        name="tiny-draft",
        arch="llama",
        stands_for="a small dense draft of the stand-ins' family (speculative decoding with a separate draft)",
        config=dict(
            hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=CONTEXT, rms_norm_eps=1e-5,
            tie_word_embeddings=True, rope_parameters=_ROPE,
        ),
        steps=200,
        aux_batch=0.0,
        probe_windows=0,
    ),
}

_FIELDS = {f for f in Spec.__dataclass_fields__ if f not in ("name", "arch", "config", "stands_for")}


def with_overrides(spec: Spec, overrides: dict[str, str]) -> Spec:
    """``spec`` with training fields or config keys replaced (``aux_seq=0.05``, ``config.num_experts=32``)."""
    import json

    fields, config = {}, dict(spec.config)
    for key, raw in overrides.items():
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if key.startswith("config."):
            config[key[len("config."):]] = value
        elif key in _FIELDS:
            fields[key] = type(getattr(spec, key))(value)
        else:
            raise UsageError(f"unknown training setting {key!r}: use config.KEY or one of {', '.join(sorted(_FIELDS))}")
    return replace(spec, config=config, **fields)


def build_config(spec: Spec, tokenizer):
    import transformers as tf

    special = dict(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=0.02, attention_dropout=0.0, use_cache=True,
    )
    cls = {"mixtral": tf.MixtralConfig, "qwen2_moe": tf.Qwen2MoeConfig, "deepseek_v2": tf.DeepseekV2Config,
           "llama": tf.LlamaConfig}[spec.arch]
    return cls(**spec.config, **special)
