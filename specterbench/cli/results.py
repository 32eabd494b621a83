"""``specterbench report`` (a run's table, summary and plots, rewritten) and ``specterbench compare`` (two runs,
metric by metric)."""

from __future__ import annotations

from pathlib import Path

from specterbench.cli.options import add_output_argument, csv_list, flag_integrity, report_files, run_folder_arg
from specterbench.errors import UsageError


def cmd_report(args) -> int:
    import sys

    from specterbench.analysis.formats import check_format, render
    from specterbench.analysis.plots import write_plots
    from specterbench.analysis.report import write_summary
    from specterbench.runfiles.results import read_rows

    check_format(args.output)
    run_dir = run_folder_arg(args.run_dir)
    rows = read_rows(run_dir, on_error=args.on_error)
    flag_integrity(rows, run_dir)
    print(render(rows, args.output, wide=getattr(args, "wide", False)), end="")
    say = print if args.output == "md" else (lambda line: print(line, file=sys.stderr))  # stdout: the table alone
    with report_files(run_dir, f"specterbench report {run_dir}"):
        say(f"summary: {write_summary(run_dir, rows)}")
        for plot in write_plots(run_dir, rows):
            say(f"plot: {plot}")
    return 0


def cmd_compare(args) -> int:
    from specterbench.analysis.compare import compare_runs, render_comparison
    from specterbench.runfiles.results import read_rows

    base = read_rows(run_folder_arg(args.base), on_error=args.on_error)
    new = read_rows(run_folder_arg(args.new), on_error=args.on_error)
    flag_integrity(base, Path(args.base))
    flag_integrity(new, Path(args.new))
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha {args.alpha} must be in (0, 1), e.g. 0.05")
    df = compare_runs(base, new, alpha=args.alpha, metrics=csv_list(args.metrics) or None,
                      test_wall_time=args.test_wall_time)
    print(render_comparison(df, only_changed=args.only_changed), end="")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("report", help="rewrite summary.md and plots of a run and print its table")
    s.add_argument("run_dir")
    s.add_argument("--on-error", choices=("stop", "skip"), default="stop", help="on a corrupt row")
    s.add_argument("--wide", action="store_true", help="print every column of the table")
    add_output_argument(s)
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("compare", help="per-metric deltas between two runs, with direction and significance")
    s.add_argument("base")
    s.add_argument("new")
    s.add_argument("--metrics", default="", help="comma-separated metrics (default: all with a direction)")
    s.add_argument("--only-changed", action="store_true")
    s.add_argument("--alpha", type=float, default=0.05, help="significance level")
    s.add_argument("--test-wall-time", action="store_true", help="test host wall time for significance too "
                   "(off by default: on a shared machine it is mostly noise)")
    s.add_argument("--on-error", choices=("stop", "skip"), default="stop", help="on a corrupt row")
    s.set_defaults(func=cmd_compare)

