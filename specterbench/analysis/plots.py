"""PNG plots of a run (matplotlib, Agg canvas, no pyplot state): ``<run_dir>/plots/*.png``.

Per (model, geometry, profile, clock): TPOT vs budget, hit rate vs budget and H2D bytes per token vs budget,
one line per strategy (medians over repeats); for speculative strategies (rows whose ``extra`` has ``k`` and
``accepted_length_hist`` or ``tokens_per_window``) accepted length vs K when the run has several K, otherwise a
histogram of accepted lengths. Rows whose status is not ``ok`` are left out. Axis labels carry units; on the
modeled clock the budget plots' labels say ``modeled (<profile>)`` and every title names the clock. On a CPU
without CUDA the time plot is host wall time, labelled as such, never a GPU's TPOT.

Every strategy has one style in every plot (:func:`style`): the built-ins a fixed, distinct colour, marker and
line style; any other name a combination derived from its name (stable across runs and machines). Specter is
always drawn last, thickest and in front. Points of several strategies at one K are dodged sideways so none
hides another; K and budget axes carry only the values that were run (a readable subset of whole numbers when
there are many). In the accepted-length-vs-K plot a strategy that chooses K per window (Specter) is a level at its
mean accepted length, marked at its mean K, so it is never left out. A budget plot where one strategy dwarfs the rest
switches to a log scale and says so.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path

from specterbench.analysis.batch_plot import pareto_plot
from specterbench.analysis.plot_style import DPI, FIGSIZE, SPECTER, STYLES, Style, clock_label, draw_order, style  # noqa: F401 - re-exported: the plots' one style and canvas
from specterbench.analysis.plot_style import figure as _figure  # tests record every figure through this name
from specterbench.analysis.plot_style import title as _title
from specterbench.runfiles.results import ResultRow

TPOT_STATISTIC = "median over decode tokens"


def _slug(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "__".join(str(p) for p in parts)).strip("-")


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


def _released(rows: list[ResultRow], strategy: str) -> str:
    """`` (draft released at 35%)``: where a speculative strategy's line is its own ablation."""
    at = sorted({round(r.budget_fraction * 100) for r in rows
                 if r.strategy == strategy and r.extra.get("draft_released")})
    return f" (draft released at {', '.join(f'{b}%' for b in at)})" if at else ""


def _budget_ticks(ax, xs) -> None:
    """Ticks at the budgets that were run (whole percent where they are whole), never fractional in-betweens."""
    xs = sorted(xs)
    ax.set_xticks(xs, [f"{x:.0f}%" if float(x).is_integer() else f"{x:g}%" for x in xs])


def _budget_plot(rows, value, ylabel, path: Path, scale: float = 1.0) -> Path | None:
    lines = _by_strategy(rows, value)
    if not lines:
        return None
    fig, ax = _figure()
    xs_all = {x for pts in lines.values() for x, _ in pts}
    for s in draw_order(lines):
        pts = lines[s]
        xs, ys = zip(*pts)
        ys = [y / scale for y in ys]
        st = style(s)
        if len(pts) == 1 and len(xs_all) > 1:  # a fixed-budget reference (resident): a level to compare with
            ax.axhline(ys[0], linestyle="--", linewidth=1, color=st.color, zorder=st.zorder,
                       label=f"{s} (at {xs[0]:g}%)")
            ax.plot(xs, ys, **{**st.kwargs(), "linestyle": "none"})
        else:
            ax.plot(xs, ys, label=s + _released(rows, s), **st.kwargs())
    r = rows[0]
    _budget_ticks(ax, xs_all)
    ax.set_xlabel(_budget_axis(r))
    if dwarfs({s: [y / scale for _, y in pts] for s, pts in lines.items()}):
        ax.set_yscale("log")
        ylabel += "\n(log scale: one strategy dwarfs the rest)"
    ax.set_ylabel(ylabel)
    ax.set_title(_title(r), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncols=2 if len(lines) > 7 else 1)
    fig.savefig(path)
    return path


DWARF_RATIO = 8.0  # one strategy's largest value over every other's largest: beyond it, a log scale


def dwarfs(values: dict[str, list[float]]) -> bool:
    """Whether one strategy's values dwarf the rest (its largest over the others' largest beyond
    :data:`DWARF_RATIO`), so that a linear axis would flatten every other line; only for positive values."""
    tops = sorted((max(v) for v in values.values() if v), reverse=True)
    if len(tops) < 2 or any(x <= 0 for v in values.values() for x in v):
        return False
    return tops[0] / tops[1] > DWARF_RATIO


def _bytes_unit(values) -> tuple[float, str]:
    top = max(values, default=0)
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if top >= scale:
            return scale, unit
    return 1.0, "bytes"


def _k(r: ResultRow) -> int | None:
    """The row's fixed K, or None when K was chosen per window (``k=auto``)."""
    k = r.extra.get("k")
    if isinstance(k, bool):
        return None
    if isinstance(k, int):
        return k
    return int(k) if isinstance(k, str) and k.isdigit() else None


def _speculative(rows: list[ResultRow]) -> list[ResultRow]:
    return [r for r in rows if "k" in r.extra and ("accepted_length_hist" in r.extra or
                                                   "tokens_per_window" in r.extra)]


MAX_TICKS = 12  # integer ticks on an accepted-length or K axis: every value up to this many, else a readable subset


def _integer_ticks(axis, values: list[int]) -> None:
    """Ticks at ``values`` when they are few; otherwise at most :data:`MAX_TICKS` whole numbers, so labels never
    collide (accepted lengths up to 32 for K = 32)."""
    from matplotlib.ticker import MaxNLocator

    if len(values) <= MAX_TICKS:
        axis.set_ticks(values)
    else:
        axis.set_major_locator(MaxNLocator(nbins=MAX_TICKS, integer=True))


def _mean_k(rows: list[ResultRow]) -> float | None:
    """The mean K over the windows of rows that chose K per window (``k_hist``: K -> windows)."""
    total = windows = 0
    for r in rows:
        for k, n in (r.extra.get("k_hist") or {}).items():
            if str(k).isdigit():
                total += int(k) * int(n)
                windows += int(n)
    return total / windows if windows else None


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
    """Mean accepted draft tokens per window against K (rows with a fixed K), one dodged line per strategy."""
    from matplotlib.ticker import MaxNLocator

    by: dict[str, dict[int, list[ResultRow]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if _k(r) is not None:
            by[r.strategy][_k(r)].append(r)
    per_window: dict[str, list[ResultRow]] = defaultdict(list)  # K chosen per window (specter's k=auto)
    for r in rows:
        if _k(r) is None:
            per_window[r.strategy].append(r)
    fig, ax = _figure()
    names = draw_order(by)
    dodge = 0.08
    drawn = False
    for i, s in enumerate(names):
        pts = [(k, _mean_accepted(rs)) for k, rs in sorted(by[s].items())]
        pts = [(k + (i - (len(names) - 1) / 2) * dodge, m) for k, m in pts if m is not None]
        if pts:
            ax.plot(*zip(*pts), label=s, **style(s).kwargs())
            drawn = True
    ks = sorted({_k(r) for r in rows if _k(r) is not None})
    for s in draw_order(per_window):  # no one K: its mean accepted length at its mean K, and a level across
        mean = _mean_accepted(per_window[s])
        if mean is None or not ks:
            continue
        st = style(s)
        mean_k = _mean_k(per_window[s])
        ax.axhline(mean, linestyle="--", linewidth=1.2, color=st.color, zorder=st.zorder)
        ax.plot([mean_k if mean_k is not None else ks[0]], [mean],
                **{**st.kwargs(), "linestyle": "none"},
                label=f"{s} (K chosen per window{f', mean K {mean_k:.1f}' if mean_k is not None else ''})")
        drawn = True
    if not drawn:
        return None
    ax.plot(ks, ks, linestyle=":", color="grey", linewidth=1, label="all K accepted", zorder=1)
    _integer_ticks(ax.xaxis, ks)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
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
    names = draw_order(by)
    width = 0.8 / len(names)
    for i, s in enumerate(names):
        windows = sum(by[s].values())
        xs = sorted(by[s])
        st = style(s)
        ax.bar([x + (i - (len(names) - 1) / 2) * width for x in xs], [by[s][x] / windows for x in xs], width,
               color=st.color, zorder=st.zorder, label=f"{s} ({windows} windows)",
               edgecolor="black" if s == "specter" else st.color)
    top = max(max(h) for h in by.values() if h)
    ks = {_k(r) for r in rows}
    k_text = f"K = {ks.pop()}" if len(ks) == 1 and None not in ks else "K chosen per window"
    _integer_ticks(ax.xaxis, list(range(top + 1)))
    ax.set_xlabel(f"accepted draft tokens per window (tokens, {k_text})")
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
            time_value, time_label = ((lambda x: x.host_ms_per_token),
                                      f"host wall time, {TPOT_STATISTIC} (ms/token)\nCPU, not a GPU's TPOT")
        else:
            time_value, time_label = (lambda x: x.tpot_ms), f"TPOT, {TPOT_STATISTIC} (ms/token){suffix}"
        h2d = [x.h2d_bytes_per_token for x in grp if x.h2d_bytes_per_token is not None]
        scale, unit = _bytes_unit(h2d)
        plots = [
            (time_value, time_label, "tpot_vs_budget", 1.0),
            (lambda x: x.hit_rate, f"hit rate (fraction of routed experts){suffix}", "hit_rate_vs_budget",
             1.0),
            (lambda x: x.h2d_bytes_per_token, f"H2D copies ({unit}/token, {r.model} sizes){suffix}",
             "h2d_bytes_per_token_vs_budget", scale),
        ]
        smallest = [x for x in grp if x.batch == min(y.batch for y in grp)]  # budget axes: one batch size
        for value, ylabel, stem, sc in plots:
            p = _budget_plot(smallest, value, ylabel, out / f"{stem}__{name}.png", sc)
            if p is not None:
                paths.append(p)
        p = pareto_plot(grp, out / f"per_user_vs_per_gpu__{name}.png")
        if p is not None:
            paths.append(p)
        spec = _speculative(grp)
        if spec:
            if len({_k(x) for x in spec if _k(x) is not None}) > 1:
                p = _accepted_vs_k(spec, out / f"accepted_vs_k__{name}.png")
            else:
                p = _accepted_hist(spec, out / f"accepted_length_hist__{name}.png")
            if p is not None:
                paths.append(p)
    return paths
