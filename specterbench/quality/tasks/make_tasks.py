"""Generate the shipped lm-eval tasks from the embedded models' held-out works (deterministic).

    specterbench make-tasks [--out specterbench/quality/tasks] [--check]

Every item comes from :data:`specterbench.catalog.corpus.HELDOUT_WORKS` — whole plays the embedded models
never saw in training (neither did their tokenizer). Three tasks, one JSONL file each:

* ``shakespeare_scramble`` (multiple choice, 200 items, 40 per work): the speaker and up to three
  preceding lines of a speech, then the next line and three copies of it with two of its words swapped
  (a different pair in each); the model must prefer the original (chance 0.25). Scored by ``acc`` /
  ``acc_norm``.
* ``shakespeare_ppl`` (rolling log-likelihood, 50 passages, 10 per work): runs of whole speeches of
  400–800 characters. Scored by ``bits_per_byte``, ``byte_perplexity``, ``word_perplexity``.
* ``shakespeare_complete`` (generation, 100 items, 20 per work): a speech cut after two words that, in the
  *training* works, are followed by one particular word at least half of the time over at least 20
  occurrences ("I pray" → "you", "my good" → "lord"); the model writes the next word. Greedy, at most 4
  new tokens, the first word of the output compared by exact match. A model that learned the language of
  the training plays gets many right; chance is near zero. Items are chosen from corpus statistics, never
  from any model's answers.

Changing an item means a new task version (bump ``metadata.version`` in the YAML); ``--check``
regenerates in memory and fails if the packaged files differ.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from specterbench.catalog import corpus as data

OUT_DIR = Path(__file__).resolve().parent
SCRAMBLE_PER_WORK, PPL_PER_WORK, COMPLETE_PER_WORK = 40, 10, 20
SCRAMBLE_WORDS = (6, 12)  # words in a scrambled line, inclusive
SCRAMBLE_CONTEXT_LINES = 3
PPL_CHARS = (400, 800)
COMPLETE_MAX_CONTEXT_CHARS = 400
COMPLETE_MIN_COUNT, COMPLETE_MIN_SHARE = 20, 0.5  # the phrase in the training works: how often, how sure
COMPLETE_PER_PHRASE = 2  # per work, so that a few stock phrases do not fill the task

_HEADER = re.compile(r"^[A-Z][A-Z'&\- ]*[A-Z]\.$")  # "BRUTUS.", "SIR TOBY.", "FIRST WITCH."


def _is_break(para: str) -> bool:
    return para.lstrip().startswith(("ACT", "SCENE"))


def _speaker(para: str) -> str | None:
    first = para.split("\n", 1)[0].strip()
    if _is_break(para) or not _HEADER.match(first):
        return None
    return first


def _body(work) -> list[str]:
    """Paragraphs from the first act or scene heading on (drops title and dramatis personae)."""
    paras = [p.strip("\n") for p in work.text.split("\n\n") if p.strip()]
    start = next((i for i, p in enumerate(paras) if _is_break(p)), 0)
    return paras[start:]


def _spread(candidates: list, n: int, name: str, stem: str) -> list:
    """``n`` candidates at evenly spaced positions (position fraction (j + 0.5) / n)."""
    if len(candidates) < n:
        raise RuntimeError(f"{name}: only {len(candidates)} candidates in {stem}, need {n}")
    return [candidates[int(len(candidates) * (j + 0.5) / n)] for j in range(n)]


# ---- shakespeare_scramble ------------------------------------------------------------------------
def _scrambles(words: list[str], rng: random.Random, n: int = 3) -> list[str] | None:
    """``n`` distinct copies of the line, each with two of its words (different ones each time) swapped."""
    original = " ".join(words)
    pairs = [(i, j) for i in range(len(words)) for j in range(i + 1, len(words)) if words[i] != words[j]]
    rng.shuffle(pairs)
    seen, out = {original}, []
    for i, j in pairs:
        swapped = words[:]
        swapped[i], swapped[j] = swapped[j], swapped[i]
        text = " ".join(swapped)
        if text not in seen:
            seen.add(text)
            out.append(text)
            if len(out) == n:
                return out
    return None


def scramble_items(work) -> list[dict]:
    candidates = []
    for para in _body(work):
        speaker = _speaker(para)
        if speaker is None:
            continue
        lines = para.split("\n")[1:]
        for i, line in enumerate(lines):
            words = line.split()
            if "[" in line or "]" in line or not SCRAMBLE_WORDS[0] <= len(words) <= SCRAMBLE_WORDS[1]:
                continue
            before = [ln for ln in lines[max(0, i - SCRAMBLE_CONTEXT_LINES):i] if "[" not in ln]
            candidates.append((speaker, before, line))
    short = work.stem.removesuffix("_gut")
    items = []
    for j, (speaker, before, line) in enumerate(_spread(candidates, SCRAMBLE_PER_WORK, "scramble", work.stem)):
        rng = random.Random(f"shakespeare_scramble:{short}:{j}")
        original = " ".join(line.split())
        fakes = _scrambles(line.split(), rng)
        if fakes is None:
            raise RuntimeError(f"cannot scramble {line!r}")
        choices = [original] + fakes
        rng.shuffle(choices)
        items.append({
            "id": f"{short}-{j:03d}",
            "context": "\n".join([speaker] + before) + "\n",
            "choices": [c + "\n" for c in choices],
            "label": choices.index(original),
            "source": work.title,
        })
    return items


# ---- shakespeare_ppl -----------------------------------------------------------------------------
def ppl_items(work) -> list[dict]:
    paras = _body(work)
    candidates = []
    for i, para in enumerate(paras):
        if _speaker(para) is None:
            continue
        lines: list[str] = []  # whole lines of consecutive paragraphs, "" between paragraphs
        for nxt in paras[i:]:
            if _is_break(nxt):
                break
            more = ([""] if lines else []) + nxt.split("\n")
            fits = [k for k in range(1, len(more) + 1) if len("\n".join(lines + more[:k])) <= PPL_CHARS[1]]
            lines += more[:fits[-1]] if fits else []
            if len(fits) < len(more) or len("\n".join(lines)) >= PPL_CHARS[0]:
                break
        while lines and (not lines[-1] or _HEADER.match(lines[-1])):  # never end on a bare header
            lines.pop()
        text = "\n".join(lines)
        if PPL_CHARS[0] <= len(text) <= PPL_CHARS[1]:
            candidates.append(text)
    short = work.stem.removesuffix("_gut")
    return [{"id": f"{short}-{j:02d}", "text": text, "source": work.title}
            for j, text in enumerate(_spread(candidates, PPL_PER_WORK, "ppl", work.stem))]


# ---- shakespeare_complete ------------------------------------------------------------------------
_WORD = re.compile(r"[A-Za-z']+")


def _speech_lines(work):
    """``(speaker, lines)`` of every speech; stage directions and headers are not lines of a speech."""
    for para in _body(work):
        speaker = _speaker(para)
        if speaker is not None:
            yield speaker, [ln for ln in para.split("\n")[1:] if "[" not in ln and "]" not in ln]


def _triples(line: str):
    """``(key, next word match)`` for each word preceded by two words, all three joined by single spaces."""
    words = list(_WORD.finditer(line))
    for a, b, c in zip(words, words[1:], words[2:]):
        if line[a.end():b.start()] == " " and line[b.end():c.start()] == " ":
            yield (a.group().lower(), b.group().lower()), c


def phrase_table(works) -> dict[tuple[str, str], tuple[str, float, int]]:
    """For each two-word phrase of the training works: its most frequent next word, that word's share, count."""
    from collections import Counter, defaultdict

    nexts: dict = defaultdict(Counter)
    for work in works:
        for line in work.text.split("\n"):
            for key, c in _triples(line):
                nexts[key][c.group().lower()] += 1
    table = {}
    for key, counter in nexts.items():
        total = sum(counter.values())
        word, n = counter.most_common(1)[0]
        table[key] = (word, n / total, total)
    return table


def complete_items(work, table) -> list[dict]:
    candidates = []
    for speaker, lines in _speech_lines(work):
        for i, line in enumerate(lines):
            for key, c in _triples(line):
                word, share, total = table.get(key, (None, 0.0, 0))
                if (word == c.group().lower() and share >= COMPLETE_MIN_SHARE and total >= COMPLETE_MIN_COUNT
                        and len(c.group()) > 1):
                    before = lines[:i] + [line[: c.start()].rstrip(" ")]
                    while len("\n".join([speaker] + before)) > COMPLETE_MAX_CONTEXT_CHARS and len(before) > 1:
                        before = before[1:]
                    candidates.append(("\n".join([speaker] + before), c.group(), key))
    short = work.stem.removesuffix("_gut")
    items, per_key = [], {}
    n = len(candidates)
    for j in range(COMPLETE_PER_WORK):  # evenly spread, at most COMPLETE_PER_PHRASE items per phrase
        start = int(n * (j + 0.5) / COMPLETE_PER_WORK)
        for context, target, key in candidates[start:] + candidates[:start]:
            if per_key.get(key, 0) < COMPLETE_PER_PHRASE and all(context != it["context"] for it in items):
                per_key[key] = per_key.get(key, 0) + 1
                items.append({"id": f"{short}-{j:02d}", "context": context, "target": target,
                              "source": work.title})
                break
    if len(items) != COMPLETE_PER_WORK:
        raise RuntimeError(f"complete: only {len(items)} items from {work.stem}")
    return items


# ---- build / check -------------------------------------------------------------------------------
def build() -> dict[str, list[dict]]:

    works = data.heldout_works()
    table = phrase_table(data.train_works())
    return {
        "shakespeare_scramble": [item for w in works for item in scramble_items(w)],
        "shakespeare_ppl": [item for w in works for item in ppl_items(w)],
        "shakespeare_complete": [item for w in works for item in complete_items(w, table)],
    }


def dump(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
