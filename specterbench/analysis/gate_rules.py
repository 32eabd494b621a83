"""The gate's rules: what each one checks, and how they are written.

Rules are one line each, a kind then ``key=value`` pairs (in a TOML file or on the command line)::

    regression metric=tpot_mean_ms max_pct=0.5
    ratchet strategy=specter metric=tpot_mean_ms margin_pct=1
    goal strategy=specter metric=tpot_mean_ms min=1.5 models=tiny-qwen-moe
    speedup strategy=specter metric=tpot_ms min=1.5

- ``regression``: in every cell of the reference (model, geometry, strategy with options, budget, profile, clock,
  workload, tokens, prompts, decode setting), the run's ``metric`` may be worse than the reference's by at most
  ``max_pct`` percent (default :data:`DEFAULT_TOLERANCE_PCT`) plus the metric's tiny absolute slack; a reference
  cell missing from the run fails. Optional ``strategies=lru,specter`` (default all).
- ``ratchet``: in every cell of ``strategy``, its speed-up over the strongest other lossless strategy of the same
  model, budget and setting (``resident`` and ``oracle`` excluded) in ``metric`` may not drop below the
  reference's speed-up there minus ``margin_pct`` percent of it (default :data:`DEFAULT_RATCHET_MARGIN_PCT`).
- ``goal``: the same speed-up against ``min``, printed as "goal met / not met (measured x×)"; never fails.
  Optional ``models=``, ``budgets=`` and ``name=`` (a word naming the goal).
- ``speedup``: the same speed-up must be at least ``min`` (a hard floor; ``over=<name>`` compares with one
  strategy, ``exclude=a,b`` replaces the default exclusions, ``budgets=35%,50%`` restricts).

Metrics and their directions are :data:`specterbench.analysis.gate_metrics.METRICS`; host wall time is never gated.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from specterbench.analysis.gate_metrics import (
    REFERENCE_STRATEGIES,
    base_name,
    best_other_speedups,
    describe,
    gated_metric,
    group_rows,
    metric_value,
)
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow

# The modeled clock is deterministic: the same code, seed and torch build give the same figures to the last bit.
# 0.5% leaves room only for another CPU's float rounding flipping a rare near-tie expert choice; the smallest
# regressions the gate exists for (a strategy's copies +5%, some speculative windows twice as slow) are ten times
# larger.
DEFAULT_TOLERANCE_PCT = 0.5
# A speed-up is a ratio of two metrics that may each move by DEFAULT_TOLERANCE_PCT: 1% covers both.
DEFAULT_RATCHET_MARGIN_PCT = 1.0


@dataclass(frozen=True, slots=True)
class Check:
    """One checked fact. ``reference``/``now``/``limit`` are numbers (or short words) for the one-line report."""

    rule: str  # the rule's text, "status", or "coverage"
    passed: bool
    message: str
    cell: str = ""
    metric: str = ""
    reference: float | str | None = None
    now: float | str | None = None
    limit: float | str | None = None
    goal: bool = False  # a goal line: printed, never a failure
    improved: bool = False  # better than the reference beyond the tolerance (lock it in with `make reference`)

    def line(self) -> str:
        def show(v):
            if not isinstance(v, float):
                return "-" if v is None else str(v)
            return f"{v:.0f}" if abs(v) >= 1e5 else f"{v:.6g}"  # byte counts in full

        if not self.metric:
            return f"{self.cell}: {self.message}"
        return (f"{self.cell} · {self.metric}: reference {show(self.reference)}, now {show(self.now)}, "
                f"limit {show(self.limit)} — {self.message}")


def _limit(ref: float, pct: float, abs_tol: float, direction: str) -> float:
    slack = abs(ref) * pct / 100 + abs_tol
    return ref + slack if direction == "lower" else ref - slack


def _within(value: float, limit: float, direction: str) -> bool:
    return value <= limit if direction == "lower" else value >= limit


@dataclass(frozen=True, slots=True)
class RegressionRule:
    text: str
    max_pct: float = DEFAULT_TOLERANCE_PCT
    metric: str = "tpot_ms"
    strategies: tuple[str, ...] = ()  # empty: all strategies of the reference

    needs_reference = True

    def check(self, rows: list[ResultRow], reference: list[ResultRow]) -> list[Check]:
        m = gated_metric(self.metric)
        ref_cells, new_cells = group_rows(reference), group_rows(rows)
        in_ref = {base_name(k[2]) for k in ref_cells} | {k[2] for k in ref_cells}
        out = [Check(self.text, False, f"strategy {s!r} is not in the reference (it has: "
                                       f"{', '.join(sorted({k[2] for k in ref_cells}))})", cell="reference")
               for s in self.strategies if s not in in_ref]
        for key, ref_rows in sorted(ref_cells.items(), key=lambda kv: str(kv[0])):
            if self.strategies and key[2] not in self.strategies and base_name(key[2]) not in self.strategies:
                continue
            if not all(m.applies(r) for r in ref_rows):
                continue
            ref = metric_value(ref_rows, self.metric)
            if ref is None:
                continue  # the reference has no value to hold the run to (a failed row, a non-speculative strategy)
            cell, limit = describe(key), _limit(ref, self.max_pct, m.abs_tol, m.direction)
            if key not in new_cells:
                out.append(Check(self.text, False, "in the reference but missing from this run", cell, self.metric,
                                 ref, "missing", limit))
                continue
            new = metric_value(new_cells[key], self.metric)
            if new is None:
                out.append(Check(self.text, False, "no status-ok value in this run", cell, self.metric, ref, "none",
                                 limit))
                continue
            change = f"{(new - ref) / abs(ref) * 100:+.2f}%" if ref else f"{new - ref:+.3g} from 0"
            msg = f"{change}, {m.direction} is better, tolerance {self.max_pct:g}%"
            improved = _within(new, _limit(ref, -self.max_pct, -m.abs_tol, m.direction), m.direction)
            out.append(Check(self.text, _within(new, limit, m.direction), msg, cell, self.metric, ref, new, limit,
                             improved=improved))
        return out


@dataclass(frozen=True, slots=True)
class SpeedupRule:
    """A hard floor (``speedup``), a ratchet against the reference (``ratchet``) or a goal line (``goal``)."""

    text: str
    strategy: str
    min_speedup: float = 0.0  # speedup and goal
    metric: str = "tpot_mean_ms"
    over: str = "best-other"
    exclude: tuple[str, ...] = REFERENCE_STRATEGIES
    budgets: tuple[float, ...] = ()  # empty: every budget the strategy ran at
    kind: str = "speedup"  # speedup | ratchet | goal
    margin_pct: float = DEFAULT_RATCHET_MARGIN_PCT  # ratchet
    models: tuple[str, ...] = ()  # empty: every model
    name: str = ""  # goal

    @property
    def needs_reference(self) -> bool:
        return self.kind == "ratchet"

    def speedups(self, rows: list[ResultRow]) -> dict:
        found = best_other_speedups(rows, self.strategy, self.metric, self.over, self.exclude)
        keep = {round(b, 3) for b in self.budgets}
        return {g: s for g, s in found.items()
                if (not keep or g[3] in keep) and (not self.models or g[0] in self.models)}

    def _label(self, s) -> str:
        return f"speed-up of {self.strategy} over {s.other or 'best other'} ({self.metric})"

    def check(self, rows: list[ResultRow], reference: list[ResultRow]) -> list[Check]:
        now = self.speedups(rows)
        if not now:  # a rule about a strategy this run does not hold says so and passes (a missing cell of the
            # reference fails through the regression rules instead)
            ran = sorted({r.strategy for r in rows})
            return [Check(self.text, True, f"not applicable: strategy {self.strategy!r} has no rows in this run (it "
                                           f"ran: {', '.join(ran)})", cell="run", goal=self.kind == "goal")]
        if self.kind == "ratchet":
            return self._ratchet(now, self.speedups(reference))
        out = []
        if self.budgets:
            have = {g[3] for g in now}
            for b in self.budgets:
                if round(b, 3) not in have:
                    out.append(Check(self.text, False, f"{self.strategy} did not run at budget {b:.0%}", cell="run",
                                     goal=self.kind == "goal"))
        for g, s in sorted(now.items(), key=lambda kv: str(kv[0])):
            cell = describe(g)
            if s.ratio is None:
                out.append(Check(self.text, False, s.why, cell, self._label(s), goal=self.kind == "goal"))
                continue
            met = s.ratio >= self.min_speedup
            if self.kind == "goal":
                msg = (f"{self.name or 'goal'} {self.strategy} ≥ {self.min_speedup:g}× {s.other} ({self.metric}): "
                       f"goal {'met' if met else 'not met'} (measured {s.ratio:.2f}×)")
                out.append(Check(self.text, met, msg, cell, self._label(s), None, s.ratio, self.min_speedup,
                                 goal=True))
            else:
                out.append(Check(self.text, met, f"{s.detail}; required ≥ {self.min_speedup:g}×", cell,
                                 self._label(s), None, s.ratio, self.min_speedup))
        return out

    def _ratchet(self, now: dict, ref: dict) -> list[Check]:
        out = []
        for g, r in sorted(ref.items(), key=lambda kv: str(kv[0])):
            if r.ratio is None:
                continue  # nothing committed to hold the run to
            cell, floor = describe(g), r.ratio * (1 - self.margin_pct / 100)
            s = now.get(g)
            if s is None or s.ratio is None:
                why = s.why if s is not None else f"{self.strategy} did not run here"
                out.append(Check(self.text, False, why, cell, self._label(r), r.ratio, "none", floor))
                continue
            msg = f"{s.detail}; committed {r.ratio:.4f}× (over {r.other}) − {self.margin_pct:g}%"
            out.append(Check(self.text, s.ratio >= floor, msg, cell, self._label(s), r.ratio, s.ratio, floor))
        return out


Rule = Union[SpeedupRule, RegressionRule]

_KEYS = {
    "speedup": ({"strategy", "min"}, {"over", "metric", "exclude", "budgets", "models"}),
    "goal": ({"strategy", "min"}, {"over", "metric", "exclude", "budgets", "models", "name"}),
    "ratchet": ({"strategy"}, {"over", "metric", "exclude", "budgets", "models", "margin_pct"}),
    "regression": (set(), {"max_pct", "metric", "strategies"}),
}


def _names(value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.split(",") if x.strip())


def _fraction(text: str) -> float:
    s = text.strip()
    value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    if not 0 < value <= 1:
        raise ValueError(text)
    return value


def parse_rule(text: str) -> Rule:
    """``regression metric=… max_pct=…``, ``ratchet strategy=…``, ``goal …``, ``speedup …`` → a rule."""
    def bad(why: str):
        raise UsageError(f"malformed gate rule {text!r}: {why}")

    kind, *pairs = text.split() or [""]
    if kind not in _KEYS:
        bad(f"unknown kind {kind!r}; a rule starts with {', '.join(_KEYS)}")
    required, optional = _KEYS[kind]
    opts: dict[str, str] = {}
    for pair in pairs:
        k, sep, v = pair.partition("=")
        if not sep or not k or not v:
            bad(f"{pair!r} is not key=value")
        if k not in required | optional:
            bad(f"unknown key {k!r}; {kind} takes {', '.join(sorted(required | optional))}")
        if k in opts:
            bad(f"key {k!r} given twice")
        opts[k] = v
    missing = sorted(required - set(opts))
    if missing:
        bad(f"missing {', '.join(missing)}")
    metric = opts.get("metric", "tpot_ms" if kind in ("regression", "speedup") else "tpot_mean_ms")
    try:
        gated_metric(metric)
    except UsageError as err:
        bad(str(err))

    def number(key: str, default: float) -> float:
        if key not in opts:
            return default
        try:
            value = float(opts[key])
        except ValueError:
            bad(f"{key}={opts[key]!r} is not a number")
        if not value >= 0:
            bad(f"{key} must be ≥ 0, got {opts[key]}")
        return value

    if kind == "regression":
        strategies = opts.get("strategies", "all")
        return RegressionRule(text, number("max_pct", DEFAULT_TOLERANCE_PCT), metric,
                              () if strategies == "all" else _names(strategies))
    try:
        budgets = tuple(_fraction(b) for b in _names(opts.get("budgets", "")))
    except ValueError:
        bad(f"budgets={opts['budgets']!r}: write percentages (35%) or fractions (0.35), comma-separated")
    min_speedup = number("min", 0.0)
    if kind != "ratchet" and min_speedup <= 0:
        bad("min must be > 0")
    margin = number("margin_pct", DEFAULT_RATCHET_MARGIN_PCT)
    if margin >= 100:
        bad("margin_pct must be below 100")
    return SpeedupRule(text, opts["strategy"], min_speedup, metric, opts.get("over", "best-other"),
                       _names(opts["exclude"]) if "exclude" in opts else REFERENCE_STRATEGIES, budgets, kind,
                       margin, _names(opts.get("models", "")), opts.get("name", ""))


def load_rules(path) -> tuple[Rule, ...]:
    """Rules from a TOML file: ``rules = ["regression …", "ratchet …"]`` and/or ``[[rule]]`` tables
    (``kind = "ratchet"`` plus the same keys; lists for comma-separated values)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no gate rules file at {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML ({err})") from None
    unknown = set(data) - {"rules", "rule"}
    if unknown:
        raise UsageError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}; use rules = [...] or "
                         f"[[rule]] tables")
    texts = []
    for item in data.get("rules", []):
        if not isinstance(item, str):
            raise UsageError(f"{path}: rules must be strings like \"regression max_pct=5\", got {item!r}")
        texts.append(item)
    for table in data.get("rule", []):
        table = dict(table)
        kind = table.pop("kind", "")
        texts.append(" ".join([str(kind)] + [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                                             for k, v in table.items()]))
    if not texts:
        raise UsageError(f"{path}: no rules")
    rules = []
    for text in texts:
        try:
            rules.append(parse_rule(text))
        except UsageError as err:
            raise UsageError(f"{path}: {err}") from None
    return tuple(rules)
