"""``specterbench gate`` (a run against the rules and the committed reference) and ``specterbench gate-reference``
(moving the reference on purpose)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from specterbench.analysis.gate import DEFAULT_REFERENCE, DEFAULT_RULES, load_reference, render, run_gate
from specterbench.analysis.gate_reference import accept
from specterbench.analysis.gate_rules import Check, load_rules, parse_rule
from specterbench.errors import UsageError
from specterbench.runfiles.results import integrity_problems, read_rows
from specterbench.runfiles.rundir import run_ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="+", help="run folder(s); several are gated as one run (make gate runs one "
                   "per model, in parallel)")
    p.add_argument("--reference", default=str(DEFAULT_REFERENCE))
    p.add_argument("--rules", help=f"TOML rules file (default {DEFAULT_RULES})")
    p.add_argument("--rule", action="append", help="a rule, e.g. 'ratchet strategy=specter metric=tpot_mean_ms' "
                   "(repeatable)")
    p.add_argument("--failures-only", action="store_true", help="print failures and goal lines, not the passes")
    p.add_argument("--json", metavar="PATH", help="also write the failures and goal lines as JSON (for CI)")
    p.add_argument("--on-error", choices=("stop", "skip"), default="stop", help="on a corrupt row")


def add_parser(sub) -> None:
    s = sub.add_parser("gate", help="check a run against rules and the committed reference; exit 1 on failure")
    add_arguments(s)
    s.set_defaults(func=cmd_gate)
    add_reference_parser(sub)


def cmd_gate(args) -> int:
    rules = [parse_rule(t) for t in args.rule or []]
    if args.rules or not rules:
        rules = list(load_rules(args.rules or DEFAULT_RULES)) + rules
    dirs = args.run_dir if isinstance(args.run_dir, list) else [args.run_dir]
    by_dir = {d: read_rows(Path(d), on_error=args.on_error) for d in dirs}
    rows = [r for d in dirs for r in by_dir[d]]
    reference = (load_reference(args.reference, on_error=args.on_error)
                 if any(r.needs_reference for r in rules) else [])
    result = run_gate(rows, reference, rules)
    for d, dir_rows in by_dir.items():  # a duplicated cell or a foreign run's rows would be gated as this run's
        result.checks.extend(Check("integrity", False, problem, str(d))
                             for problem in integrity_problems(dir_rows, Path(d) / "rows.jsonl", run_ids(Path(d))))
    print(render(result, passes=not args.failures_only), end="")
    if getattr(args, "json", None):
        try:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result.to_dict(), indent=1, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
        except OSError as err:
            raise UsageError(f"cannot write --json {args.json} ({err.strerror or err}); give a writable path (and "
                             f"check free disk space); the verdict above stands") from None
    return result.exit_code


def add_reference_parser(sub) -> None:
    p = sub.add_parser("gate-reference", help="replace the committed gate reference with a candidate run, on "
                       "purpose (make reference)")
    p.add_argument("candidate", nargs="+", help="run folder(s) of the gate grid (make reference writes one per "
                   "model: results/reference-candidate-<model>)")
    p.add_argument("--reference", default=str(DEFAULT_REFERENCE))
    p.add_argument("--rules", help="TOML rules file whose ratchets are checked (default <reference>/gate.toml)")
    p.add_argument("--allow-regression", action="store_true",
                   default=os.environ.get("ALLOW_REGRESSION", "") not in ("", "0"),
                   help="accept worse metrics or lower ratchets (default: the ALLOW_REGRESSION variable)")
    p.add_argument("--reason", default=os.environ.get("REASON", ""),
                   help="why the regression is right (default: the REASON variable); appended to CHANGELOG.md")
    p.set_defaults(func=cmd_reference)


def cmd_reference(args) -> int:
    return accept(args.candidate, args.reference, args.rules, allow_regression=args.allow_regression,
                  reason=args.reason)
