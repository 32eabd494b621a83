"""Command line: ``specterbench list | run | report``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from specterbench.errors import SpecterbenchError, UsageError
from specterbench.plugins.host import get_host


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def cmd_list(args) -> int:
    host = get_host()
    data = {}
    for kind, reg in (("strategies", host.strategies()), ("models", host.models()), ("profiles", host.profiles()),
                      ("host profiles", host.host_profiles())):
        data[kind] = []
        for name in reg.names():
            entry = reg.entry(name)
            obj = entry.obj
            desc = getattr(obj, "description", "") or getattr(obj, "accelerator", "") or getattr(obj, "cpu", "")
            data[kind].append({"name": name, "plugin": entry.plugin.name,
                               "distribution": f"{entry.plugin.distribution} {entry.plugin.version}",
                               "description": desc})
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for kind, items in data.items():
        print(f"{kind}:")
        width = max(len(i["name"]) for i in items) if items else 0
        for i in items:
            print(f"  {i['name']:<{width}}  [{i['plugin']} · {i['distribution']}]  {i['description']}")
    return 0


def _options(pairs: list[str]) -> dict:
    out: dict = {}
    for pair in pairs or []:
        if "=" not in pair or "." not in pair.split("=", 1)[0]:
            raise UsageError(f"malformed --set {pair!r}; write STRATEGY.OPTION=VALUE, e.g. specter.k=4")
        lhs, value = pair.split("=", 1)
        strategy, option = lhs.split(".", 1)
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(strategy, {})[option] = parsed
    return out


def add_decode_arguments(parser, default=None) -> None:
    """``--decode greedy|sample`` with ``--temperature``, ``--top-p``, ``--top-k`` (the noise follows ``--seed``);
    ``default``: a DecodeSetting (the project's DEFAULT_DECODE when None)."""
    from specterbench.engine.sampling import DECODE_MODES, DEFAULT_DECODE

    default = default or DEFAULT_DECODE
    parser.add_argument("--decode", default=default.mode, help=f"how tokens are chosen: {' | '.join(DECODE_MODES)} "
                        f"(default {default.mode}; sample: Gumbel-max noise tied to seed, prompt and position, "
                        "shared by the reference, every strategy and every draft)")
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"sampling temperature, in (0, 5] (default {DEFAULT_DECODE.temperature:g}); sample only")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, in (0, 1]")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens (k >= 1)")


def add_precision_arguments(parser) -> None:
    """``--expert-bits``, ``--dense-bits``, ``--expert-quantizer``, ``--expert-group``: the target's stored precision
    (:mod:`specterbench.engine.precision`)."""
    parser.add_argument("--expert-bits", default="16", help="the target's routed experts: 16 (bf16), 8, 4, 3 or 2 "
                        "bits, group-wise; the reference is the quantized model and budgets are shares of the "
                        "stored (packed) expert bytes")
    parser.add_argument("--dense-bits", default="16", help="the target's attention, shared experts and head: 16, 8 "
                        "or 4 bits (int, group 64; routers stay 16-bit)")
    parser.add_argument("--expert-quantizer", default="int", help="int (default: fp16 scale and a bits-bit zero per "
                        "group, GPTQ's layout at 4 bits), hqq (needs the hqq package) or bnb (4 and 8 bits)")
    parser.add_argument("--expert-group", default="128", help="weights per quantization group of the experts "
                        "(32 … 4096; default 128)")


def precision_setting(args):
    """The :class:`Precision` of parsed ``add_precision_arguments`` options (a bad value is one UsageError line)."""
    from specterbench.engine.precision import Precision

    return Precision.parse(args.expert_bits, args.dense_bits, args.expert_quantizer, args.expert_group)


def decode_setting(args):
    """The :class:`DecodeSetting` of parsed ``add_decode_arguments`` options (a bad value is a UsageError)."""
    from specterbench.engine.sampling import DEFAULT_DECODE, DecodeSetting

    if args.decode == "greedy":
        from specterbench.bench.rundir import explicit_dests

        argv = getattr(args, "argv", None)  # what this command line gives (a resumed run's saved values are not)
        explicit = explicit_dests(argv, ["temperature", "top_p", "top_k"]) if argv is not None else None
        given = [flag for flag, dest in (("--temperature", "temperature"), ("--top-p", "top_p"), ("--top-k", "top_k"))
                 if getattr(args, dest) is not None and (explicit is None or dest in explicit)]
        if given:
            raise UsageError(f"{given[0]} shapes sampling, but --decode is greedy (the most likely token, always); "
                             f"drop {given[0]}, or add --decode sample")
        return DecodeSetting(mode="greedy")
    temperature = DEFAULT_DECODE.temperature if args.temperature is None else args.temperature
    return DecodeSetting(args.decode, temperature, args.top_p, args.top_k, getattr(args, "seed", 0))


def run_config(args, host):
    """The :class:`BenchConfig` of parsed ``run`` options (validated: a bad input is one UsageError line)."""
    from specterbench.bench.runner import BenchConfig, parse_budget

    if args.tokens <= 0:
        raise UsageError(f"--tokens must be a positive number of new tokens, got {args.tokens}")
    if args.strategies.strip() in ("", ","):
        raise UsageError("--strategies is empty; name strategies (e.g. --strategies lru,specter) or give 'all'")
    if not _csv(args.model):
        raise UsageError("--model is empty; name a model (e.g. --model tiny-qwen-moe; `specterbench list` shows "
                         "them)")
    if not _csv(args.budgets):
        raise UsageError("--budgets is empty; give e.g. --budgets 35%,50%")
    strategies = host.strategies().names() if args.strategies == "all" else _csv(args.strategies)
    budgets = _fold("--budgets", [parse_budget(b) for b in _csv(args.budgets)], key=lambda b: b.key(),
                    show=lambda b: b.text)
    config = BenchConfig(
        models=_fold("--model", _csv(args.model)), strategies=_fold("--strategies", strategies),
        budgets=budgets, profile=args.profile_name, clock=args.clock,
        geometry=args.geometry or None, host_profile=args.host_profile,
        workload=args.workload, prompts=args.prompts, tokens=args.tokens, repeats=args.repeats, seed=args.seed,
        device=args.device, threads=args.threads, warmup=not args.no_warmup, strategy_options=_options(args.set),
        decode=decode_setting(args), precision=precision_setting(args), cuda_graphs=args.cuda_graphs)
    config.validate(host)
    from specterbench.bench.checks import check_workload_size
    from specterbench.bench.runner import load_prompts

    check_workload_size(config.workload, config.prompts, load_prompts(config.workload, config.prompts))
    return config


def _fold(flag: str, values, key=lambda v: v, show=lambda v: v) -> tuple:
    """``values`` without repeats, with one note per repeat: ``--strategies lru,lru`` runs lru once (a cell twice
    would be measured and stored twice)."""
    out, seen = [], {}
    for value in values:
        k = key(value)
        if k in seen:
            from specterbench.plugins.host import warn

            first = show(seen[k])
            same = f"{show(value)!r} is {first!r} again" if show(value) != first else f"{first!r} twice"
            warn(f"{flag} names {same}; it runs once")
            continue
        seen[k] = value
        out.append(value)
    return tuple(out)


def _run_folder(args, argv: list[str], host) -> Path:
    """The run folder; with ``--resume`` the saved options of ``run.json`` are restored into ``args`` (an
    explicit option that differs is refused). Local files (``--profile PATH``, ``--model-path``) are registered."""
    from specterbench.bench import rundir

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
    if not _csv(args.model):
        raise UsageError("--model is empty; name a model (e.g. --model tiny-qwen-moe; `specterbench list` shows "
                         "them)")
    if args.run_id is not None and not args.run_id.strip():
        raise UsageError("--run-id is empty; name the run folder, or leave --run-id out for a dated one")
    run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S") + "-" + _csv(args.model)[0].replace("local:", "")
    if "/" in run_id or run_id in ("", ".", ".."):
        raise UsageError(f"--run-id {run_id!r} must be a plain folder name (no '/'); use --out for the parent")
    return Path(args.out) / run_id


def _local_files(args, host, argv: list[str]) -> None:
    """``--profile PATH`` (a calibrated profile file) and ``--model-path DIR``: a local checkpoint, run as
    ``local:<folder>`` when ``--model`` is not given, or the files of a named preset (``--model mixtral``)."""
    from specterbench.bench import rundir
    from specterbench.bench.calibrate import is_profile_path, register_profile_file

    args.profile_name = args.profile  # run.json keeps the path; the run uses the registered name
    if is_profile_path(args.profile):
        args.profile_name, host_profile = register_profile_file(host, args.profile)
        if host_profile and "host_profile" not in rundir.explicit_dests(argv, ["host_profile"]):
            args.host_profile = host_profile
    if not args.model_path:
        return
    from specterbench.engine.models import MODEL_PATH_ENV, check_model_path, register_local_model

    check_model_path(args.model_path)  # config.json parses, the family is supported, weights are there
    if "model" in rundir.explicit_dests(argv, ["model"]) and not args.model.startswith("local:"):
        import os

        os.environ[MODEL_PATH_ENV] = args.model_path
    else:
        args.model = register_local_model(host, args.model_path)


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
    from specterbench.bench import rundir

    host = get_host()
    argv = getattr(args, "argv", [])
    run_dir = _run_folder(args, argv, host)
    config = run_config(args, host)
    created = not run_dir.exists()
    _writable(run_dir)
    try:
        return _run_in(args, host, config, run_dir)
    except SpecterbenchError:
        if created and not (run_dir / rundir.ROWS).exists():  # refused before its first row: leave nothing behind
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _run_in(args, host, config, run_dir: Path) -> int:
    from specterbench.analysis.report import render_markdown, write_summary
    from specterbench.bench import rundir
    from specterbench.bench.runner import Runner

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
        from specterbench.bench.reference import workload_lines
        from specterbench.bench.results import read_rows

        rows = read_rows(rows_path, allow_empty=True)
        print(render_markdown(rows, wide=getattr(args, "wide", False)), end="")
        for line in workload_lines(run_dir):
            print(line)
        print(f"rows: {rows_path}")
        with _report_files(run_dir, f"specterbench report {run_dir}"):
            print(f"summary: {write_summary(run_dir, rows)}")
            for plot in write_plots(run_dir, rows):
                print(f"plot: {plot}")
    if interrupted:
        print(f"specterbench: interrupted; {len(runner.rows)} finished rows kept in {run_dir}; continue with "
              f"--resume {run_dir}", file=sys.stderr)
        return 130
    failed = [r for r in runner.rows if r.status != "ok"]
    if failed:
        print(f"specterbench: {len(failed)} row(s) failed: " +
              "; ".join(f"{r.strategy}@{r.budget_fraction:.0%}: {r.error}" for r in failed), file=sys.stderr)
        return 1
    return 0


def _run_folder_arg(path: str) -> Path:
    """A run folder given to report/gate/compare; a rows.jsonl path is refused with the folder to give."""
    p = Path(path)
    if p.is_file():
        raise UsageError(f"{p} is a file; give the run folder that holds it: {p.parent}")
    if not p.is_dir():
        raise UsageError(f"no run folder {p}; give a folder written by `specterbench run` (results/<run-id>)")
    return p


@contextlib.contextmanager
def _report_files(run_dir: Path, again: str):
    """Writing summary.md and the plots: a full disk or an unwritable folder is one line (the rows are kept)."""
    try:
        yield
    except OSError as err:
        raise UsageError(f"writing {err.filename or run_dir} failed ({err.strerror or err}); the rows in "
                         f"{run_dir / 'rows.jsonl'} are kept; free space, then write the summary and plots with "
                         f"{again}") from None


def _flag_integrity(rows, run_dir: Path) -> None:
    """One warning per integrity problem of a run folder's rows (a duplicated cell, a foreign run id)."""
    from specterbench.bench.results import integrity_problems
    from specterbench.plugins.host import warn

    for problem in integrity_problems(rows, run_dir / "rows.jsonl"):
        warn(problem)


def cmd_report(args) -> int:
    from specterbench.analysis.report import render_markdown, write_summary
    from specterbench.bench.results import read_rows

    from specterbench.analysis.plots import write_plots

    run_dir = _run_folder_arg(args.run_dir)
    rows = read_rows(run_dir, on_error=args.on_error)
    _flag_integrity(rows, run_dir)
    print(render_markdown(rows, wide=getattr(args, "wide", False)), end="")
    with _report_files(run_dir, f"specterbench report {run_dir}"):
        print(f"summary: {write_summary(run_dir, rows)}")
        for plot in write_plots(run_dir, rows):
            print(f"plot: {plot}")
    return 0


def cmd_overhead(args) -> int:
    from specterbench.bench.overhead import measure_overhead

    for flag, value in (("--tokens", args.tokens), ("--prompts", args.prompts), ("--threads", args.threads)):
        if value <= 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    from specterbench.bench.runner import check_threads

    check_threads(args.threads)

    r = measure_overhead(get_host(), args.model, prompts=args.prompts, tokens=args.tokens, threads=args.threads)
    print(f"model {r.model}: {r.prompts} prompts x {r.tokens} tokens, greedy, host wall time, {args.threads} thread(s)")
    print(f"  stock model.generate   {r.stock_ms_per_token:8.3f} ms/token (median)")
    print(f"  engine, all resident   {r.engine_ms_per_token:8.3f} ms/token (median)")
    print(f"  ratio engine/stock     {r.ratio_median:8.3f} (median of per-prompt ratios; "
          f"min {min(r.ratios):.3f}, max {max(r.ratios):.3f})")
    print(f"  same tokens            {'yes' if r.tokens_equal else 'NO'}")
    return 0 if r.tokens_equal else 1


def cmd_compare(args) -> int:
    from specterbench.analysis.compare import compare_runs, render_comparison
    from specterbench.bench.results import read_rows

    base = read_rows(_run_folder_arg(args.base), on_error=args.on_error)
    new = read_rows(_run_folder_arg(args.new), on_error=args.on_error)
    _flag_integrity(base, Path(args.base))
    _flag_integrity(new, Path(args.new))
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha {args.alpha} must be in (0, 1), e.g. 0.05")
    df = compare_runs(base, new, alpha=args.alpha, metrics=_csv(args.metrics) or None,
                      test_wall_time=args.test_wall_time)
    print(render_comparison(df, only_changed=args.only_changed), end="")
    return 0


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``specterbench run: error: …; see specterbench run --help``), exit 2, like
    every other bad input; subcommand parsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"specterbench: error: {self.prog}: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="specterbench", description="Benchmark MoE expert-offloading strategies.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="strategies, models and profiles, with the plugin each comes from")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_list)

    from specterbench.plugins.listing import add_parser as add_plugins_parser

    add_plugins_parser(sub)

    s = sub.add_parser("run", help="run strategies side by side and write results/<run-id>/")
    s.add_argument("--model", default="tiny-qwen-moe", help="model name(s), comma-separated")
    s.add_argument("--model-path", help="a local checkpoint directory of a supported family: run alone (as "
                   "local:<folder>), or the files of a named preset (--model mixtral)")
    s.add_argument("--strategies", "--strategy", dest="strategies", default="all",
                   help="comma-separated names, or 'all'")
    s.add_argument("--budgets", default="35%,50%", help="e.g. 35%%,50%% or 0.35 or 120MB")
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
    from specterbench.engine.graphs import SETTINGS as GRAPH_SETTINGS

    s.add_argument("--cuda-graphs", default="auto", choices=GRAPH_SETTINGS,
                   help="auto (default): on CUDA the MoE layers' routers and shared experts replay CUDA graphs in "
                   "decode and verification (eager on any capture failure, which is said); off: every kernel eager. "
                   "Rows record cuda_graphs and cuda_graphs_reason")
    add_decode_arguments(s)
    add_precision_arguments(s)
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--wide", action="store_true", help="print every column of the table (default: a compact table "
                   "that fits 160 columns; summary.md always has every column)")
    s.set_defaults(func=cmd_run)

    from specterbench.quality.evaluate import add_parser as add_eval_parser
    from specterbench.bench.sweep import add_sweep_parser

    add_sweep_parser(sub)
    add_eval_parser(sub)

    s = sub.add_parser("overhead", help="host wall time of the engine (all resident) vs stock model.generate")
    s.add_argument("--model", default="tiny-qwen-moe")
    s.add_argument("--prompts", type=int, default=8)
    s.add_argument("--tokens", type=int, default=32)
    s.add_argument("--threads", type=int, default=1)
    s.set_defaults(func=cmd_overhead)

    s = sub.add_parser("report", help="rewrite summary.md and plots of a run and print its table")
    s.add_argument("run_dir")
    s.add_argument("--on-error", choices=("stop", "skip"), default="stop", help="on a corrupt row")
    s.add_argument("--wide", action="store_true", help="print every column of the table")
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

    from specterbench.analysis.gate import add_parser as add_gate_parser
    from specterbench.bench.calibrate import add_calibrate_parser
    from specterbench.bench.published import add_published_parser
    from specterbench.bench.validate import add_validate_parser
    from specterbench.embedded.realism import add_realism_parser

    add_gate_parser(sub)
    add_calibrate_parser(sub)
    add_validate_parser(sub)
    add_published_parser(sub)
    add_realism_parser(sub)
    for command in sub.choices.values():  # --debug after the subcommand too; SUPPRESS keeps one given before it
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return p


def _join_dash_values(argv: list[str]) -> list[str]:
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


def subcommand_main(name: str, add_parser, argv=None) -> int:
    """``python -m <module> …``: one subcommand (registered by ``add_parser``) as its own program, with the CLI's
    one-line errors and exit 2."""
    parser = argparse.ArgumentParser(prog="specterbench")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([name, *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except SpecterbenchError as err:
        print(f"specterbench: error: {err}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    from specterbench.bench.progress import quiet_library_bars

    parser = build_parser()
    argv = _join_dash_values(list(sys.argv[1:] if argv is None else argv))
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
    except BrokenPipeError:  # the reader went away (`specterbench list | head`): stop quietly, as cat does
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141  # 128 + SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
