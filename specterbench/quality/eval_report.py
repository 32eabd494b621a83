"""The quality table of ``specterbench eval``: rows as a table (pandas at the edge), markdown and ``eval.md``."""

from __future__ import annotations

from pathlib import Path

from specterbench.quality.eval_rows import DRAFT, REFERENCE, EvalRow


def _budget_cell(r: EvalRow) -> str:
    if r.kind == REFERENCE:
        return "all resident"
    if r.kind == DRAFT:
        total, draft = r.info.get("total_expert_bytes"), r.info.get("draft_device_bytes")
        return f"draft {draft / total:.0%}" if total and draft else "-"
    return "-" if r.budget_fraction is None else f"{r.budget_fraction:.0%}"


def quality_table(rows: list[EvalRow]):
    import pandas as pd

    records = []
    for r in rows:
        direction = {True: "↑", False: "↓"}.get(r.higher_is_better, "")
        records.append({
            "model": r.model,
            "variant": r.variant if r.kind != DRAFT else f"draft ({r.info.get('draft_quant', '4-bit')}, alone)",
            "budget": _budget_cell(r),
            "task": r.task,
            "metric": f"{r.metric} {direction}".strip() if r.metric else "-",
            "score": "-" if r.score is None else (
                f"{r.score:.4f}" + (f" ± {r.stderr:.4f}" if r.stderr is not None else "")),
            "Δ vs reference": "-" if r.delta is None else f"{r.delta:+.4f}",
            "check": r.check if r.status == "ok" else (r.check if r.status == "mismatch" else f"ERROR: {r.error}"),
        })
    return pd.DataFrame(records)


def render_markdown(rows: list[EvalRow]) -> str:
    df = quality_table(rows)
    if df.empty:
        return "(no rows)\n"
    return df.to_markdown(index=False) + "\n"


def write_report(run_dir: Path, rows: list[EvalRow], *, limit, budget: str, profile: str) -> Path:
    lines = [f"# specterbench eval {run_dir.name}", "",
             "Quality of each strategy against the **reference** (the target, every expert resident) on the same "
             "lm-eval tasks. Lossless strategies must match the reference sample for sample (`identical`); the "
             "**draft** row is the 4-bit self-draft alone, i.e. what quantization alone costs. ↑/↓: direction of "
             "the metric.", "",
             f"Budget {budget} of expert bytes; modeled clock profile `{profile}` (speed is not measured here); "
             f"limit {limit if limit else 'none'} samples per task.", "", render_markdown(rows)]
    path = run_dir / "eval.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
