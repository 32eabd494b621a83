"""The decoded reference of a run, kept inspectable: ``reference.jsonl`` and the workload line of the summary.

Every run directory keeps, per (model, workload, decode setting), the reference tokens of every prompt and
their decoded text, one JSON object per prompt::

    {"model": "tiny-qwen-moe", "workload": "shakespeare-heldout-v1", "decode": {"mode": "sample", ...},
     "decode_label": "sample T=1 seed=0", "prompt": "p00", "prompt_ids": [...], "tokens": [...],
     "text": "...", "adjacent_reuse": 0.61, "margins": [0.48, 1.33, ...]}

and the summary prints one workload line per (model, workload, decode setting): the share of repeated
8-grams among the generated tokens (a degenerate loop scores near 1; real text ≈ 0.01) and adjacent-token
expert reuse (the fraction of a decode token's experts that the previous token used in the same layer).
"""

from __future__ import annotations

import json
from pathlib import Path

from specterbench.engine.sampling import DecodeSetting

REFERENCE_FILE = "reference.jsonl"
NGRAM = 8


def repeated_ngram_share(sequences, n: int = NGRAM) -> float | None:
    """Share of the n-grams of the generated sequences that already occurred earlier in the same sequence."""
    repeated = total = 0
    for seq in sequences:
        seen = set()
        for i in range(len(seq) - n + 1):
            gram = tuple(seq[i:i + n])
            total += 1
            if gram in seen:
                repeated += 1
            seen.add(gram)
    return repeated / total if total else None


def adjacent_reuse(trace, top_k: int) -> float | None:
    """Mean |E_t ∩ E_t-1| / k over consecutive decode tokens of each MoE layer.

    ``trace``: the reference routing trace, ``(moe_layer, experts)`` per layer call; calls routing more than
    ``top_k`` experts are multi-token passes (the prefill) and start a new run of decode tokens.
    """
    previous: dict[int, set] = {}
    overlap = count = 0
    for layer, experts in trace:
        current = set(experts)
        if len(current) > top_k:
            previous.pop(layer, None)
            continue
        before = previous.get(layer)
        if before is not None:
            overlap += len(current & before)
            count += top_k
        previous[layer] = current
    return overlap / count if count else None


def write_reference(run_dir: Path, *, model: str, workload: str, decode: DecodeSetting, prompts, reference,
                    tokenizer, top_k: int) -> Path:
    """Append the reference of (model, workload, decode) to ``reference.jsonl`` unless it is already there."""
    path = Path(run_dir) / REFERENCE_FILE
    key = (model, workload, decode.label)
    if key in {(r["model"], r["workload"], r["decode_label"]) for r in read_reference(path)}:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for pid, ids in prompts:
            tokens = list(reference.tokens[pid])
            f.write(json.dumps({
                "model": model, "workload": workload, "decode": decode.to_dict(), "decode_label": decode.label,
                "prompt": pid, "prompt_ids": list(ids), "tokens": tokens,
                "text": tokenizer.decode(tokens) if tokenizer is not None else None,
                "adjacent_reuse": adjacent_reuse(reference.traces[pid], top_k),
                # top-2 score gap of each reference token (generated order), where the reference pass recorded it
                "margins": _margins(reference, pid, len(ids), len(tokens)),
            }) + "\n")
    return path


def _margins(reference, pid: str, prompt_len: int, n: int) -> list[float] | None:
    by_position = reference.margins.get(pid)
    if not by_position:
        return None
    return [round(float(by_position[prompt_len + i]), 6) if (prompt_len + i) in by_position else None
            for i in range(n)]


def read_reference(path: Path) -> list[dict]:
    """The entries of a ``reference.jsonl`` (a partial trailing line, from a killed run, is skipped)."""
    path = Path(path)
    if path.is_dir():
        path = path / REFERENCE_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def workload_lines(run_dir: Path) -> list[str]:
    """One line per (model, workload, decode setting) of the run's reference."""
    groups: dict[tuple, list[dict]] = {}
    for entry in read_reference(run_dir):
        groups.setdefault((entry["model"], entry["workload"], entry["decode_label"]), []).append(entry)
    lines = []
    for (model, workload, label), entries in sorted(groups.items()):
        share = repeated_ngram_share([e["tokens"] for e in entries])
        reuse = [e["adjacent_reuse"] for e in entries if e.get("adjacent_reuse") is not None]
        lines.append(
            f"Workload: {model} · {workload} · {len(entries)} prompts × {len(entries[0]['tokens'])} tokens · "
            f"decode {label} · repeated {NGRAM}-grams {_fmt(share)} · adjacent-token expert reuse "
            f"{_fmt(sum(reuse) / len(reuse) if reuse else None)}")
    return lines


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"
