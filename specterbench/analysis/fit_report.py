"""``specterbench fit``'s answer: per card size the best strategy, its setting and tokens/s, as a table and a plot of
tokens/s against device memory per strategy (matplotlib, Agg canvas, the run plots' styles)."""

from __future__ import annotations

from pathlib import Path

from specterbench.analysis.plots import DPI, FIGSIZE, clock_label, draw_order, style
from specterbench.bench.device_memory import size_text
from specterbench.bench.fit import FitPoint, best


def _where(points: list[FitPoint]) -> tuple[str, str]:
    """(clock and profile, priced geometry) of the points that ran."""
    r = next((p.row for p in points if p.row is not None), None)
    if r is None:
        return "modeled", "-"
    return clock_label(r), r.geometry_label


def _released(p: FitPoint) -> bool:
    return p.row is not None and bool(p.row.extra.get("draft_released"))


def _short_geometry(points: list[FitPoint]) -> str:
    """``tiny-mixtral's routing priced at mixtral geometry (projection)`` or ``tiny-x (own geometry)``."""
    r = next((p.row for p in points if p.row is not None), None)
    if r is None:
        return ""
    if r.geometry == r.model:
        return f"{r.model} (own geometry)" + ("" if r.precision == "bf16" else f", {r.precision}")
    return (f"{r.model}'s routing priced at {r.geometry} geometry (projection)"
            + ("" if r.precision == "bf16" else f", {r.precision}"))


def fit_table(points: list[FitPoint]) -> str:
    """The markdown answer: a line per card size (best strategy, its setting, tokens/s, every strategy's tokens/s),
    then why each point that did not run did not, once per reason."""
    strategies = list(dict.fromkeys(p.strategy for p in points))
    clock, geometry = _where(points)
    lines = [f"tokens/s: modeled decode throughput ({clock}); geometry: {geometry}", "",
             "| card | best | setting | tok/s | " + " | ".join(strategies) + " |",
             "|:--|:--|:--|--:|" + "--:|" * len(strategies)]
    by = {(p.card_bytes, p.strategy): p for p in points}
    for size, top in best(points).items():
        cells = []
        for s in strategies:
            p = by.get((size, s))
            v = None if p is None else p.tokens_per_s
            cells.append("-" if v is None else f"{v:.2f}" + ("*" if _released(p) else ""))
        head = (f"| {size_text(size)} | {top.strategy} | {top.setting()} | {top.tokens_per_s:.2f} |" if top else
                f"| {size_text(size)} | nothing fits | - | - |")
        lines.append(head + " " + " | ".join(cells) + " |")
    if any(_released(p) for p in points):
        lines.append("\n\\* draft released: the speculative strategy dropped its draft and ran as its own "
                     "non-speculative ablation there")
    seen = set()
    for p in points:
        reason = p.reason or (None if p.row is None or p.row.status == "ok" else f"{p.row.status}: {p.row.error}")
        if reason and (p.strategy, reason) not in seen:
            seen.add((p.strategy, reason))
            lines.append(f"- {size_text(p.card_bytes)} · {p.strategy}: {reason}")
    return "\n".join(lines) + "\n"


def fit_plot(points: list[FitPoint], path: Path) -> Path | None:
    """Tokens/s against device memory (GB), one line per strategy; every point modeled, the profile and geometry
    named in the title and the axis label."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for p in points:
        if p.tokens_per_s is not None:
            lines.setdefault(p.strategy, []).append((p.card_bytes / 1e9, p.tokens_per_s))
    if not lines:
        return None
    clock, geometry = _where(points)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")  # no pyplot state, as the run plots
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    sizes = sorted({p.card_bytes for p in points})
    for s in draw_order(lines):
        xs, ys = zip(*sorted(lines[s]))
        released = sorted(p.card_bytes for p in points if p.strategy == s and _released(p))
        note = f" (draft released at {', '.join(size_text(n) for n in released)})" if released else ""
        ax.plot(xs, ys, label=s + note, **style(s).kwargs())
    ax.set_xticks([n / 1e9 for n in sizes], [size_text(n) for n in sizes], fontsize=7)
    ax.set_xlabel("device memory (card size): dense weights, KV cache, activations\nand the runtime reserve come "
                  "first, the experts get the rest", fontsize=8)
    ax.set_ylabel(f"decode tokens/s, {clock}")
    ax.set_title(f"Every point modeled · {clock}\n{_short_geometry(points)}", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
