"""``specterbench run``: strategies side by side on one model, into a run folder."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from specterbench.cli.options import (
    add_card_arguments,
    add_decode_arguments,
    add_output_argument,
    add_precision_arguments,
    csv_list,
    dated_folder,
    decode_setting,
    fold,
    precision_setting,
    report_files,
    run_budgets,
    strategy_options,
)
from specterbench.engine.graphs import SETTINGS as GRAPH_SETTINGS
from specterbench.errors import SpecterbenchError, UsageError
from specterbench.plugins.host import get_host


def run_config(args, host):
    """The :class:`BenchConfig` of parsed ``run`` options (validated: a bad input is one UsageError line)."""
    from specterbench.bench.batching import parse_batches, run_prompts
    from specterbench.bench.config import BenchConfig

    if args.tokens <= 0:
        raise UsageError(f"--tokens must be a positive number of new tokens, got {args.tokens}")
    if args.strategies.strip() in ("", ","):
        raise UsageError("--strategies is empty; name strategies (e.g. --strategies lru,specter) or give 'all'")
    if not csv_list(args.model):
        raise UsageError("--model is empty; name a model (e.g. --model tiny-qwen-moe; `specterbench list` shows "
                         "them)")
    if not csv_list(args.budgets):
        raise UsageError("--budgets is empty; give e.g. --budgets 35%,50%")
    strategies = host.strategies().names() if args.strategies == "all" else csv_list(args.strategies)
    batches = parse_batches(args.batch)
    budgets = run_budgets(args, host)
    config = BenchConfig(
        models=fold("--model", csv_list(args.model)), strategies=fold("--strategies", strategies),
        budgets=budgets, profile=args.profile_name, clock=args.clock,
        geometry=args.geometry or None, host_profile=args.host_profile,
        workload=args.workload, prompts=run_prompts(args.prompts, batches), tokens=args.tokens,
        repeats=args.repeats, seed=args.seed,
        device=args.device, threads=args.threads, warmup=not args.no_warmup,
        strategy_options=strategy_options(args.set),
        decode=decode_setting(args), precision=precision_setting(args), cuda_graphs=args.cuda_graphs,
        batches=batches)
    config.validate(host)
    from specterbench.bench.batching import check_batches
    from specterbench.bench.checks import check_workload_size
    from specterbench.bench.runner import load_prompts

    check_batches(batches, config.workload, len(load_prompts(config.workload, max(batches))))
    check_workload_size(config.workload, config.prompts, load_prompts(config.workload, config.prompts))
    return config


def _run_folder(args, argv: list[str], host) -> Path:
    """The run folder; with ``--resume`` the saved options of ``run.json`` are restored into ``args`` (an
    explicit option that differs is refused). Local files (``--profile PATH``, ``--model-path``) are registered."""
    from specterbench.runfiles import rundir

    if args.resume:
        run_dir = Path(args.resume)
        out = args.out if "out" in rundir.explicit_dests(argv, ["out"]) else None
        rundir.check_resume_target(run_dir, "run", {"run_id": args.run_id, "out_explicit": out})
        options = vars(args)
        explicit = rundir.explicit_dests(argv, [d for d in options if d not in rundir.NOT_SAVED])
        for key, value in rundir.resume_options(run_dir, options, explicit).items():
            setattr(args, key, value)
        _local_files(args, host, argv)
        return run_dir
    _local_files(args, host, argv)
    _stand_in_for_a_missing_preset(args)
    if not csv_list(args.model):
        raise UsageError("--model is empty; name a model (e.g. --model tiny-qwen-moe; `specterbench list` shows "
                         "them)")
    if args.run_id is not None and not args.run_id.strip():
        raise UsageError("--run-id is empty; name the run folder, or leave --run-id out for a dated one")
    if args.run_id is not None:
        if "/" in args.run_id or args.run_id in (".", ".."):
            raise UsageError(f"--run-id {args.run_id!r} must be a plain folder name (no '/'); use --out for the "
                             f"parent")
        return Path(args.out) / args.run_id
    return dated_folder(Path(args.out), time.strftime("%Y%m%d-%H%M%S") + "-" +
                         csv_list(args.model)[0].replace("local:", ""), args)


def _local_files(args, host, argv: list[str]) -> None:
    """``--profile PATH`` (a calibrated profile file) and ``--model-path DIR``: a local checkpoint, run as
    ``local:<folder>`` when ``--model`` is not given, or the files of a named preset (``--model mixtral``)."""
    from specterbench.engine.profiles import is_profile_path
    from specterbench.runfiles import rundir

    args.profile_name = args.profile  # run.json keeps the path; the run uses the registered name
    if is_profile_path(args.profile):
        args.profile_name, host_profile = host.register_profile_file(args.profile)
        if host_profile and "host_profile" not in rundir.explicit_dests(argv, ["host_profile"]):
            args.host_profile = host_profile
    if not args.model_path:
        return
    from specterbench.catalog.models import MODEL_PATH_ENV, check_model_path

    check_model_path(args.model_path)  # config.json parses, the family is supported, weights are there
    if "model" in rundir.explicit_dests(argv, ["model"]) and not args.model.startswith("local:"):
        import os

        os.environ[MODEL_PATH_ENV] = args.model_path
    else:
        args.model = host.register_local_model(args.model_path)


def _stand_in_for_a_missing_preset(args) -> None:
    """``--model mixtral`` on a machine without its checkpoint (and no ``--model-path``) runs the shipped stand-in
    priced at Mixtral-8x7B's sizes, saying so in one line; on the modeled clock only (a measured run of a stand-in
    would time the stand-in, not the model)."""
    from specterbench.catalog.models import REAL_PRESETS, checkpoint_or_stand_in, stand_in_of
    from specterbench.plugins.registry import note

    models = csv_list(args.model)
    if len(models) != 1 or models[0] not in REAL_PRESETS or args.model_path or args.clock != "modeled":
        return
    preset = models[0]
    line = checkpoint_or_stand_in(preset)
    if line is None:
        return
    note(line)
    args.model = stand_in_of(preset)
    if args.geometry in (None, "", "auto"):
        args.geometry = preset


def _writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok\n", encoding="utf-8")
        probe.unlink()
    except OSError as err:
        raise UsageError(f"cannot write the run folder {run_dir} ({err.strerror or err}); choose a writable "
                         f"--out (and check free disk space)") from None


def cmd_run(args) -> int:
    from specterbench.analysis.formats import check_format
    from specterbench.runfiles import rundir

    check_format(args.output)  # before a folder is made or anything loads
    host = get_host()
    argv = getattr(args, "argv", [])
    run_dir = _run_folder(args, argv, host)
    created = getattr(args, "claimed_folder", False) or not run_dir.exists()
    try:
        config = run_config(args, host)
    except SpecterbenchError:
        if created and run_dir.is_dir():
            run_dir.rmdir()
        raise
    args.run_folder = run_dir  # for the one line a second Ctrl-C still prints
    _writable(run_dir)
    try:
        return _run_in(args, host, config, run_dir)
    except SpecterbenchError:
        if created and not (run_dir / rundir.ROWS).exists():  # refused before its first row: leave nothing behind
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _run_in(args, host, config, run_dir: Path) -> int:
    from specterbench.analysis.formats import render
    from specterbench.analysis.report import write_summary
    from specterbench.bench.runner import Runner
    from specterbench.runfiles import rundir

    with rundir.RunLock(run_dir):
        if args.resume:
            rundir.repair_rows(run_dir)
        else:
            rundir.check_new(run_dir)
        try:
            rundir.write_run_json(run_dir, vars(args))
        except OSError as err:
            raise UsageError(f"cannot write {run_dir / rundir.RUN_JSON} ({err.strerror or err}); free disk "
                             f"space or choose another --out") from None
        progress = None if args.quiet else (lambda msg: print(f"· {msg}", file=sys.stderr, flush=True))
        runner = Runner(host, config, run_dir, resume=bool(args.resume), progress=progress)
        host.pm.hook.specterbench_run_start(run_dir=run_dir, config=config)
        interrupted, write_error = False, None
        try:
            runner.run()
        except KeyboardInterrupt:
            interrupted = True
        except OSError as err:  # disk full or the folder went away: the finished rows are on disk
            write_error = err
        finally:
            host.pm.hook.specterbench_run_end(run_dir=run_dir, rows=runner.rows)
    if write_error is not None:
        raise UsageError(f"writing {write_error.filename or run_dir} failed ({write_error.strerror or write_error}); "
                         f"{len(runner.rows)} finished rows are kept; free space, then continue with "
                         f"--resume {run_dir}")
    rows_path = run_dir / rundir.ROWS
    if rows_path.exists():
        from specterbench.analysis.plots import write_plots
        from specterbench.runfiles.reference import workload_lines
        from specterbench.runfiles.results import read_rows

        rows = read_rows(rows_path, allow_empty=True)
        print(render(rows, args.output, wide=getattr(args, "wide", False)), end="")
        say = print if args.output == "md" else (lambda line: print(line, file=sys.stderr))  # stdout: the table
        for line in workload_lines(run_dir):
            say(line)
        say(f"rows: {rows_path}")
        with report_files(run_dir, f"specterbench report {run_dir}"):
            say(f"summary: {write_summary(run_dir, rows)}")
            for plot in write_plots(run_dir, rows):
                say(f"plot: {plot}")
    if interrupted:
        print(f"specterbench: interrupted; {len(runner.rows)} finished rows kept in {run_dir}; continue with "
              f"--resume {run_dir}", file=sys.stderr)
        return 130
    failed = [r for r in runner.rows if r.status not in ("ok", "unsupported")]  # unsupported: a row saying why
    if failed:
        print(f"specterbench: {len(failed)} row(s) failed: " +
              "; ".join(f"{r.strategy}@{r.budget_fraction:.0%}: {r.error}" for r in failed), file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("run", help="run strategies side by side and write results/<run-id>/")
    s.add_argument("--model", default="tiny-qwen-moe", help="model name(s), comma-separated")
    s.add_argument("--model-path", help="a local checkpoint directory of a supported family: run alone (as "
                   "local:<folder>), or the files of a named preset (--model mixtral)")
    s.add_argument("--strategies", "--strategy", dest="strategies", default="all",
                   help="comma-separated names, or 'all'")
    s.add_argument("--budgets", default="35%,50%", help="e.g. 35%%,50%% or 0.35 or 120MB, or 'device' "
                   "(what --profile's memory leaves for experts; see --gpu-memory)")
    s.add_argument("--profile", default="a100-40g-pcie4", help="hardware profile of the modeled clock")
    s.add_argument("--geometry", default="auto", help="price the routing at a real model's sizes: mixtral, qwen-moe, "
                   "deepseek-v2-lite, olmoe, phi-moe (a modeled projection); 'auto' (default): the model an "
                   "embedded one stands in for; 'own': the model's own sizes")
    s.add_argument("--host-profile", default="desktop-ddr5", help="host CPU profile (for cpu-experts)")
    s.add_argument("--clock", default="modeled", choices=("modeled", "measured"))
    s.add_argument("--tokens", type=int, default=32, help="new tokens per prompt")
    s.add_argument("--prompts", type=int, default=8, help="prompts from the workload")
    s.add_argument("--workload", default="shakespeare-heldout-v1")
    s.add_argument("--repeats", type=int, default=1)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cpu")
    s.add_argument("--threads", type=int, default=1, help="torch host threads (default 1)")
    s.add_argument("--set", action="append", metavar="STRATEGY.OPTION=VALUE", help="strategy option")
    s.add_argument("--out", default="results")
    s.add_argument("--run-id")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue a run with its saved options (run.json), skipping "
                   "finished cells; an option that differs from the saved one is refused")
    s.add_argument("--no-warmup", action="store_true")
    s.add_argument("--cuda-graphs", default="auto", choices=GRAPH_SETTINGS,
                   help="auto (default): on CUDA the MoE layers' routers and shared experts replay CUDA graphs in "
                   "decode and verification (eager on any capture failure, which is said); off: every kernel eager. "
                   "Rows record cuda_graphs and cuda_graphs_reason")
    add_decode_arguments(s)
    add_precision_arguments(s)
    add_card_arguments(s)
    s.add_argument("--batch", default="1", help="requests decoding together per cell, e.g. 1,4,16 (each a cell; "
                   "prompts cut to the shortest, every request's KV charged to the budget; docs/results.md)")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--wide", action="store_true", help="print every column of the table (default: a compact table "
                   "that fits 160 columns; summary.md always has every column)")
    add_output_argument(s)
    s.set_defaults(func=cmd_run)

