"""Prefill and generation tests in llama-bench's vocabulary: ``pp512`` (a 512-token prompt processed), ``tg128``
(128 new tokens generated), ``tg128 @ d4096`` (after 4096 tokens of context). One table row per test of a cell,
tokens/s as mean ± standard deviation over the requests of every repeat (llama-bench's ``avg_ts ± stddev_ts``),
ms/token beside it.

A cell's requests each prefill a prompt (its time to the first token is the ``pp`` test) and then generate the
rest of their new tokens one forward at a time or in speculative windows (the ``tg`` test: tokens after the first
over their time). Rows written before per-request rates were kept fall back to the cell's own figures, with no
standard deviation.
"""

from __future__ import annotations

import statistics

from specterbench.analysis.report import budget_text, lossless_text, note_lines, status_text
from specterbench.runfiles.results import ResultRow

STATUS_WIDTH = 24  # a failed row's reason, cut to fit a 160-column terminal (summary.md has it whole)


def names_of_tests(row: ResultRow) -> tuple[str, str]:
    """``(prefill test, generation test)`` of a row, e.g. ``("pp512 @ d4096", "tg128 @ d4096")``. Prompts of the
    workload's own lengths name their range (``pp12-40``)."""
    lengths = row.samples.get("prompt_tokens") or []
    if row.prompt_tokens:
        pp = f"pp{row.prompt_tokens}"
    elif lengths:
        lo, hi = min(lengths), max(lengths)
        pp = f"pp{lo}" if lo == hi else f"pp{lo}-{hi}"
    else:
        pp = "pp"
    depth = f" @ d{row.depth_tokens}" if row.depth_tokens else ""
    return pp + depth, f"tg{row.new_tokens}{depth}"


def _rates(row: ResultRow) -> tuple[list[float], list[float]]:
    """Per-request prefill and generation tokens/s of a row (a row without them: the cell's own figures)."""
    if "tg_tokens_per_s" in row.samples:
        return list(row.samples.get("pp_tokens_per_s") or []), list(row.samples["tg_tokens_per_s"])
    return [], [row.tokens_per_s] if row.tokens_per_s else []


def _mean_sd(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def _model(r: ResultRow) -> str:
    return r.model + ("" if r.precision == "bf16" else f", {r.precision}")


def _clock(r: ResultRow) -> str:
    return {"modeled": f"modeled · {r.profile}", "measured": "measured (CUDA events)",
            "host": "host wall only"}[r.clock] + (" · CUDA graphs" if r.cuda_graphs == "used" else "")


def table_of_tests(rows: list[ResultRow]):
    """The tests of ``rows``: one line per (model, strategy, budget, test), repeats pooled. Columns: ``t/s`` and
    ``t/s sd`` (mean and standard deviation over requests: per user at a batch), ``t/s total`` (every request of the
    batch together: per GPU), ``ms/tok`` (mean of each request's ms per token),
    ``TTFT ms`` (prefill, median), and for generation the cell's hit rate, link bytes and stall (medians)."""
    import pandas as pd

    groups: dict[tuple, list[ResultRow]] = {}
    for r in rows:
        pp, tg = names_of_tests(r)
        for test in (pp, tg):
            key = (_model(r), r.display_label, budget_text(r), _clock(r), r.workload, r.batch, test)
            groups.setdefault(key, []).append(r)
    records = []
    for (model, strategy, budget, clock, workload, batch, test), members in groups.items():
        generation = test.startswith("tg")
        rates = [x for r in members for x in _rates(r)[1 if generation else 0]]
        mean, sd = _mean_sd(rates)
        first = members[0]

        def median(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None

        records.append({
            "model": model, "strategy": strategy, "budget": budget, "_frac": first.budget_fraction, "clock": clock,
            "workload": workload, "batch": batch, "test": test, "_gen": generation,
            "_p": first.prompt_tokens or 0, "_d": first.depth_tokens,
            "t/s": mean, "t/s sd": sd, "ms/tok": statistics.fmean(1e3 / x for x in rates) if rates else None,
            "t/s total": median([r.tokens_per_s_total for r in members]) if generation else None,
            "TTFT ms": None if generation else median([r.ttft_ms for r in members]),
            "hit rate": median([r.hit_rate for r in members]) if generation else None,
            "H2D KB/tok": median([None if r.decode_h2d_bytes_per_token is None else r.decode_h2d_bytes_per_token / 1e3
                                  for r in members]) if generation else None,
            "stall ms/tok": median([r.stall_ms_per_token for r in members]) if generation else None,
            "lossless": lossless_text(first), "status": status_text(first),
        })
    df = pd.DataFrame(records)
    if df.empty:
        return df
    for col in ("t/s", "t/s sd", "t/s total", "ms/tok", "TTFT ms", "hit rate", "H2D KB/tok", "stall ms/tok"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df = df.sort_values(["model", "_frac", "batch", "_gen", "_p", "_d", "ms/tok"], na_position="last", kind="stable")
    return df.drop(columns=["_frac", "_gen", "_p", "_d"]).reset_index(drop=True)


#: columns said once above the markdown table when every line has the same value
SHARED = ("model", "clock", "workload")


def render_tests_markdown(rows: list[ResultRow]) -> str:
    """The tests as llama-bench prints them: ``t/s`` as ``mean ± sd``, what every line shares said once above."""
    df = table_of_tests(rows)
    if df.empty:
        return "(no rows)\n"
    header = [f"{col}: {df[col].iloc[0]}" for col in SHARED if df[col].nunique() == 1]
    header += [f"geometry: {g}" for g in sorted({r.geometry_label for r in rows if r.geometry != r.model})]
    if all(r.clock == "host" for r in rows):
        header.append("TPOT: not measured (no CUDA device); t/s and ms/tok are this machine's wall time")
    df = df.drop(columns=[c for c in SHARED if df[c].nunique() == 1])
    df = df.drop(columns=[c for c in ("TTFT ms", "hit rate", "H2D KB/tok", "stall ms/tok") if df[c].isna().all()])
    if (df["batch"] == 1).all():  # no batch axis: per user and per GPU are one figure
        df = df.drop(columns=["batch", "t/s total"])
    df["t/s"] = [("-" if m != m else f"{m:.2f} ± {s:.2f}") for m, s in zip(df["t/s"], df["t/s sd"])]
    df = df.drop(columns=["t/s sd"])
    df["budget"] = [b.split(" (", 1)[0] for b in df["budget"]]
    df["status"] = [s if len(s) <= STATUS_WIDTH else s[: STATUS_WIDTH - 1] + "…" for s in df["status"]]
    df = df.astype(object).where(df.notna(), None)  # a test without the figure: an empty cell, not "nan"
    table = df.to_markdown(index=False, floatfmt=".3f") + "\n"
    return ("".join(f"{line}\n" for line in header) + table
            + "".join(f"{line}\n" for line in dict.fromkeys(note_lines(rows))))  # a cell's note once, not per shape
