"""PNG plots of a run (matplotlib, Agg canvas, no pyplot state): ``<run_dir>/plots/*.png``.

Per (model, geometry, profile, clock): TPOT vs budget, hit rate vs budget and H2D bytes per token vs budget,
one line per strategy (medians over repeats); for speculative strategies (rows whose ``extra`` has ``k`` and
``accepted_length_hist`` or ``tokens_per_window``) accepted length vs K when the run has several K, otherwise a
histogram of accepted lengths. Rows whose status is not ``ok`` are left out. Axis labels carry units; on the
modeled clock the budget plots' labels say ``modeled (<profile>)`` and every title names the clock. On a CPU
without CUDA the time plot is host wall time, labelled as such, never a GPU's TPOT.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path

from specterbench.bench.results import ResultRow

FIGSIZE = (6.4, 4.2)
DPI = 120


def _slug(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "__".join(str(p) for p in parts)).strip("-")


def clock_label(row: ResultRow) -> str:
    return {"modeled": f"modeled ({row.profile})", "measured": "measured (CUDA events)",
            "host": "host wall time (CPU, not a GPU's TPOT)"}.get(row.clock, row.clock)


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _title(r: ResultRow) -> str:
    where = r.model if r.geometry == r.model else f"{r.model} priced at {r.geometry} geometry (projection)"
    return f"{where}\n{clock_label(r)} · {r.workload} · {r.new_tokens} new tokens"


def _budget_axis(r: ResultRow) -> str:
    if r.geometry == r.model:
        return "expert budget (% of all expert bytes)"
    return f"expert budget (% of all expert bytes, priced at {r.geometry} sizes)"


def _by_strategy(rows: list[ResultRow], value) -> dict[str, list[tuple[float, float]]]:
    """Per strategy, (budget %, median over repeats of ``value(row)``) sorted by budget; None values skipped."""
    cells: dict[tuple[str, float], list[float]] = defaultdict(list)
    for r in rows:
        v = value(r)
        if v is not None:
            cells[(r.strategy, round(r.budget_fraction * 100, 2))].append(v)
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (s, x), vs in sorted(cells.items()):
        lines[s].append((x, statistics.median(vs)))
    return dict(lines)


def _budget_plot(rows, value, ylabel, path: Path, scale: float = 1.0) -> Path | None:
    lines = _by_strategy(rows, value)
    if not lines:
        return None
    fig, ax = _figure()
    xs_all = {x for pts in lines.values() for x, _ in pts}
    for s, pts in sorted(lines.items()):
        xs, ys = zip(*pts)
        ys = [y / scale for y in ys]
        if len(pts) == 1 and len(xs_all) > 1:  # a fixed-budget reference (resident): a level to compare with
            line = ax.axhline(ys[0], linestyle="--", linewidth=1, label=f"{s} (at {xs[0]:g}%)")
            ax.plot(xs, ys, marker="s", linestyle="none", color=line.get_color())
        else:
            ax.plot(xs, ys, marker="o", label=s)
    r = rows[0]
    ax.set_xlabel(_budget_axis(r))
    ax.set_ylabel(ylabel)
    ax.set_title(_title(r), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path)
    return path


def _bytes_unit(values) -> tuple[float, str]:
    top = max(values, default=0)
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if top >= scale:
            return scale, unit
    return 1.0, "bytes"


def _speculative(rows: list[ResultRow]) -> list[ResultRow]:
    return [r for r in rows if "k" in r.extra and ("accepted_length_hist" in r.extra or
                                                   "tokens_per_window" in r.extra)]


def _hist(r: ResultRow) -> dict[int, int]:
    return {int(k): int(v) for k, v in (r.extra.get("accepted_length_hist") or {}).items()}


def _mean_accepted(rows: list[ResultRow]) -> float | None:
    """Mean accepted draft tokens per verification window, pooled over rows (windows weighted equally)."""
    total = windows = 0
    for r in rows:
        for length, n in _hist(r).items():
            total += length * n
            windows += n
    if windows:
        return total / windows
    per_row = [r.extra["tokens_per_window"] - 1 for r in rows if r.extra.get("tokens_per_window") is not None]
    return statistics.mean(per_row) if per_row else None


def _accepted_vs_k(rows, path: Path) -> Path | None:
    by: dict[str, dict[int, list[ResultRow]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[r.strategy][int(r.extra["k"])].append(r)
    fig, ax = _figure()
    drawn = False
    for s, per_k in sorted(by.items()):
        pts = [(k, _mean_accepted(rs)) for k, rs in sorted(per_k.items())]
        pts = [(k, m) for k, m in pts if m is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=s)
            drawn = True
    if not drawn:
        return None
    ks = sorted({int(r.extra["k"]) for r in rows})
    ax.plot(ks, ks, linestyle=":", color="grey", linewidth=1, label="all K accepted")
    ax.set_xlabel("K (draft tokens proposed per window)")
    ax.set_ylabel("mean accepted draft tokens per window (tokens)")
    ax.set_title(_title(rows[0]) + " · all budgets", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path)
    return path


def _accepted_hist(rows, path: Path) -> Path | None:
    by: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        for length, n in _hist(r).items():
            by[r.strategy][length] += n
    if not by:
        return None
    fig, ax = _figure()
    names = sorted(by)
    width = 0.8 / len(names)
    for i, s in enumerate(names):
        windows = sum(by[s].values())
        xs = sorted(by[s])
        ax.bar([x + (i - (len(names) - 1) / 2) * width for x in xs], [by[s][x] / windows for x in xs], width,
               label=f"{s} ({windows} windows)")
    k = int(rows[0].extra["k"])
    ax.set_xticks(range(k + 1))
    ax.set_xlabel(f"accepted draft tokens per window (tokens, K = {k})")
    ax.set_ylabel("share of verification windows (fraction)")
    ax.set_title(_title(rows[0]) + " · all budgets", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path)
    return path


def write_plots(run_dir, rows: list[ResultRow]) -> list[Path]:
    """Write the run's plots under ``<run_dir>/plots/`` and return their paths (none for a run without ok rows)."""
    ok = [r for r in rows if r.status == "ok"]
    if not ok:
        return []
    out = Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple, list[ResultRow]] = defaultdict(list)
    for r in ok:
        groups[(r.model, r.geometry, r.profile, r.clock)].append(r)
    paths: list[Path] = []
    for key, grp in sorted(groups.items()):
        r = grp[0]
        suffix = f"\n{clock_label(r)}" if r.clock == "modeled" else ""
        name = _slug(r.model, *([f"at-{r.geometry}"] if r.geometry != r.model else []),
                     r.profile if r.clock == "modeled" else r.clock)
        if r.clock == "host":
            time_value, time_label = (lambda x: x.host_ms_per_token), "host wall time (ms/token)\nCPU, not a GPU's TPOT"
        else:
            time_value, time_label = (lambda x: x.tpot_ms), f"TPOT (ms/token){suffix}"
        h2d = [x.h2d_bytes_per_token for x in grp if x.h2d_bytes_per_token is not None]
        scale, unit = _bytes_unit(h2d)
        plots = [
            (time_value, time_label, "tpot_vs_budget", 1.0),
            (lambda x: x.hit_rate, f"hit rate (fraction of routed experts){suffix}", "hit_rate_vs_budget",
             1.0),
            (lambda x: x.h2d_bytes_per_token, f"H2D copies ({unit}/token, {r.model} sizes){suffix}",
             "h2d_bytes_per_token_vs_budget", scale),
        ]
        for value, ylabel, stem, sc in plots:
            p = _budget_plot(grp, value, ylabel, out / f"{stem}__{name}.png", sc)
            if p is not None:
                paths.append(p)
        spec = _speculative(grp)
        if spec:
            if len({int(x.extra["k"]) for x in spec}) > 1:
                p = _accepted_vs_k(spec, out / f"accepted_vs_k__{name}.png")
            else:
                p = _accepted_hist(spec, out / f"accepted_length_hist__{name}.png")
            if p is not None:
                paths.append(p)
    return paths
