"""Generate the packaged prompt sets (deterministic).

    specterbench make-workloads [--out specterbench/bench/workloads] [--check]

* ``shakespeare-heldout-v1``: 40 prompts, 8 from each held-out work (never seen in training).
* ``calibration-v1``: 37 prompts, one from each training work (for profiling, e.g. static placement).

Each prompt starts at the beginning of a speech (or stanza), takes whole lines until it holds
between 24 and 64 tokens of the embedded tokenizer, and is written as one JSON line
``{"id", "text", "source"}``. Changing the output means a new version suffix (see workloads/README.md);
``--check`` regenerates in memory and fails if the packaged files differ.
"""

from __future__ import annotations

import json
from pathlib import Path

from specterbench.catalog import corpus as data
from specterbench.studies import tokenizer as tok_mod

MIN_TOKENS, MAX_TOKENS, TARGET_TOKENS = 24, 64, 36
HELDOUT_PER_WORK = 8
SKIP_FRONT = 0.06  # skip the front matter (title, dramatis personae)
OUT_DIR = Path(__file__).resolve().parent.parent / "bench" / "workloads"
HELDOUT_NAME, CALIBRATION_NAME = "shakespeare-heldout-v1", "calibration-v1"


def _tokenizer():

    tok = tok_mod.train_tokenizer()
    tok.model_max_length = 10**9
    return tok


def _ntok(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def _paragraphs(work: data.Work) -> list[str]:
    paras = [p for p in work.text.split("\n\n") if p.strip()]
    start = int(len(paras) * SKIP_FRONT)
    return paras[start:]


def _candidate(paragraph: str) -> bool:
    lines = [ln for ln in paragraph.split("\n") if ln.strip()]
    if len(lines) < 2 or sum(len(ln) for ln in lines) < 80:
        return False
    first = lines[0].strip()
    return not first.startswith(("[", "ACT", "Scene", "SCENE"))


def _prompt_from(tok, paras: list[str], i: int) -> str | None:
    """Whole lines from paragraph i onward, between MIN and MAX tokens (stops once ≥ TARGET)."""
    lines: list[str] = []
    for para in paras[i : i + 4]:
        for j, line in enumerate(para.split("\n")):
            candidate = "\n".join(lines + ([""] if lines and j == 0 else []) + [line])
            n = _ntok(tok, candidate)
            if n > MAX_TOKENS:
                break
            lines = candidate.split("\n")
            if n >= TARGET_TOKENS:
                break
        else:
            continue
        break
    text = "\n".join(lines).strip("\n")
    if text and "[" not in text.split("\n")[-1] and MIN_TOKENS <= _ntok(tok, text) <= MAX_TOKENS:
        return text
    return None


def _pick(tok, work: data.Work, n: int, offset: float = 0.5) -> list[str]:
    """n prompts from evenly spaced candidate speeches (position fraction (j+offset)/n)."""
    paras = _paragraphs(work)
    cands = [i for i, p in enumerate(paras) if _candidate(p)]
    out: list[str] = []
    for j in range(n):
        pos = int(len(cands) * (j + offset) / n)
        for c in cands[pos:] + cands[:pos]:  # next usable candidate
            text = _prompt_from(tok, paras, c)
            if text is not None and text not in out:
                out.append(text)
                break
    if len(out) != n:
        raise RuntimeError(f"could only draw {len(out)} of {n} prompts from {work.stem}")
    return out


def build() -> dict[str, list[dict]]:
    tok = _tokenizer()
    heldout = []
    for w in data.heldout_works():
        short = w.stem.removesuffix("_gut")
        for j, text in enumerate(_pick(tok, w, HELDOUT_PER_WORK)):
            heldout.append({"id": f"{short}-{j:02d}", "text": text, "source": w.title})
    calibration = []
    golden = 0.6180339887
    for i, w in enumerate(data.train_works()):
        short = w.stem.removesuffix("_gut")
        offset = (0.15 + 0.7 * ((i * golden) % 1.0))  # spread positions across works
        (text,) = _pick(tok, w, 1, offset=offset)
        calibration.append({"id": f"{short}-00", "text": text, "source": w.title})
    return {HELDOUT_NAME: heldout, CALIBRATION_NAME: calibration}


def dump(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
