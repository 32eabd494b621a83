"""What every plot of a run shares: one style per strategy (a built-in's fixed colour, marker and line; any other
name's derived from a hash of it), the drawing order (Specter last, in front), the canvas and the title that names
the model, its geometry and the clock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from specterbench.runfiles.results import ResultRow

FIGSIZE = (6.4, 4.2)
DPI = 120


@dataclass(frozen=True, slots=True)
class Style:
    color: str
    marker: str
    linestyle: str
    linewidth: float = 1.4
    markersize: float = 5.0
    zorder: float = 2.0

    def kwargs(self) -> dict:
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle,
                "linewidth": self.linewidth, "markersize": self.markersize, "zorder": self.zorder}


# Specter: the only thick red line, drawn in front; the others are distinct in colour *and* marker *and* dash,
# so a grey-scale print or a colour-blind reader still tells them apart (Okabe-Ito and tab colours).
SPECTER = Style("#d62728", "*", "-", linewidth=2.8, markersize=11.0, zorder=10.0)
STYLES = {
    "specter": SPECTER,
    "specter-artifact": Style("#e377c2", "P", "-", linewidth=1.8, markersize=7.0, zorder=6.0),
    "specmoeoff": Style("#8c564b", "X", "--", markersize=6.0, zorder=5.0),
    "spec-decode": Style("#9467bd", "D", "--", markersize=6.0, zorder=5.0),
    "spec-host": Style("#c5b0d5", "D", "-", linewidth=1.8, markersize=6.0, zorder=6.0),
    "oracle": Style("#000000", "v", ":", zorder=4.0),
    "oracle-spec": Style("#393b79", "^", ":", zorder=4.0),
    "resident": Style("#7f7f7f", "s", "--", zorder=3.0),
    "lru": Style("#1f77b4", "o", "-"),
    "lfru": Style("#17becf", "^", "-."),
    "lfu": Style("#bcbd22", "<", "--"),
    "static": Style("#ff7f0e", "s", "-"),
    "cpu-experts": Style("#2ca02c", "h", "--"),
    "activation-aware": Style("#003f5c", "p", "-."),
    "next-layer-gate": Style("#e6ab02", ">", ":"),
    "mixed-precision": Style("#a6761d", "d", "-."),
    "on-demand": Style("#444444", "x", ":"),
}
_FALLBACK_COLORS = ("#66a61e", "#e7298a", "#7570b3", "#1b9e77", "#d95f02", "#a65628", "#f781bf", "#999999")
_FALLBACK_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "h")
_FALLBACK_LINES = ("-", "--", "-.", ":")


def style(strategy: str) -> Style:
    """The one style of ``strategy`` in every plot: a built-in's fixed style, otherwise one derived from a hash of
    its name (the same on every run and machine, unlike matplotlib's colour cycle)."""
    if strategy in STYLES:
        return STYLES[strategy]
    h = int.from_bytes(hashlib.sha256(strategy.encode()).digest()[:8], "big")
    return Style(_FALLBACK_COLORS[h % 8], _FALLBACK_MARKERS[(h // 8) % 8], _FALLBACK_LINES[(h // 64) % 4])


def draw_order(names) -> list[str]:
    """Strategies in drawing order: by name, Specter last (in front)."""
    return sorted(names, key=lambda s: (s == "specter", s))


def clock_label(row: ResultRow) -> str:
    return {"modeled": f"modeled ({row.profile})", "measured": "measured (CUDA events)",
            "host": "host wall time (CPU, not a GPU's TPOT)"}.get(row.clock, row.clock)


def figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def title(r: ResultRow) -> str:
    where = r.model if r.geometry == r.model else f"{r.model} priced at {r.geometry} geometry (projection)"
    return f"{where}\n{clock_label(r)} · {r.workload} · {r.new_tokens} new tokens"
