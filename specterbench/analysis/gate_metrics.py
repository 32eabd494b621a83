"""What the gate measures: every gated metric with its direction and how it is read from a row, and the cells.

A *gate cell* is compare's cell (model, geometry, strategy with its options, budget, profile, clock, workload,
new tokens, prompts) plus the row's decode setting, so greedy and sampled rows are never held to each other.

Every gated metric is read from the deterministic modeled clock or from counted events — never from host wall
time (``host_ms_per_token``, ``samples["host_ms"]``, ``duration_s``, ``env``), which the gate ignores.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from specterbench.analysis.compare import cell_key
from specterbench.engine.sampling import DecodeSetting
from specterbench.errors import UsageError
from specterbench.runfiles.results import DIRECTIONS, ResultRow


def _number(row: ResultRow, value, where: str) -> float | None:
    """A metric value as a float; None stays None; anything else is a clear error naming the row."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"row {row.cell or row.strategy!r}: {where} is {value!r}, not a finite number")
    return float(value)


def _field(name: str) -> Callable[[ResultRow], float | None]:
    return lambda row: _number(row, getattr(row, name), name)


def _tpot_mean(row: ResultRow) -> float | None:
    """Mean modeled ms per decode token: total decode time over decode tokens (a window's tokens share one time)."""
    samples = row.samples.get("tpot_ms") if isinstance(row.samples, dict) else None
    if samples is None or samples == []:
        return None
    if not isinstance(samples, list):
        raise UsageError(f"row {row.cell or row.strategy!r}: samples.tpot_ms is {type(samples).__name__}, "
                         f"not a list of per-token ms")
    return statistics.fmean(_number(row, x, "samples.tpot_ms[]") for x in samples)


def _extra(key: str) -> Callable[[ResultRow], float | None]:
    return lambda row: _number(row, (row.extra or {}).get(key), f"extra.{key}")


def _always(row: ResultRow) -> bool:
    return True


def _lossy(row: ResultRow) -> bool:
    return not row.lossless_strategy


@dataclass(frozen=True, slots=True)
class GatedMetric:
    name: str
    direction: str  # "lower" or "higher" is better
    read: Callable[[ResultRow], float | None]
    abs_tol: float  # absolute slack on top of the relative tolerance, for references at or near zero
    meaning: str
    applies: Callable[[ResultRow], bool] = _always  # cells the metric is gated in


# The gate's default set (results/reference/gate.toml gates each): modeled time, counted bytes and hits, window
# length, agreement. abs_tol is far below one event (one expert copy, one token) and far above float noise.
METRICS: dict[str, GatedMetric] = {m.name: m for m in (
    GatedMetric("tpot_ms", "lower", _field("tpot_ms"), 1e-6, "median modeled ms per decode token"),
    GatedMetric("tpot_mean_ms", "lower", _tpot_mean, 1e-6, "mean modeled ms per decode token (decode time / tokens)"),
    GatedMetric("tpot_p90_ms", "lower", _field("tpot_p90_ms"), 1e-6, "90th percentile of modeled ms per decode token"),
    GatedMetric("ttft_ms", "lower", _field("ttft_ms"), 1e-6, "median modeled ms to the first token (prefill)"),
    GatedMetric("stall_ms_per_token", "lower", _field("stall_ms_per_token"), 1e-6,
                "modeled ms the compute stream waited on copies, per token"),
    GatedMetric("h2d_bytes_per_token", "lower", _field("h2d_bytes_per_token"), 1e-3,
                "host-to-device expert bytes per token (counted)"),
    GatedMetric("hit_rate", "higher", _field("hit_rate"), 1e-9, "share of expert lookups found on the device"),
    GatedMetric("tokens_per_window", "higher", _extra("tokens_per_window"), 1e-9,
                "tokens emitted per speculative window (accepted draft tokens + 1)"),
    GatedMetric("token_agreement", "higher", _field("token_agreement"), 1e-9,
                "share of tokens equal to the reference's (lossy strategies; lossless ones must be exact)", _lossy),
)}


def gated_metric(name: str) -> GatedMetric:
    """A metric of :data:`METRICS`, or any row field with a direction in ``results.DIRECTIONS``."""
    if name in METRICS:
        return METRICS[name]
    if name in DIRECTIONS and name != "host_ms_per_token":
        return GatedMetric(name, DIRECTIONS[name], _field(name), 1e-9, name)
    known = sorted(set(METRICS) | set(DIRECTIONS) - {"host_ms_per_token"})
    why = " (host wall time is never gated)" if name == "host_ms_per_token" else ""
    raise UsageError(f"unknown metric {name!r}{why}; known: {', '.join(known)}")


def metric_value(rows: list[ResultRow], metric: str) -> float | None:
    """The metric's median over the cell's status-ok repeats that have it; None when none has it."""
    read = gated_metric(metric).read
    values = [v for v in (read(r) for r in rows if r.status == "ok") if v is not None]
    return statistics.median(values) if values else None


# ---- cells ------------------------------------------------------------------------------------------------

def decode_label(row: ResultRow) -> str:
    """How the row's tokens were chosen (``greedy``, ``sample T=1 seed=0``); rows without the field were greedy."""

    data = getattr(row, "decode", None)  # rows written before decode settings existed have no such field
    if data is None or data == {}:
        return "greedy"
    if not isinstance(data, dict):
        raise UsageError(f"row {row.cell or row.strategy!r}: decode is {data!r}; expected a mapping like "
                         f"{{'mode': 'greedy'}}")
    try:
        return DecodeSetting.from_dict(data).label
    except (TypeError, ValueError, UsageError) as err:
        raise UsageError(f"row {row.cell or row.strategy!r}: unreadable decode setting {data!r} ({err})") from None


CELL_NAMES = ("model", "geometry", "strategy", "budget_fraction", "profile", "clock", "workload", "new_tokens",
              "prompts", "precision", "decode")


def gate_key(row: ResultRow) -> tuple:
    """The gate cell of a row (see the module docstring)."""
    return cell_key(row) + (decode_label(row),)


def group_key(key: tuple) -> tuple:
    """A gate cell without its strategy: where strategies compete with each other."""
    return key[:2] + key[3:]


def cell_fields(key: tuple) -> dict:
    return dict(zip(CELL_NAMES, key))


def describe(key: tuple, *, strategy: bool = True) -> str:
    """``tiny-qwen-moe@qwen-moe · specter @ 35% · modeled a100-40g-pcie4 · shakespeare-heldout-v1 · 4×16 · greedy``."""
    c = cell_fields(key if strategy else key[:2] + ("",) + key[2:])
    where = c["model"] if c["geometry"] in (c["model"], "own") else f"{c['model']}@{c['geometry']}"
    clock = f"modeled {c['profile']}" if c["clock"] == "modeled" else c["clock"]
    who = f"{c['strategy']} @ {c['budget_fraction']:.0%}" if strategy else f"@ {c['budget_fraction']:.0%}"
    precision = "" if c.get("precision", "bf16") == "bf16" else f"{c['precision']} · "
    return (f"{where} · {who} · {clock} · {c['workload']} · {c['prompts']}×{c['new_tokens']} tokens · "
            f"{precision}{c['decode']}")


def group_rows(rows: list[ResultRow]) -> dict[tuple, list[ResultRow]]:
    cells: dict[tuple, list[ResultRow]] = {}
    for r in rows:
        cells.setdefault(gate_key(r), []).append(r)
    return cells


def check_decode(reference: list[ResultRow], rows: list[ResultRow]) -> None:
    """Refuse to hold a run to a reference decoded another way (greedy vs sampled, another temperature)."""
    ref, new = sorted({decode_label(r) for r in reference}), sorted({decode_label(r) for r in rows})
    if reference and rows and not set(ref) & set(new):
        raise UsageError(f"refusing to compare rows with different decode settings: the reference was decoded "
                         f"{' / '.join(ref)}, the run {' / '.join(new)}; gate a run made with the reference's "
                         f"setting, or record a new reference on purpose (`make reference`)")


# ---- speed-ups ----------------------------------------------------------------------------------------------

REFERENCE_STRATEGIES = ("resident", "oracle", "oracle-spec")  # bounds, not competitors


def base_name(label: str) -> str:
    """``specter[k=4]`` → ``specter``."""
    return label.split("[", 1)[0]


@dataclass(frozen=True, slots=True)
class Speedup:
    """How many times better a strategy's metric is than the strongest competitor's (> 1: better)."""

    metric: str
    ratio: float | None  # None: nothing to compare (``why`` says what is missing)
    other: str = ""
    own: float | None = None
    other_value: float | None = None
    why: str = ""

    @property
    def detail(self) -> str:
        direction = METRICS[self.metric].direction if self.metric in METRICS else DIRECTIONS[self.metric]
        return (f"{self.metric} {self.own:.4g} vs {self.other} {self.other_value:.4g} → {self.ratio:.4f}× "
                f"({direction} is better)")


def _ratio(own: float, other: float, direction: str) -> float:
    num, den = (other, own) if direction == "lower" else (own, other)
    if den == 0:
        return math.inf if num > 0 else 1.0
    return num / den


def best_other_speedups(rows: list[ResultRow], strategy: str, metric: str, over: str = "best-other",
                        exclude: tuple[str, ...] = REFERENCE_STRATEGIES) -> dict[tuple, Speedup]:
    """Per gate cell of ``strategy``: its speed-up in ``metric`` over the strongest other lossless, status-ok
    strategy of the same group (``over=best-other``, ``exclude`` left out) or over the strategy named ``over``."""
    m = gated_metric(metric)
    groups: dict[tuple, dict[tuple, list[ResultRow]]] = {}
    for key, cell_rows in group_rows(rows).items():
        groups.setdefault(group_key(key), {})[key] = cell_rows
    out = {}
    for cells in groups.values():
        for key, own_rows in cells.items():
            if base_name(key[2]) != strategy:
                continue
            own = metric_value(own_rows, metric)
            if own is None:
                out[key] = Speedup(metric, None, why=f"{key[2]} has no status-ok {metric} here")
                continue
            others = {}
            for k, rs in cells.items():
                name = base_name(k[2])
                if name == strategy or (name != over if over != "best-other" else name in exclude):
                    continue
                value = metric_value(rs, metric)
                if value is not None and all(r.lossless_strategy and r.status == "ok" for r in rs):
                    others[k[2]] = value
            if not others:
                who = (f"strategy {over!r}" if over != "best-other" else
                       f"other lossless status-ok strategy (excluded: {', '.join(exclude) or 'none'})")
                out[key] = Speedup(metric, None, why=f"no {who} at this budget to compare with")
                continue
            best = (min if m.direction == "lower" else max)(sorted(others), key=others.get)
            out[key] = Speedup(metric, _ratio(own, others[best], m.direction), best, own, others[best])
    return out
