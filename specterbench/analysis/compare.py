"""Compare two runs cell by cell: per-metric medians, deltas, direction, verdict and significance.

A *cell* is one (model, geometry, strategy with its options, budget fraction, profile, clock, workload, new tokens,
prompts); repeats of a
cell are pooled. Each metric of :data:`specterbench.runfiles.results.DIRECTIONS` is compared with its own direction, so
a lower TPOT is *better* and a lower hit rate is *worse*.

Significance is a two-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``, alpha 0.05) over the raw per-token
samples of the run (``row.samples``: ``tpot_ms``, ``host_ms``, ``ttft_ms``) for the metrics they summarise,
and over the per-repeat values for every other metric. Fewer than two values on a side: no test (``n/a``).

Host wall time on a CPU (``host_ms_per_token``, and every time metric of a ``host``-clock row) is machine noise on
a shared machine: two runs of unchanged code differ by tens of percent with p ≈ 1e-21 over thousands of
per-token samples. It is therefore **not tested** by default: its verdict is shown, its significance says
"not tested (host wall time)", and ``only_changed`` and the tally leave it out. ``test_wall_time=True``
(``--test-wall-time``) tests it like any other metric. The tally counts significant changes in both directions.

Runs with a different schema version, model, geometry or profile are refused with the reason
(:func:`check_compatible`); pandas appears only here, at the edge.
"""

from __future__ import annotations

import importlib.util
import statistics
from collections import defaultdict

from specterbench.errors import UsageError
from specterbench.runfiles.results import DIRECTIONS, ResultRow

ALPHA = 0.05
CELL_FIELDS = ("model", "geometry", "strategy", "budget_fraction", "profile", "clock", "workload", "new_tokens",
               "prompts", "precision")
# metrics that are a median of raw per-token samples, and the samples' key in ``row.samples``
SAMPLE_KEYS = {"tpot_ms": "tpot_ms", "tpot_mean_ms": "tpot_ms", "host_ms_per_token": "host_ms", "ttft_ms": "ttft_ms"}
# what must be equal for two sets of rows to be comparable, and how to name it
# metrics that are host wall time whatever the clock, and those that are on the host clock (no GPU)
WALL_TIME = frozenset({"host_ms_per_token"})
HOST_CLOCK_TIME = frozenset({"tpot_ms", "tpot_mean_ms", "tpot_p90_ms", "ttft_ms", "tokens_per_s", "stall_ms_per_token"})
COMPATIBLE = (("schema_version", "schema version"), ("model", "model"), ("geometry", "geometry"),
              ("profile", "profile"), ("precision", "target precision"), ("decode_label", "decode setting"),
              ("graphs_label", "kernel launch mode (--cuda-graphs)"))


def cell_key(row: ResultRow) -> tuple:
    """The cell a row belongs to; budget fractions are rounded so that 0.35 and 0.3500001 match."""
    return tuple(round(row.budget_fraction, 3) if f == "budget_fraction" else
                 row.strategy_label if f == "strategy" else getattr(row, f) for f in CELL_FIELDS)


def check_compatible(base: list[ResultRow], new: list[ResultRow], names: tuple[str, str] = ("base", "new")) -> None:
    """Raise :class:`UsageError` naming the reason when ``base`` and ``new`` cannot be compared."""
    for rows, name in ((base, names[0]), (new, names[1])):
        if not rows:
            raise UsageError(f"the {name} run has no rows; nothing to compare")
    for field, label in COMPATIBLE:
        a = sorted({str(getattr(r, field)) for r in base})
        b = sorted({str(getattr(r, field)) for r in new})
        if a != b:
            raise UsageError(f"refusing to compare runs with a different {label}: {names[0]} has "
                             f"{', '.join(a)}; {names[1]} has {', '.join(b)}")


def group_cells(rows: list[ResultRow]) -> dict[tuple, list[ResultRow]]:
    cells: dict[tuple, list[ResultRow]] = defaultdict(list)
    for r in rows:
        cells[cell_key(r)].append(r)
    return dict(cells)


def metric_values(rows: list[ResultRow], metric: str) -> list[float]:
    """The metric of every status-ok row that has it (one value per repeat)."""
    return [getattr(r, metric) for r in rows if r.status == "ok" and getattr(r, metric) is not None]


def median_of(rows: list[ResultRow], metric: str) -> float | None:
    values = metric_values(rows, metric)
    return statistics.median(values) if values else None


def verdict(base: float | None, new: float | None, direction: str) -> str:
    """``better`` / ``worse`` / ``same`` by the metric's direction; ``n/a`` when a side has no value."""
    if base is None or new is None:
        return "n/a"
    if new == base:
        return "same"
    return "better" if (new < base) == (direction == "lower") else "worse"


def delta_pct(base: float | None, new: float | None) -> float | None:
    if base is None or new is None:
        return None
    if base == 0:
        return 0.0 if new == 0 else float("inf") if new > 0 else float("-inf")
    return (new - base) / abs(base) * 100


def _test_samples(rows: list[ResultRow], metric: str) -> tuple[list[float], str]:
    key = SAMPLE_KEYS.get(metric)
    if key is not None:
        pooled = [x for r in rows if r.status == "ok" for x in (r.samples or {}).get(key, [])]
        if pooled:
            return pooled, "per-token samples"
    return metric_values(rows, metric), "repeats"


def significance(a: list[float], b: list[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value; None when a side has fewer than two values or scipy is missing."""
    if len(a) < 2 or len(b) < 2:
        return None
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:  # pragma: no cover - scipy is a dependency
        return None
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def _no_test_reason(a, b) -> str:
    if len(a) >= 2 and len(b) >= 2 and importlib.util.find_spec("scipy") is None:
        return "; scipy not installed"
    return ""


def is_wall_time(metric: str, clock: str) -> bool:
    """True for a metric that is this machine's wall time (machine noise on a shared host), never a GPU's."""
    return metric in WALL_TIME or (clock == "host" and metric in HOST_CLOCK_TIME)


def _status(rows: list[ResultRow]) -> str:
    bad = [r for r in rows if r.status != "ok"]
    return "ok" if not bad else "; ".join(f"{r.status}: {r.error}" for r in bad)


def compare_runs(base_rows: list[ResultRow], new_rows: list[ResultRow], *, alpha: float = ALPHA,
                 metrics: tuple[str, ...] | None = None, test_wall_time: bool = False):
    """One DataFrame row per (cell, metric) present in both runs.

    Columns: the cell fields, ``metric``, ``direction`` ("lower"/"higher" is better), ``base`` and ``new``
    (medians over the cell's status-ok repeats), ``delta_pct``, ``verdict`` (better/worse/same/n/a),
    ``p_value``, ``significant`` (True/False, None without a test), ``test`` (what was tested, with the counts),
    ``base_status`` and ``new_status``, ``wall_time`` (True for host wall time, untested unless
    ``test_wall_time``). ``df.attrs["notes"]`` lists cells found in one run only and changed
    strategy or package versions.
    """
    import pandas as pd

    check_compatible(base_rows, new_rows)
    metrics = tuple(metrics) if metrics else tuple(DIRECTIONS)
    unknown = [m for m in metrics if m not in DIRECTIONS]
    if unknown:
        raise UsageError(f"unknown metric(s) {', '.join(unknown)}; known: {', '.join(DIRECTIONS)}")
    base, new = group_cells(base_rows), group_cells(new_rows)
    common = [k for k in base if k in new]
    if not common:
        raise UsageError("the runs share no cell (model, geometry, strategy, budget, profile, clock, workload, "
                         f"tokens): base has {_describe(base)}; new has {_describe(new)}")
    records = []
    for key in common:
        b_rows, n_rows = base[key], new[key]
        for metric in metrics:
            direction = DIRECTIONS[metric]
            b, n = median_of(b_rows, metric), median_of(n_rows, metric)
            if b is None and n is None:
                continue
            (sa, what), (sb, _) = _test_samples(b_rows, metric), _test_samples(n_rows, metric)
            wall = is_wall_time(metric, key[CELL_FIELDS.index("clock")])
            untested = wall and not test_wall_time
            p = significance(sa, sb) if b is not None and n is not None and not untested else None
            if untested:
                test = "not tested (host wall time: machine noise; --test-wall-time tests it)"
            elif p is not None:
                test = f"Mann-Whitney U, {len(sa)} vs {len(sb)} {what}"
            else:
                test = f"none ({len(sa)} vs {len(sb)} {what}{_no_test_reason(sa, sb)})"
            records.append({
                **dict(zip(CELL_FIELDS, key)), "metric": metric, "direction": direction, "base": b, "new": n,
                "delta_pct": delta_pct(b, n), "verdict": verdict(b, n, direction), "p_value": p,
                "significant": None if p is None else p < alpha, "test": test, "wall_time": untested,
                "base_status": _status(b_rows), "new_status": _status(n_rows),
            })
    df = pd.DataFrame.from_records(records)
    df.attrs["notes"] = _notes(base, new, base_rows, new_rows)
    df.attrs["alpha"] = alpha
    return df


def _describe(cells: dict) -> str:
    parts = sorted({f"{k[6]} ({k[5]} clock, {k[7]} tokens)" for k in cells})
    return ", ".join(parts)


def _label(key: tuple) -> str:
    return f"{key[2]} @ {key[3]:.0%}"


def _notes(base, new, base_rows, new_rows) -> list[str]:
    notes = []
    only_base = [_label(k) for k in base if k not in new]
    only_new = [_label(k) for k in new if k not in base]
    if only_base:
        notes.append(f"only in base (not compared): {', '.join(only_base)}")
    if only_new:
        notes.append(f"only in new (not compared): {', '.join(only_new)}")
    bv = {r.strategy: r.strategy_version for r in base_rows}
    nv = {r.strategy: r.strategy_version for r in new_rows}
    for s in sorted(set(bv) & set(nv)):
        if bv[s] != nv[s]:
            notes.append(f"strategy {s}: version {bv[s]} → {nv[s]}")
    bp = (base_rows[0].env or {}).get("packages", {})
    np_ = (new_rows[0].env or {}).get("packages", {})
    for pkg in sorted(set(bp) & set(np_)):
        if bp[pkg] != np_[pkg]:
            notes.append(f"package {pkg}: {bp[pkg]} → {np_[pkg]}")
    for key, label in (("git_sha", "code"),):
        a, b = (base_rows[0].env or {}).get(key), (new_rows[0].env or {}).get(key)
        if a and b and a != b:
            notes.append(f"{label}: {a} → {b}")
    return notes


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x != x:  # NaN from pandas
        return "-"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _wall(df):
    """Rows of ``df`` that are untested host wall time (a frame from before the column: none)."""
    return df["wall_time"].eq(True) if "wall_time" in df.columns else df["metric"].isna()


def tally_line(df) -> str:
    """``2 better (1 significant), 3 worse (0 significant), 5 same, over 10 cell-metric pairs at p < 0.05``,
    host wall-time pairs counted apart (not tested)."""
    alpha = df.attrs.get("alpha", ALPHA)
    wall = _wall(df)
    tested = df[~wall]
    sig = tested["significant"].eq(True)
    counts = {v: int((tested["verdict"] == v).sum()) for v in ("better", "worse", "same")}
    text = (f"{counts['better']} better ({int((sig & (tested['verdict'] == 'better')).sum())} significant), "
            f"{counts['worse']} worse ({int((sig & (tested['verdict'] == 'worse')).sum())} significant), "
            f"{counts['same']} same, over {len(tested)} cell-metric pairs (significant: p < {alpha})")
    if wall.any():
        text += f"; {int(wall.sum())} host wall-time pairs not tested (machine noise)"
    return text + "."


def render_comparison(df, *, only_changed: bool = False) -> str:
    """Markdown: a one-line tally, notes, then one table line per (cell, metric)."""
    if df.empty:
        return "(nothing to compare)\n"
    wall = _wall(df)
    view = df[df["verdict"].isin(["better", "worse"]) & ~wall] if only_changed else df
    lines = [tally_line(df), ""]
    lines += [f"- {note}" for note in df.attrs.get("notes", [])]
    if df.attrs.get("notes"):
        lines.append("")
    alpha = df.attrs.get("alpha", ALPHA)
    multi = df["model"].nunique() > 1 or df["clock"].nunique() > 1
    records = []
    for r in view.itertuples(index=False):
        p = r.p_value if r.p_value is not None and r.p_value == r.p_value else None
        cell = f"{r.strategy} @ {r.budget_fraction:.0%}"
        if multi:
            cell = f"{r.model} · {cell} · {r.clock}"
        status = "" if r.base_status == r.new_status == "ok" else f" (base {r.base_status}; new {r.new_status})"
        records.append({
            "cell": cell, "metric": r.metric, "better when": r.direction, "base": _fmt(r.base), "new": _fmt(r.new),
            "Δ %": "-" if r.delta_pct is None or r.delta_pct != r.delta_pct else f"{r.delta_pct:+.2f}",
            "verdict": r.verdict + status,
            "significant": ("not tested (wall time)" if getattr(r, "wall_time", False) else "n/a") if p is None
            else (f"yes (p={p:.3g})" if p < alpha else f"no (p={p:.3g})"),
        })
    if not records:
        return "\n".join(lines + ["(no changes)"]) + "\n"
    import pandas as pd

    return "\n".join(lines) + pd.DataFrame(records).to_markdown(index=False, disable_numparse=True) + "\n"
