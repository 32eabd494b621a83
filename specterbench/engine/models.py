"""Model specs: how a name resolves to a transformers MoE model and its tokenizer.

Three kinds: ``tiny-random-*`` (seeded random init of each supported family, for tests of the seam),
embedded models trained by the project and shipped inside the package, and real presets found on local disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specterbench import hookimpl
from specterbench.errors import ModelError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    family: str
    description: str
    load: Callable[[], tuple[torch.nn.Module, object]]  # -> (model in eval mode, tokenizer or None)
    kind: str = "random"  # random | embedded | preset | local
    geometry: str | None = None  # the real model it stands in for: ``--geometry auto`` prices it at that size


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
    from transformers import AutoModelForCausalLM

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


def tiny_random_specs() -> list[ModelSpec]:
    return [
        ModelSpec(name=f"tiny-random-{fam.replace('_', '-')}", family=fam, kind="random",
                  description=f"seeded random-init {fam} (2-3 layers, hidden 64) for seam tests; routing has no "
                              f"structure",
                  load=lambda fam=fam: tiny_random(fam))
        for fam in TINY_FAMILIES
    ]


# ---- real checkpoints found on local disk -------------------------------------------------------------

MODEL_PATH_ENV = "SPECTERBENCH_MODEL_PATH"

# preset -> (repo ids tried in order, geometry preset of the same name, family)
REAL_PRESETS: dict[str, tuple[tuple[str, ...], str]] = {
    "mixtral": (("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"), "mixtral"),
    "qwen-moe": (("Qwen/Qwen1.5-MoE-A2.7B", "Qwen/Qwen1.5-MoE-A2.7B-Chat"), "qwen2_moe"),
    "deepseek-v2-lite": (("deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite-Chat"), "deepseek_v2"),
    "olmoe": (("allenai/OLMoE-1B-7B-0924", "allenai/OLMoE-1B-7B-0125"), "olmoe"),
    "phi-moe": (("microsoft/Phi-3.5-MoE-instruct",), "phimoe"),
}

EMBEDDED_STAND_IN = {"mixtral": "tiny-mixtral", "phi-moe": "tiny-mixtral",  # others: the fine-grained one
                     "deepseek-v2-lite": "tiny-deepseek"}


def resolve_checkpoint(preset: str) -> "Path":
    """A local directory holding the preset's checkpoint: ``$SPECTERBENCH_MODEL_PATH`` (or ``--model-path``),
    else the Hugging Face cache, looked up with the hub offline. Nothing is downloaded."""
    import os
    from pathlib import Path

    repo_ids, _ = REAL_PRESETS[preset]
    looked = []
    explicit = os.environ.get(MODEL_PATH_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if (path / "config.json").is_file():
            return path
        looked.append(f"{path} (no config.json)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    for repo_id in repo_ids:
        try:
            return Path(snapshot_download(repo_id, local_files_only=True))
        except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
            looked.append(f"{constants.HF_HUB_CACHE} ({repo_id})")
    from specterbench.embedded import EMBEDDED_MODELS

    stand_in = EMBEDDED_STAND_IN.get(preset, "tiny-qwen-moe")
    stand_in = stand_in if stand_in in EMBEDDED_MODELS else "tiny-qwen-moe"
    raise ModelError(
        f"{preset}: no local checkpoint of {' or '.join(repo_ids)}; looked in {'; '.join(looked)}. Download it "
        f"where there is network (`huggingface-cli download {repo_ids[0]}`) and pass --model-path DIR or set "
        f"{MODEL_PATH_ENV}, or run the shipped model priced at its sizes: make bench MODEL={stand_in} "
        f"GEOMETRY={preset}")


def load_checkpoint(path, dtype=torch.bfloat16):
    """Load a local checkpoint, shard by shard into an uninitialised model (host RAM ≈ the model's own bytes;
    see :mod:`specterbench.engine.checkpoint`); per-expert tensors land in the fused layout as they are read."""
    from specterbench.engine.checkpoint import load_checkpoint as load

    model, tokenizer = load(path, dtype)
    return model.eval(), tokenizer


def check_model_path(path) -> None:
    """Cheap checks of a checkpoint folder before anything loads: config.json parses, the family is supported,
    weight files are there. Raises a one-line :class:`ModelError`."""
    from specterbench.engine.checkpoint import read_config, weight_files

    read_config(path)
    weight_files(path)


def local_spec(path) -> ModelSpec:
    """A model spec for any local checkpoint of a supported family (``--model-path DIR`` alone): the family
    from its config.json, the geometry from the config, the tokenizer from the directory. Checked now, so a bad
    directory is a one-line :class:`ModelError` before any model is built."""
    from pathlib import Path

    from specterbench.engine.checkpoint import read_config, weight_files

    path = Path(path).expanduser().resolve()
    config = read_config(path)
    weight_files(path)
    experts = (getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
               or getattr(config, "n_routed_experts", None))
    return ModelSpec(name=f"local:{path.name}", family=config.model_type, kind="local",
                     description=f"{config.model_type} checkpoint at {path} ({config.num_hidden_layers} layers, "
                                 f"{experts} experts, top-{getattr(config, 'num_experts_per_tok', '?')})",
                     load=lambda: load_checkpoint(path))


class _LocalModels:
    """An in-process plugin that registers local checkpoints named on the command line."""

    def __init__(self, specs):
        self.specs = list(specs)

    @hookimpl
    def specterbench_register_models(self, register):
        for spec in self.specs:
            register(spec)


def register_local_model(host, path) -> str:
    """Register the checkpoint at ``path`` with ``host`` and return its model name (``local:<folder>``)."""
    spec = local_spec(path)
    if spec.name not in host.models().names():
        host.register(_LocalModels([spec]), f"local-model:{spec.name}")
    return spec.name


def preset_specs() -> list[ModelSpec]:
    return [
        ModelSpec(name=name, family=family, kind="preset",
                  description=f"{repo_ids[0]} from a local path or the HF cache (offline)",
                  load=lambda name=name: load_checkpoint(resolve_checkpoint(name)))
        for name, (repo_ids, family) in REAL_PRESETS.items()
    ]


def embedded_specs() -> list[ModelSpec]:
    from specterbench import embedded

    return [ModelSpec(name=name, family=embedded.STAND_INS[name].family, kind="embedded",
                      geometry=embedded.STAND_INS[name].geometry,
                      description="trained by the project on public-domain Shakespeare; ships in the package",
                      load=lambda name=name: embedded.load(name))
            for name in embedded.EMBEDDED_MODELS]
