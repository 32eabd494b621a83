"""The batch axis's plot: tokens/s per user against tokens/s per GPU across batch sizes, one line per strategy and
budget (the vLLM sweep's Pareto view: up and to the right is better; a point's label is its batch size)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from specterbench.analysis.plot_style import clock_label, draw_order, figure, style, title
from specterbench.runfiles.results import ResultRow


def pareto_plot(rows: list[ResultRow], path: Path) -> Path | None:
    """``rows`` of one model, geometry, profile and clock; None unless some strategy ran at two batch sizes."""
    cells: dict[tuple[str, float, int], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r.tokens_per_s_total and r.tokens_per_s_per_user:
            cells[(r.strategy, round(r.budget_fraction * 100, 2), r.batch)].append(
                (r.tokens_per_s_total, r.tokens_per_s_per_user))
    lines: dict[tuple[str, float], list[tuple[int, float, float]]] = defaultdict(list)
    for (s, budget, batch), pts in sorted(cells.items()):
        lines[(s, budget)].append((batch, statistics.median(p[0] for p in pts), statistics.median(p[1] for p in pts)))
    if not any(len(pts) > 1 for pts in lines.values()):
        return None
    fig, ax = figure()
    budgets = sorted({b for _, b in lines})
    dashes = ["-", "--", ":", "-."]
    for s in draw_order({s for s, _ in lines}):
        for budget in budgets:
            pts = lines.get((s, budget))
            if not pts:
                continue
            st = style(s)
            ls = dashes[budgets.index(budget) % len(dashes)]
            ax.plot([p[1] for p in pts], [p[2] for p in pts], label=f"{s} @ {budget:g}%",
                    **{**st.kwargs(), "linestyle": ls})
            for batch, x, y in pts:
                ax.annotate(f"B={batch}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    from matplotlib.ticker import NullFormatter

    r = rows[0]
    modeled = f", {clock_label(r)}" if r.clock == "modeled" else ""
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"tokens/s per GPU (every request of the batch{modeled})")
    ax.set_ylabel("tokens/s per user (each request's own)")
    ax.set_title(title(r) + " · across batch sizes", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncols=2 if len(lines) > 7 else 1)
    fig.savefig(path)
    return path
