"""Small MoE language models trained by the project on public-domain Shakespeare, shipped in the package.

    from specterbench.catalog import embedded
    model, tokenizer = embedded.load("tiny-mixtral")            # float32, eval mode, fully offline
    model, tokenizer = embedded.load("tiny-qwen-moe", dtype=torch.bfloat16)
    model, tokenizer = embedded.load("tiny-deepseek")           # DeepSeek-V2 family, first layer dense

Each model directory (``model_dir(name)``) is self-contained: config.json, model.safetensors (bf16),
tokenizer.json + tokenizer_config.json, training.json and CARD.md. Rebuild them with ``make models``
(``python -m specterbench train --model NAME``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specterbench.errors import ModelError, UsageError

EMBEDDED_MODELS: tuple[str, ...] = ("tiny-mixtral", "tiny-qwen-moe", "tiny-deepseek")


@dataclass(frozen=True, slots=True)
class StandIn:
    """What an embedded model stands in for: its transformers family, the geometry preset ``--geometry auto``
    prices it at, and the key of its real model in ``published_routing.json``."""

    family: str
    geometry: str
    published: str


STAND_INS: dict[str, StandIn] = {
    "tiny-mixtral": StandIn("mixtral", "mixtral", "mixtral-8x7b"),
    "tiny-qwen-moe": StandIn("qwen2_moe", "qwen-moe", "qwen1.5-moe-a2.7b"),
    "tiny-deepseek": StandIn("deepseek_v2", "deepseek-v2-lite", "deepseek-v2-lite"),
}

_MODELS_DIR = Path(__file__).resolve().parent / "stand_ins"
_REBUILD = "reinstall specterbench or run `make models`"


def model_dir(name: str) -> Path:
    """Directory of an embedded model inside the installed package (may not exist if not built)."""
    if name not in EMBEDDED_MODELS:

        raise UsageError(f"unknown embedded model {name!r}: choose one of {', '.join(EMBEDDED_MODELS)}")
    return _MODELS_DIR / name


def _check_safetensors(path: Path) -> None:
    """Open the header and check the file holds every byte it declares (catches truncation/corruption)."""
    from safetensors import safe_open

    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than the 8-byte header length")
            n = int.from_bytes(head, "little")
            if n <= 0 or 8 + n > size:
                raise ValueError(f"header length {n} exceeds file size {size}")
            header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end != size:
            raise ValueError(f"file is {size} bytes, header declares {8 + n + end}")
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as err:  # noqa: BLE001 - any failure here means an unusable file
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelError(f"{path} is corrupted or truncated ({reason}): {_REBUILD}") from None


def load(name: str, dtype: torch.dtype = torch.float32, path: str | os.PathLike | None = None):
    """Load an embedded model and its tokenizer offline, in eval mode.

    ``path`` overrides the package directory (used by the trainer and tests). Returns
    ``(model, tokenizer)``; raises :class:`ModelError` with a one-line message naming the file and
    the fix when files are missing, corrupted, or inconsistent.
    """
    directory = Path(path) if path is not None else model_dir(name)
    if not directory.is_dir():
        raise ModelError(f"embedded model {name!r} not found at {directory}: {_REBUILD}")
    for required in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (directory / required).is_file():
            raise ModelError(f"{directory / required} is missing: {_REBUILD}")
    weights = directory / "model.safetensors"
    _check_safetensors(weights)

    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    try:
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except Exception as err:  # noqa: BLE001
        raise ModelError(f"{directory / 'config.json'} is unreadable ({type(err).__name__}): {_REBUILD}") from None
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    except Exception as err:  # noqa: BLE001
        raise ModelError(f"{directory / 'tokenizer.json'} is unreadable ({type(err).__name__}): {_REBUILD}") from None
    if len(tokenizer) != config.vocab_size:
        raise ModelError(
            f"{directory / 'tokenizer.json'} has {len(tokenizer)} tokens but {directory / 'config.json'} "
            f"says vocab_size={config.vocab_size}: the files come from different builds; {_REBUILD}"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), config=config, dtype=dtype, local_files_only=True
        )
    except Exception as err:  # noqa: BLE001
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelError(f"{weights} could not be loaded ({reason}): {_REBUILD}") from None
    calibration = load_calibration(directory)
    if calibration is not None:  # the draft-fidelity calibration every draft of this model takes by default
        model.config.draft_error_scale = calibration.error_scale
        model.config.draft_head_error_scale = calibration.head_error_scale
    model.eval()
    return model, tokenizer


#: the draft-fidelity calibration stored beside a stand-in's weights
CALIBRATION_FILE = "draft_calibration.json"


@dataclass(frozen=True, slots=True)
class DraftCalibration:
    """A model's draft-fidelity calibration: the scale on its draft's quantization error and how it was fitted."""

    error_scale: float  # on the routed experts' quantization error
    head_error_scale: float  # on the output head's, in a draft's dense copy
    realized_rms_error_ratio: float  # RMS(draft − W) / RMS(Q(W) − W) over the routed experts, int4/g128
    fitted_on: str  # the text and amount
    target: str  # the anchor fitted to
    measured: dict  # the fit's measured points: {scale: exact_set}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"


def load_calibration(directory: str | Path) -> DraftCalibration | None:
    """The calibration stored with a model (None when it has none)."""
    path = Path(directory) / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except ValueError as err:
        raise ModelError(f"{path} is not JSON ({err}): refit it with `specterbench fidelity "
                         f"--model NAME --fit`") from None
    try:
        return DraftCalibration(error_scale=float(raw["error_scale"]), head_error_scale=float(raw["head_error_scale"]),
                           realized_rms_error_ratio=float(raw.get("realized_rms_error_ratio", 1.0)),
                           fitted_on=str(raw["fitted_on"]), target=str(raw["target"]),
                           measured=dict(raw.get("measured", {})))
    except (KeyError, TypeError, ValueError) as err:
        raise ModelError(f"{path} is malformed ({type(err).__name__}: {err}): refit it with `specterbench "
                         f"fidelity --model NAME --fit`") from None


__all__ = ["EMBEDDED_MODELS", "STAND_INS", "StandIn", "DraftCalibration", "load_calibration", "model_dir", "load"]
