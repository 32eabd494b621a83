"""Moving the committed reference on purpose (``make reference``).

A candidate run of the gate grid is compared with the committed reference, cell by cell: every gated metric
(:data:`specterbench.analysis.gate_metrics.METRICS`) and every ratchet of the rules file that moved is printed,
better or worse. The candidate (one run folder, or several: ``make reference`` runs one per model in parallel)
replaces the reference — its rows and reference tokens, and a summary rewritten from them — only when
nothing got worse: no metric worse than the reference beyond float noise (:data:`NOISE_REL`; the modeled clock is
deterministic, so a re-record of unchanged code moves nothing), no ratchet lower, no reference cell gone and no
candidate row failed. Otherwise it refuses (exit 1) unless ``--allow-regression`` comes with a ``--reason``, which
is appended with every accepted regression to ``CHANGELOG.md`` beside the reference. The tolerance of the gate is
not used here: re-recording within it, again and again, would let a metric creep.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path

from specterbench.analysis.gate import DEFAULT_REFERENCE
from specterbench.analysis.gate_metrics import METRICS, describe, group_rows, metric_value
from specterbench.analysis.gate_rules import SpeedupRule, load_rules
from specterbench.analysis.report import write_summary
from specterbench.errors import UsageError
from specterbench.runfiles.results import ResultRow, read_rows
from specterbench.runfiles.rundir import write_merged_run_json

NOISE_REL = 1e-9  # relative change below which a value has not moved (float summation order)
INSTALLED = ("rows.jsonl", "reference.jsonl")  # concatenated over the candidate folders; summary.md is rewritten


@dataclass(frozen=True, slots=True)
class Move:
    cell: str
    what: str  # a metric name or "ratchet <rule>"
    old: float | None
    new: float | None
    worse: bool

    def line(self) -> str:
        def show(v):
            return "none" if v is None else f"{v:.6g}"

        label = "WORSE " if self.worse else "new   " if self.old is None else "better"
        if self.old is None and self.new is None:  # a cell added, removed or failed
            return f"{label}  {self.cell} · {self.what}"
        change = (f" ({(self.new - self.old) / abs(self.old) * 100:+.3f}%)"
                  if self.old and self.new is not None else "")
        return f"{label}  {self.cell} · {self.what}: {show(self.old)} → {show(self.new)}{change}"


def _moved(old: float, new: float, abs_tol: float) -> bool:
    return abs(new - old) > max(abs(old) * NOISE_REL, abs_tol * 1e-3)


def metric_moves(previous: list[ResultRow], candidate: list[ResultRow]) -> list[Move]:
    """Every (cell, gated metric) whose value changed, plus cells that vanished or failed."""
    old_cells, new_cells = group_rows(previous), group_rows(candidate)
    out = []
    for key in sorted(set(old_cells) | set(new_cells), key=str):
        cell = describe(key)
        if key not in new_cells:
            out.append(Move(cell, "cell removed from the grid", None, None, True))
            continue
        bad = [r for r in new_cells[key] if r.status != "ok"]
        if bad:
            out.append(Move(cell, f"row {bad[0].status}: {bad[0].error}", None, None, True))
        if key not in old_cells:
            out.append(Move(cell, "cell added to the grid", None, None, False))
            continue
        for m in METRICS.values():
            if not all(m.applies(r) for r in new_cells[key]):
                continue
            old, new = metric_value(old_cells[key], m.name), metric_value(new_cells[key], m.name)
            if old is None and new is None:
                continue
            if old is None or new is None:
                out.append(Move(cell, m.name, old, new, new is None))
            elif _moved(old, new, m.abs_tol):
                out.append(Move(cell, m.name, old, new, (new > old) == (m.direction == "lower")))
    return out


def ratchet_moves(previous: list[ResultRow], candidate: list[ResultRow], rules) -> list[Move]:
    """Every ratchet (per cell of its strategy) whose committed speed-up would change; a lower one is worse."""
    out = []
    for rule in rules:
        if not (isinstance(rule, SpeedupRule) and rule.kind == "ratchet"):
            continue
        old, new = rule.speedups(previous), rule.speedups(candidate)
        for key in sorted(set(old) | set(new), key=str):
            a = old[key].ratio if key in old else None
            b = new[key].ratio if key in new else None
            what = f"ratchet [{rule.text}]" + (f" over {new[key].other}" if b is not None else "")
            if a is None and b is None:
                continue
            if a is None or b is None or _moved(a, b, 0.0):
                out.append(Move(describe(key), what, a, b, b is None or (a is not None and b < a)))
    return out


def changelog_entry(moves: list[Move], reason: str, candidate: list[ResultRow], now: dt.datetime) -> str:
    sha = next((r.env.get("git_sha") for r in candidate if isinstance(r.env, dict) and r.env.get("git_sha")), "?")
    worse = [m for m in moves if m.worse]
    lines = [f"## {now:%Y-%m-%d %H:%M} UTC · code {sha} · {len(worse)} accepted regression(s)", "",
             f"Reason: {reason}", ""]
    lines += [f"- {m.line()}" for m in worse]
    return "\n".join(lines) + "\n\n"


def install(candidate_dirs: list[Path], reference_dir: Path, rows: list[ResultRow]) -> None:
    """The candidate's files into the reference folder (nothing stale left), and its summary."""

    reference_dir.mkdir(parents=True, exist_ok=True)
    for name in INSTALLED:
        parts = [d / name for d in candidate_dirs if (d / name).exists()]
        if parts:
            (reference_dir / name).write_bytes(b"".join(p.read_bytes() for p in parts))
        elif (reference_dir / name).exists():
            (reference_dir / name).unlink()
    write_merged_run_json(reference_dir, {r.run_id for r in rows})  # one run per model, merged on purpose
    write_summary(reference_dir, rows)


def accept(candidate_dirs, reference_dir=DEFAULT_REFERENCE, rules_path=None, *, allow_regression: bool = False,
           reason: str = "", now: dt.datetime | None = None, out=sys.stdout) -> int:
    """Compare, print, and install the candidate (0) or refuse (1); see the module docstring."""
    if isinstance(candidate_dirs, (str, Path)):
        candidate_dirs = [candidate_dirs]
    candidate_dirs, reference_dir = [Path(d) for d in candidate_dirs], Path(reference_dir)
    if allow_regression and not reason.strip():
        raise UsageError('ALLOW_REGRESSION=1 needs a reason: make reference ALLOW_REGRESSION=1 REASON="why it is '
                         'right that this got worse"')
    candidate = [r for d in candidate_dirs for r in read_rows(d)]
    if not candidate:
        raise UsageError(f"{', '.join(map(str, candidate_dirs))}: no rows; nothing to record")
    rules = load_rules(rules_path or reference_dir / "gate.toml")
    previous = read_rows(reference_dir) if (reference_dir / "rows.jsonl").exists() else []
    moves = metric_moves(previous, candidate) + ratchet_moves(previous, candidate, rules) if previous else []
    if not previous:
        print(f"reference: no previous reference at {reference_dir}; recording the first one", file=out)
        moves = [Move(describe(k), f"row {rs[0].status}: {rs[0].error}", None, None, True)
                 for k, rs in group_rows(candidate).items() if rs[0].status != "ok"]
    worse = [m for m in moves if m.worse]
    print(f"reference: {len(moves)} change(s), {len(worse)} of them worse", file=out)
    for m in sorted(moves, key=lambda m: m.worse):  # the regressions last, next to the verdict
        print(f"  {m.line()}", file=out)
    if worse and not allow_regression:
        print(f"reference: REFUSED — {len(worse)} regression(s); the reference is unchanged. If they are intended: "
              f'make reference ALLOW_REGRESSION=1 REASON="…" (the reason goes to {reference_dir}/CHANGELOG.md)',
              file=out)
        return 1
    install(candidate_dirs, reference_dir, candidate)
    if worse or not previous:
        log = reference_dir / "CHANGELOG.md"
        head = "" if log.exists() else "# Changes to the committed gate reference\n\n"
        text = changelog_entry(worse, reason.strip() or "first reference", candidate,
                               now or dt.datetime.now(dt.timezone.utc))
        with open(log, "a", encoding="utf-8") as f:
            f.write(head + text)
        print(f"reference: accepted with {len(worse)} regression(s); reason appended to {log}", file=out)
    print(f"reference: {reference_dir} now holds the candidate's {len(candidate)} rows; review "
          f"`git diff {reference_dir}` and commit it", file=out)
    return 0
