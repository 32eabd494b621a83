"""Model specs: how a name resolves to a transformers MoE model and its tokenizer.

Three kinds: ``tiny-random-*`` (seeded random init of each supported family, for tests of the seam),
embedded models trained by the project and shipped inside the package, and real presets found on local disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from specterbench.catalog import embedded
from specterbench.catalog.checkpoint import load_checkpoint as load_local_checkpoint
from specterbench.catalog.checkpoint import read_config, weight_files
from specterbench.catalog.tiny import TINY_FAMILIES, tiny_random
from specterbench.errors import ModelError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    family: str
    description: str
    load: Callable[[], tuple[torch.nn.Module, object]]  # -> (model in eval mode, tokenizer or None)
    kind: str = "random"  # random | embedded | preset | local
    geometry: str | None = None  # the real model it stands in for: ``--geometry auto`` prices it at that size


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
    stand_in = stand_in_of(preset)
    raise ModelError(
        f"{preset}: no local checkpoint of {' or '.join(repo_ids)}; looked in {'; '.join(looked)}. Download it "
        f"where there is network (`huggingface-cli download {repo_ids[0]}`) and pass --model-path DIR or set "
        f"{MODEL_PATH_ENV}, or run the shipped model priced at its sizes: make bench MODEL={stand_in} "
        f"GEOMETRY={preset}")


def stand_in_of(preset: str) -> str:
    """The shipped stand-in whose routing stands in for ``preset`` (priced at the preset's sizes)."""
    stand_in = EMBEDDED_STAND_IN.get(preset, "tiny-qwen-moe")
    return stand_in if stand_in in embedded.EMBEDDED_MODELS else "tiny-qwen-moe"


def checkpoint_or_stand_in(preset: str) -> str | None:
    """None when ``preset``'s checkpoint is on this machine; else the one line that says the shipped stand-in runs
    in its place, priced at the preset's sizes, and how to run the real one."""
    try:
        resolve_checkpoint(preset)
        return None
    except ModelError:
        repo = REAL_PRESETS[preset][0][0]
        return (f"no local checkpoint of {repo}: running the shipped stand-in {stand_in_of(preset)} priced at "
                f"{preset}'s sizes (a modeled projection); for the real model give --model-path DIR (make bench "
                f"MODEL={preset} BENCH_ARGS=\"--model-path DIR\")")


def load_checkpoint(path, dtype=torch.bfloat16):
    """Load a local checkpoint, shard by shard into an uninitialised model (host RAM ≈ the model's own bytes;
    see :mod:`specterbench.catalog.checkpoint`); per-expert tensors land in the fused layout as they are read."""
    model, tokenizer = load_local_checkpoint(path, dtype)
    return model.eval(), tokenizer


def check_model_path(path) -> None:
    """Cheap checks of a checkpoint folder before anything loads: config.json parses, the family is supported,
    weight files are there. Raises a one-line :class:`ModelError`."""
    read_config(path)
    weight_files(path)


def local_spec(path) -> ModelSpec:
    """A model spec for any local checkpoint of a supported family (``--model-path DIR`` alone): the family
    from its config.json, the geometry from the config, the tokenizer from the directory. Checked now, so a bad
    directory is a one-line :class:`ModelError` before any model is built."""
    path = Path(path).expanduser().resolve()
    config = read_config(path)
    weight_files(path)
    experts = (getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
               or getattr(config, "n_routed_experts", None))
    return ModelSpec(name=f"local:{path.name}", family=config.model_type, kind="local",
                     description=f"{config.model_type} checkpoint at {path} ({config.num_hidden_layers} layers, "
                                 f"{experts} experts, top-{getattr(config, 'num_experts_per_tok', '?')})",
                     load=lambda: load_checkpoint(path))


def preset_specs() -> list[ModelSpec]:
    return [
        ModelSpec(name=name, family=family, kind="preset",
                  description=f"{repo_ids[0]} from a local path or the HF cache (offline)",
                  load=lambda name=name: load_checkpoint(resolve_checkpoint(name)))
        for name, (repo_ids, family) in REAL_PRESETS.items()
    ]


def embedded_specs() -> list[ModelSpec]:
    return [ModelSpec(name=name, family=embedded.STAND_INS[name].family, kind="embedded",
                      geometry=embedded.STAND_INS[name].geometry,
                      description="trained by the project on public-domain Shakespeare; ships in the package",
                      load=lambda name=name: embedded.load(name))
            for name in embedded.EMBEDDED_MODELS]
