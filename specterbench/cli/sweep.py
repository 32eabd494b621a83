"""``specterbench sweep GRID``: run a grid file on local processes or a Ray cluster into one run folder."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from specterbench.errors import UsageError


def add_parser(sub) -> None:
    """Add ``specterbench sweep`` to the CLI's subparsers."""
    s = sub.add_parser("sweep", help="run a grid file's cells on local processes or a Ray cluster, into one run")
    s.add_argument("grid", help="grid file (TOML): models, strategies, budgets, profiles, geometry, seeds, ...")
    s.add_argument("--executor", choices=("local", "ray"), default="local")
    s.add_argument("--jobs", type=int, help="local: cells at once (default: CPU cores / threads, or GPUs)")
    s.add_argument("--address", help="ray: 'auto' (running cluster), 'ray://host:port' (Ray Client); default: "
                   "a local Ray instance")
    s.add_argument("--retries", type=int, default=0, help="ray: reruns of a cell whose worker or node died")
    s.add_argument("--out", default="results")
    s.add_argument("--run-id")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue a sweep, skipping finished cells")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--wide", action="store_true", help="print every column of the table")
    s.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    from specterbench.analysis.report import render_markdown, write_summary
    from specterbench.bench.executors import LocalExecutor, RayExecutor
    from specterbench.bench.grid import load_grid
    from specterbench.bench.sweep import Sweep
    from specterbench.plugins.host import get_host
    from specterbench.runfiles.results import read_rows

    host = get_host()
    grid = load_grid(args.grid)
    if args.executor == "ray":
        executor = RayExecutor(args.address, retries=args.retries)
    else:
        if args.address:
            raise UsageError("--address is for --executor ray")
        if args.retries:
            raise UsageError("--retries is for --executor ray (the local pool reruns a cell whose worker died once, "
                             "by itself); drop it or add --executor ray")
        executor = LocalExecutor(args.jobs)
    if args.resume:
        from specterbench.runfiles.rundir import check_resume_target, check_same_grid, explicit_dests

        run_dir = Path(args.resume)
        out = args.out if "out" in explicit_dests(getattr(args, "argv", []), ["out"]) else None
        check_resume_target(run_dir, "sweep", {"run_id": args.run_id, "out_explicit": out})
        check_same_grid(run_dir, args.grid)
    else:
        if args.run_id is not None and (not args.run_id.strip() or "/" in args.run_id or args.run_id in (".", "..")):
            raise UsageError(f"--run-id {args.run_id!r} must be a plain folder name (no '/'); use --out for the "
                             f"parent")
        run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S") + "-sweep-" + Path(args.grid).stem
        run_dir = Path(args.out) / run_id
    sweep = Sweep(host, grid, run_dir, executor=executor, resume=bool(args.resume), quiet=args.quiet)
    executor.check(grid)
    if not args.resume and (run_dir / "rows.jsonl").exists():
        raise UsageError(f"run folder {run_dir} already holds rows; continue it with specterbench sweep {args.grid} "
                         f"--resume {run_dir}, or pick another --run-id")
    from specterbench.runfiles import rundir

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        grid_copy = run_dir / rundir.GRID_COPY
        if not grid_copy.exists():
            grid_copy.write_text(Path(args.grid).read_text(encoding="utf-8"), encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write the run folder {run_dir} ({err.strerror or err}); choose a writable --out "
                         f"(and check free disk space)") from None
    result = None
    with rundir.RunLock(run_dir):
        if args.resume:
            rundir.repair_rows(run_dir)  # a row cut off by a kill or a full disk is set aside, as run --resume does
        host.pm.hook.specterbench_run_start(run_dir=run_dir, config=grid)
        try:
            result = sweep.run()
        except OSError as err:
            raise UsageError(f"writing {err.filename or run_dir} failed ({err.strerror or err}); the finished rows are "
                             f"kept; free space, then continue with specterbench sweep {args.grid} --resume "
                             f"{run_dir}") from None
        finally:
            host.pm.hook.specterbench_run_end(run_dir=run_dir, rows=result.rows if result else [])
    rows_path = run_dir / "rows.jsonl"
    if rows_path.exists():
        from specterbench.cli.options import report_files

        rows = read_rows(rows_path, allow_empty=True)
        print(render_markdown(rows, wide=args.wide), end="")
        print(f"rows: {rows_path}")
        with report_files(run_dir, f"specterbench report {run_dir}"):
            print(f"summary: {write_summary(run_dir, rows)}")
    if result.interrupted:
        print(f"specterbench: interrupted; {len(result.rows)} finished rows kept in {run_dir}; continue with "
              f"specterbench sweep {args.grid} --resume {run_dir}", file=sys.stderr)
        return 130
    if result.skipped:
        print(f"specterbench: {result.skipped} of {result.cells} cells were already done", file=sys.stderr)
    failed = [r for r in result.rows if r.status != "ok"]
    if failed:
        print(f"specterbench: {len(failed)} of {len(result.rows)} cell(s) failed: " +
              "; ".join(f"{r.cell}: {r.error}" for r in failed[:10]) + (" …" if len(failed) > 10 else ""),
              file=sys.stderr)
        return 1
    return 0
