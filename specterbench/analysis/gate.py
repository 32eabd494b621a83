"""The gate: rules checked against a run (and a committed reference run), every failure collected.

Rules are one line each, a kind then ``key=value`` pairs (in a TOML file or on the command line)::

    speedup strategy=specter over=best-other metric=tpot_ms min=1.5
    regression metric=tpot_ms max_pct=5 strategies=all

- ``speedup``: at every (model, geometry, profile, clock, workload, tokens, budget) where ``strategy`` ran, its
  median ``metric`` against the best other lossless, status-ok strategy at the same budget (``over=best-other``,
  references ``resident`` and ``oracle`` excluded; or ``over=<name>``) must be at least ``min`` times better,
  in the metric's direction. Optional: ``exclude=a,b`` (replaces the default; ignored with ``over=<name>``),
  ``budgets=35%,50%``.
- ``regression``: no selected strategy's median ``metric`` in any cell of the reference may be worse than the
  reference's by more than ``max_pct`` percent; a reference cell missing from the run fails too.
  ``strategies=all`` (default) or ``strategies=lru,specter``.

Besides the rules, every row of the run whose status is not ``ok`` is a failure. :func:`run_gate` returns a
:class:`GateResult`; its ``exit_code`` is 0 (all passed) or 1 (failures). Bad input — a malformed rule, an
unreadable file, incompatible runs — raises :class:`UsageError` (the CLI's exit code 2).
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from specterbench.analysis.compare import cell_key, check_compatible, group_cells, median_of
from specterbench.errors import UsageError
from specterbench.bench.results import DIRECTIONS, ResultRow, read_rows

DEFAULT_REFERENCE = Path("results/reference")
DEFAULT_RULES = DEFAULT_REFERENCE / "gate.toml"
REFERENCE_STRATEGIES = ("resident", "oracle")  # bounds, not competitors


@dataclass(frozen=True, slots=True)
class Check:
    rule: str  # the rule's text, or "status" for the implicit every-row-ok rule
    passed: bool
    message: str


@dataclass(slots=True)
class GateResult:
    rules: tuple = ()
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        """0 when every check passed, 1 otherwise (bad input is a :class:`UsageError`, exit code 2)."""
        return 0 if self.ok else 1


# ---- rules --------------------------------------------------------------------------------------------

def _describe(rows: list[ResultRow]) -> str:
    r = rows[0]
    where = r.model if r.geometry == r.model else f"{r.model} at {r.geometry} geometry"
    clock = {"modeled": f"modeled {r.profile}", "measured": "measured", "host": "host wall"}.get(r.clock, r.clock)
    return f"{r.strategy} @ {r.budget_fraction:.0%} ({where}, {clock}, {r.workload}, {r.new_tokens} tokens)"


def _group_key(row: ResultRow) -> tuple:
    key = cell_key(row)
    return key[:2] + key[3:]  # the cell without the strategy


def _better_ratio(own: float, other: float, direction: str) -> float:
    """How many times better ``own`` is than ``other`` (> 1: better), in the metric's direction."""
    num, den = (other, own) if direction == "lower" else (own, other)
    if den == 0:
        return float("inf") if num > 0 else 1.0
    return num / den


@dataclass(frozen=True, slots=True)
class SpeedupRule:
    text: str
    strategy: str
    min_speedup: float
    metric: str = "tpot_ms"
    over: str = "best-other"
    exclude: tuple[str, ...] = REFERENCE_STRATEGIES
    budgets: tuple[float, ...] = ()  # empty: every budget the strategy ran at

    needs_reference = False

    def check(self, rows: list[ResultRow], reference: list[ResultRow]) -> list[Check]:
        direction = DIRECTIONS[self.metric]
        groups: dict[tuple, dict[str, list[ResultRow]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            groups[_group_key(r)][r.strategy].append(r)
        mine = {g: by[self.strategy] for g, by in groups.items() if self.strategy in by}
        if not mine:
            ran = sorted({r.strategy for r in rows})
            return [self._fail(f"strategy {self.strategy!r} has no rows in this run (it ran: {', '.join(ran)})")]
        out = []
        if self.budgets:
            have = {g[2] for g in mine}
            for b in self.budgets:
                if round(b, 3) not in have:
                    out.append(self._fail(f"{self.strategy} did not run at budget {b:.0%} (it ran at "
                                          f"{', '.join(f'{x:.0%}' for x in sorted(have))})"))
            mine = {g: v for g, v in mine.items() if g[2] in {round(b, 3) for b in self.budgets}}
        for g, own_rows in sorted(mine.items(), key=lambda kv: str(kv[0])):
            cell = _describe(own_rows)
            own = median_of(own_rows, self.metric)
            if own is None:
                out.append(self._fail(f"{cell}: no status-ok {self.metric} to compare"))
                continue
            others = {}
            for s, srows in groups[g].items():
                if s == self.strategy or (s != self.over if self.over != "best-other" else s in self.exclude):
                    continue
                value = median_of(srows, self.metric)
                if value is not None and all(r.lossless_strategy for r in srows):
                    others[s] = value
            if not others:
                who = (f"strategy {self.over!r}" if self.over != "best-other" else
                       f"other lossless status-ok strategy (excluded: {', '.join(self.exclude) or 'none'})")
                out.append(self._fail(f"{cell}: no {who} at this budget to compare with"))
                continue
            pick = min if direction == "lower" else max
            best = pick(others, key=others.get)
            ratio = _better_ratio(own, others[best], direction)
            msg = (f"{cell}: {self.metric} {own:.4g} vs {best} {others[best]:.4g} → {ratio:.3f}× "
                   f"({direction} is better; required ≥ {self.min_speedup:g}×)")
            out.append(Check(self.text, ratio >= self.min_speedup, msg))
        return out

    def _fail(self, message: str) -> Check:
        return Check(self.text, False, message)


@dataclass(frozen=True, slots=True)
class RegressionRule:
    text: str
    max_pct: float
    metric: str = "tpot_ms"
    strategies: tuple[str, ...] = ()  # empty: all strategies of the reference

    needs_reference = True

    def check(self, rows: list[ResultRow], reference: list[ResultRow]) -> list[Check]:
        direction = DIRECTIONS[self.metric]
        ref_cells, new_cells = group_cells(reference), group_cells(rows)
        in_ref = {k[2] for k in ref_cells}
        out = [Check(self.text, False, f"strategy {s!r} is not in the reference (it has: {', '.join(sorted(in_ref))})")
               for s in self.strategies if s not in in_ref]
        for key, ref_rows in sorted(ref_cells.items(), key=lambda kv: str(kv[0])):
            if self.strategies and key[2] not in self.strategies:
                continue
            ref = median_of(ref_rows, self.metric)
            if ref is None:
                continue  # the reference has no value to hold the run to (a failed or host-clock row)
            cell = _describe(ref_rows)
            if key not in new_cells:
                out.append(Check(self.text, False, f"{cell}: in the reference but missing from this run"))
                continue
            new = median_of(new_cells[key], self.metric)
            if new is None:
                out.append(Check(self.text, False, f"{cell}: no status-ok {self.metric} in this run"))
                continue
            change = (new - ref) / abs(ref) * 100 if ref else (0.0 if new == ref else float("inf"))
            worse_pct = change if direction == "lower" else -change
            msg = (f"{cell}: {self.metric} {ref:.4g} → {new:.4g} ({change:+.2f}%, {direction} is better; "
                   f"allowed worse by ≤ {self.max_pct:g}%)")
            if worse_pct < -self.max_pct:
                msg += "; better than the reference by more than the tolerance: refresh it with `make reference`"
            out.append(Check(self.text, worse_pct <= self.max_pct, msg))
        return out


Rule = Union[SpeedupRule, RegressionRule]

_KEYS = {
    "speedup": ({"strategy", "min"}, {"over", "metric", "exclude", "budgets"}),
    "regression": ({"max_pct"}, {"metric", "strategies"}),
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
    """``speedup strategy=specter min=1.5 …`` or ``regression max_pct=5 …`` → a rule; bad text → UsageError."""
    def bad(why: str):
        raise UsageError(f"malformed gate rule {text!r}: {why}")

    kind, *pairs = text.split() or [""]
    if kind not in _KEYS:
        bad(f"unknown kind {kind!r}; a rule starts with {' or '.join(_KEYS)}")
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
    metric = opts.get("metric", "tpot_ms")
    if metric not in DIRECTIONS:
        bad(f"unknown metric {metric!r}; known: {', '.join(DIRECTIONS)}")

    def number(key: str) -> float:
        try:
            value = float(opts[key])
        except ValueError:
            bad(f"{key}={opts[key]!r} is not a number")
        if not value >= 0:
            bad(f"{key} must be ≥ 0, got {opts[key]}")
        return value

    if kind == "speedup":
        try:
            budgets = tuple(_fraction(b) for b in _names(opts.get("budgets", "")))
        except ValueError:
            bad(f"budgets={opts['budgets']!r}: write percentages (35%) or fractions (0.35), comma-separated")
        min_speedup = number("min")
        if min_speedup <= 0:
            bad("min must be > 0")
        return SpeedupRule(text, opts["strategy"], min_speedup, metric, opts.get("over", "best-other"),
                           _names(opts["exclude"]) if "exclude" in opts else REFERENCE_STRATEGIES, budgets)
    strategies = opts.get("strategies", "all")
    return RegressionRule(text, number("max_pct"), metric, () if strategies == "all" else _names(strategies))


def load_rules(path) -> tuple[Rule, ...]:
    """Rules from a TOML file: ``rules = ["speedup …", "regression …"]`` and/or ``[[rule]]`` tables
    (``kind = "speedup"`` plus the same keys; lists for comma-separated values)."""
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


# ---- running ----------------------------------------------------------------------------------------

def load_reference(path=DEFAULT_REFERENCE, on_error: str = "stop") -> list[ResultRow]:
    """The committed reference rows (a run folder or a ``rows.jsonl``); missing → how to make one."""
    path = Path(path)
    if not (path / "rows.jsonl" if path.is_dir() or not path.suffix else path).exists():
        raise UsageError(f"no reference result at {path}; create it on purpose with `make reference` and commit it")
    return read_rows(path, on_error=on_error)


def run_gate(rows: list[ResultRow], reference_rows: list[ResultRow] | None, rules) -> GateResult:
    """Check every rule (strings are parsed) and the status of every row; collect every failure."""
    rules = tuple(parse_rule(r) if isinstance(r, str) else r for r in rules)
    if not rules:
        raise UsageError("no gate rules given; pass a rules file or --rule")
    if not rows:
        raise UsageError("the run has no rows; nothing to gate")
    reference_rows = list(reference_rows or [])
    if any(r.needs_reference for r in rules):
        if not reference_rows:
            raise UsageError("a regression rule needs a reference result (results/reference/rows.jsonl); create "
                             "it with `make reference`")
        check_compatible(reference_rows, rows, ("reference", "run"))
    result = GateResult(rules)
    for r in sorted(rows, key=cell_key):
        if r.status != "ok":
            result.checks.append(Check("status", False, f"{_describe([r])} (repeat {r.repeat}): row is "
                                                        f"{r.status}: {r.error}"))
    for rule in rules:
        result.checks.extend(rule.check(rows, reference_rows))
    return result


def render(result: GateResult, *, passes: bool = True) -> str:
    """Failures first, each under its rule; then the passing checks (unless ``passes=False``)."""
    n_rules = len(result.rules)
    head = (f"gate: PASSED — {len(result.checks)} checks" if result.ok else
            f"gate: FAILED — {len(result.failures)} of {len(result.checks)} checks failed")
    lines = [f"{head} ({n_rules} rule{'s' * (n_rules != 1)} and every row's status)"]
    for c in result.failures:
        lines.append(f"FAIL  [{c.rule}] {c.message}")
    if passes:
        for c in result.checks:
            if c.passed:
                lines.append(f"ok    [{c.rule}] {c.message}")
    return "\n".join(lines) + "\n"
