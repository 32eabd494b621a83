"""``specterbench wallclock-compare``: the harness's own hot paths, two pytest-benchmark runs side by side."""

from __future__ import annotations

from pathlib import Path

from specterbench.analysis.wallclock import (
    DEFAULT_MAX_SLOWDOWN,
    DEFAULT_STAT,
    STATS,
    check_max_slowdown,
    compare,
    saved_runs,
)
from specterbench.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("wallclock-compare", help="compare two pytest-benchmark runs of the harness's hot paths "
                       "(make bench-wallclock-compare)")
    p.add_argument("paths", nargs="*", help="a storage folder (newest saved run vs the one before) or BASE NEW")
    p.add_argument("--stat", default=DEFAULT_STAT, choices=STATS)
    p.add_argument("--max-slowdown", type=float, default=DEFAULT_MAX_SLOWDOWN)
    p.add_argument("--check-only", action="store_true", help="check the options and stop (before a measurement)")
    p.set_defaults(func=cmd_wallclock_compare)


def cmd_wallclock_compare(args) -> int:
    check_max_slowdown(args.max_slowdown)
    if args.check_only:
        return 0
    if len(args.paths) == 1:
        runs = saved_runs(Path(args.paths[0]))
        if len(runs) < 2:
            print(f"{args.paths[0]}: {len(runs)} saved run(s); this one is the baseline for the next "
                  f"`make bench-wallclock-compare`")
            return 0
        base, new = runs[-2], runs[-1]
    elif len(args.paths) == 2:
        base, new = map(Path, args.paths)
    else:
        raise UsageError("give a storage folder, or two JSON files (BASE NEW)")
    passed, report = compare(base, new, args.stat, args.max_slowdown)
    print(report)
    return 0 if passed else 1
