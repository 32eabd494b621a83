"""The command line: ``specterbench <command>``, one module of this package per command or family of commands.

This is the top layer: it maps argparse onto the library's own constructors and checks, prints, and turns a
:class:`~specterbench.errors.SpecterbenchError` into one line and exit 2. A command's module imports what the
command needs when it runs (the one place in the package where function-local imports are allowed).
"""

from __future__ import annotations

import argparse
import os
import sys

from specterbench.bench.progress import quiet_library_bars
from specterbench.cli import (
    calibrate,
    fit,
    gate,
    listing,
    maintain,
    overhead,
    published,
    quality,
    results,
    run,
    studies,
    sweep,
    wallclock,
)
from specterbench.errors import SpecterbenchError

#: the commands, in the order ``specterbench --help`` lists them
COMMANDS = (listing, run, sweep, fit, quality, overhead, results, gate, calibrate, published, studies, wallclock,
            maintain)


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``specterbench run: error: …; see specterbench run --help``), exit 2, like
    every other bad input; subcommand parsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"specterbench: error: {self.prog}: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="specterbench", description="Benchmark MoE expert-offloading strategies.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    for command in sub.choices.values():  # --debug after the subcommand too; SUPPRESS keeps one given before it
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return p


def join_dash_values(argv: list[str]) -> list[str]:
    """``--budgets -5%`` → ``--budgets=-5%``: argparse reads a value that starts with '-' as an option and
    answers "expected one argument"; joined, the value reaches its own check, which names the problem."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if token.startswith("--") and "=" not in token and nxt[:1] == "-" and nxt[1:2].isdigit():
            out.append(f"{token}={nxt}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def main(argv=None) -> int:
    parser = build_parser()
    argv = join_dash_values(list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # a one-line argparse error (or --help): its exit code, also when called in-process
        return stop.code if isinstance(stop.code, int) else 2
    args.argv = argv
    quiet_library_bars()
    try:
        return args.func(args)
    except SpecterbenchError as err:
        if args.debug:
            raise
        print(f"specterbench: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C while a run writes its summary: still one line, rows kept
        run_dir = getattr(args, "run_folder", None)
        kept = (f"; the finished rows are kept in {run_dir}; continue with --resume {run_dir}"
                if run_dir is not None and (run_dir / "rows.jsonl").exists() else "")
        print(f"specterbench: interrupted{kept}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`specterbench list | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141  # 128 + SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
