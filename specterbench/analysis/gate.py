"""The gate: the rules of :mod:`specterbench.analysis.gate_rules` checked against a run and the committed
reference run, every failure collected.

Besides the rules, a row whose status is not ``ok`` fails (a lossless strategy whose tokens diverged is a failed
``lossless`` check), and when a reference is used every cell of the run must be in it. :func:`run_gate` returns a
:class:`GateResult` (exit code 0 or 1); bad input raises :class:`UsageError` (the CLI's exit code 2).
:func:`render` prints one line per failing check (cell, metric, reference, now, limit) and the goal lines;
``--json PATH`` writes the same for CI systems. Run it as ``specterbench gate RUN``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from specterbench.analysis.compare import check_compatible
from specterbench.analysis.gate_metrics import check_decode, describe, gate_key, group_rows
from specterbench.analysis.gate_rules import Check, parse_rule
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow, read_rows

DEFAULT_REFERENCE = Path("results/reference")
DEFAULT_RULES = DEFAULT_REFERENCE / "gate.toml"


@dataclass(slots=True)
class GateResult:
    rules: tuple = ()
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed and not c.goal]

    @property
    def goals(self) -> list[Check]:
        return [c for c in self.checks if c.goal]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        """0 when every check passed, 1 otherwise (bad input is a :class:`UsageError`, exit code 2)."""
        return 0 if self.ok else 1

    def to_dict(self) -> dict:
        gated = [c for c in self.checks if not c.goal]
        return {"ok": self.ok, "checks": len(gated), "failed": len(self.failures),
                "rules": [r.text for r in self.rules],
                "failures": [asdict(c) for c in self.failures], "goals": [asdict(c) for c in self.goals]}


# ---- running ------------------------------------------------------------------------------------------------

def load_reference(path=DEFAULT_REFERENCE, on_error: str = "stop") -> list[ResultRow]:
    """The committed reference rows (a run folder or a ``rows.jsonl``); missing → how to make one."""
    path = Path(path)
    if not (path / "rows.jsonl" if path.is_dir() or not path.suffix else path).exists():
        raise UsageError(f"no reference result at {path}; create it on purpose with `make reference` and commit it")
    return read_rows(path, on_error=on_error)


def _status_checks(rows: list[ResultRow]) -> list[Check]:
    out = []
    for r in sorted(rows, key=lambda r: str(gate_key(r))):
        if r.status == "ok":
            continue
        where = f"{describe(gate_key(r))} (repeat {r.repeat})"
        if r.status == "diverged":
            out.append(Check("status", False, r.error or "tokens differ from the reference", where, "lossless",
                             "identical tokens", f"diverged at {r.first_divergence}", "identical tokens"))
        else:
            out.append(Check("status", False, f"row is {r.status}: {r.error}", where, "status", "ok", r.status, "ok"))
    return out


def _coverage_checks(rows: list[ResultRow], reference: list[ResultRow]) -> list[Check]:
    known = group_rows(reference)
    return [Check("coverage", False, "this cell is not in the reference: record it on purpose with `make reference`",
                  describe(key)) for key in sorted(group_rows(rows), key=str) if key not in known]


def _check_comparable(reference: list[ResultRow], rows: list[ResultRow]) -> None:
    """Refuse a reference that shares no cell with the run (another model, profile, decode…), naming why; when
    some cells match, the coverage checks name each new or missing one instead (a stand-in joining the grid)."""
    check_decode(reference, rows)
    same_schema = {r.schema_version for r in reference} == {r.schema_version for r in rows}
    if same_schema and set(group_rows(reference)) & set(group_rows(rows)):
        return
    check_compatible(reference, rows, ("reference", "run"))
    raise UsageError("the run and the reference have no cell in common (compare their workloads, tokens and "
                     "prompts); gate a run of the reference's grid, or record a new reference with `make reference`")


def run_gate(rows: list[ResultRow], reference_rows: list[ResultRow] | None, rules) -> GateResult:
    """Check every rule (strings are parsed) and the status of every row; collect every failure."""
    rules = tuple(parse_rule(r) if isinstance(r, str) else r for r in rules)
    if not rules:
        raise UsageError("no gate rules given; pass a rules file or --rule")
    if not rows:
        raise UsageError("the run has no rows; nothing to gate")
    reference_rows = list(reference_rows or [])
    result = GateResult(rules)
    result.checks.extend(_status_checks(rows))
    if any(r.needs_reference for r in rules):
        if not reference_rows:
            raise UsageError("a regression or ratchet rule needs a reference result (results/reference/rows.jsonl); "
                             "create it with `make reference`")
        _check_comparable(reference_rows, rows)
        result.checks.extend(_coverage_checks(rows, reference_rows))
    for rule in rules:
        result.checks.extend(rule.check(rows, reference_rows))
    return result


def render(result: GateResult, *, passes: bool = True) -> str:
    """A head line, one line per failing check, the goal lines, then (unless ``passes=False``) the passes."""
    n_rules, n_checks = len(result.rules), len(result.checks) - len(result.goals)
    head = (f"gate: PASSED — {n_checks} checks" if result.ok else
            f"gate: FAILED — {len(result.failures)} of {n_checks} checks failed")
    lines = [f"{head} ({n_rules} rule{'s' * (n_rules != 1)}, every row's status and the reference's coverage)"]
    lines += [f"FAIL  {c.line()}  [{c.rule}]" for c in result.failures]
    lines += [f"goal  {c.cell}: {c.message}" for c in result.goals]
    better = sum(c.improved for c in result.checks)
    if better:
        lines.append(f"note  {better} metric(s) better than the reference beyond the tolerance: lock them in on "
                     f"purpose with `make reference`")
    if passes:
        lines += [f"ok    {c.line()}" for c in result.checks if c.passed and not c.goal]
    return "\n".join(lines) + "\n"


# ---- command line -------------------------------------------------------------------------------------------
