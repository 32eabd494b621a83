"""Command line: ``specterbench list | run | report``."""

from __future__ import annotations

import argparse
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
    parser.add_argument("--temperature", type=float, default=default.temperature,
                        help=f"sampling temperature, in (0, 5] (default {default.temperature:g})")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, in (0, 1]")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens (k >= 1)")


def decode_setting(args):
    """The :class:`DecodeSetting` of parsed ``add_decode_arguments`` options (a bad value is a UsageError)."""
    from specterbench.engine.sampling import DecodeSetting

    if args.decode == "greedy":
        return DecodeSetting(mode="greedy")
    return DecodeSetting(args.decode, args.temperature, args.top_p, args.top_k, getattr(args, "seed", 0))


def cmd_run(args) -> int:
    from specterbench.analysis.report import render_markdown, write_summary
    from specterbench.bench.runner import BenchConfig, Runner, parse_budget

    host = get_host()
    if args.model_path:
        import os

        from specterbench.engine.models import MODEL_PATH_ENV

        os.environ[MODEL_PATH_ENV] = args.model_path
    if args.tokens <= 0:
        raise UsageError(f"TOKENS must be a positive number of new tokens, got {args.tokens}")
    strategies = host.strategies().names() if args.strategies in ("all", "") else _csv(args.strategies)
    config = BenchConfig(
        models=_csv(args.model), strategies=tuple(strategies),
        budgets=tuple(parse_budget(b) for b in _csv(args.budgets)), profile=args.profile, clock=args.clock,
        geometry=args.geometry or None, host_profile=args.host_profile,
        workload=args.workload, prompts=args.prompts, tokens=args.tokens, repeats=args.repeats, seed=args.seed,
        device=args.device, threads=args.threads, warmup=not args.no_warmup, strategy_options=_options(args.set),
        decode=decode_setting(args))
    config.validate(host)
    if args.resume:
        run_dir = Path(args.resume)
        if not run_dir.is_dir():
            raise UsageError(f"--resume {run_dir}: no such run folder")
    else:
        run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S") + "-" + config.models[0]
        run_dir = Path(args.out) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = None if args.quiet else (lambda msg: print(f"· {msg}", file=sys.stderr, flush=True))
    runner = Runner(host, config, run_dir, resume=bool(args.resume), progress=progress)
    host.pm.hook.specterbench_run_start(run_dir=run_dir, config=config)
    interrupted = False
    try:
        runner.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        host.pm.hook.specterbench_run_end(run_dir=run_dir, rows=runner.rows)
    rows_path = run_dir / "rows.jsonl"
    if rows_path.exists():
        from specterbench.analysis.plots import write_plots
        from specterbench.bench.results import read_rows

        rows = read_rows(rows_path)
        summary = write_summary(run_dir, rows)
        print(render_markdown(rows), end="")
        from specterbench.bench.reference import workload_lines

        for line in workload_lines(run_dir):
            print(line)
        print(f"rows: {rows_path}\nsummary: {summary}")
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


def cmd_report(args) -> int:
    from specterbench.analysis.report import render_markdown, write_summary
    from specterbench.bench.results import read_rows

    from specterbench.analysis.plots import write_plots

    rows = read_rows(Path(args.run_dir), on_error=args.on_error)
    path = write_summary(Path(args.run_dir), rows)
    print(render_markdown(rows), end="")
    print(f"summary: {path}")
    for plot in write_plots(Path(args.run_dir), rows):
        print(f"plot: {plot}")
    return 0


def cmd_overhead(args) -> int:
    from specterbench.bench.overhead import measure_overhead

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

    base = read_rows(Path(args.base), on_error=args.on_error)
    new = read_rows(Path(args.new), on_error=args.on_error)
    df = compare_runs(base, new, alpha=args.alpha, metrics=_csv(args.metrics) or None)
    print(render_comparison(df, only_changed=args.only_changed), end="")
    return 0


def cmd_gate(args) -> int:
    from specterbench.analysis.gate import DEFAULT_RULES, load_reference, load_rules, parse_rule, render, run_gate
    from specterbench.bench.results import read_rows

    rules = [parse_rule(t) for t in args.rule or []]
    if args.rules or not rules:
        rules = list(load_rules(args.rules or DEFAULT_RULES)) + rules
    rows = read_rows(Path(args.run_dir), on_error=args.on_error)
    needs_reference = any(r.needs_reference for r in rules)
    reference = load_reference(args.reference, on_error=args.on_error) if needs_reference else []
    result = run_gate(rows, reference, rules)
    print(render(result, passes=not args.failures_only), end="")
    return result.exit_code


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specterbench", description="Benchmark MoE expert-offloading strategies.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="strategies, models and profiles, with the plugin each comes from")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_list)

    from specterbench.plugins.listing import add_parser as add_plugins_parser

    add_plugins_parser(sub)

    s = sub.add_parser("run", help="run strategies side by side and write results/<run-id>/")
    s.add_argument("--model", default="tiny-qwen-moe", help="model name(s), comma-separated")
    s.add_argument("--model-path", help="local checkpoint directory for a real preset (mixtral, qwen-moe, ...)")
    s.add_argument("--strategies", default="all", help="comma-separated names, or 'all'")
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
    s.add_argument("--resume", metavar="RUN_DIR", help="continue a run, skipping finished cells")
    s.add_argument("--no-warmup", action="store_true")
    add_decode_arguments(s)
    s.add_argument("--quiet", action="store_true")
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
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("compare", help="per-metric deltas between two runs, with direction and significance")
    s.add_argument("base")
    s.add_argument("new")
    s.add_argument("--metrics", default="", help="comma-separated metrics (default: all with a direction)")
    s.add_argument("--only-changed", action="store_true")
    s.add_argument("--alpha", type=float, default=0.05, help="significance level")
    s.add_argument("--on-error", choices=("stop", "skip"), default="stop", help="on a corrupt row")
    s.set_defaults(func=cmd_compare)

    s = sub.add_parser("gate", help="check a run against rules and the committed reference; exit 1 on failure")
    s.add_argument("run_dir")
    s.add_argument("--reference", default="results/reference")
    s.add_argument("--rules", help="TOML rules file (default results/reference/gate.toml)")
    s.add_argument("--rule", action="append", help="a rule, e.g. 'speedup strategy=specter over=best-other "
                   "metric=tpot_ms min=1.5' (repeatable)")
    s.add_argument("--failures-only", action="store_true")
    s.add_argument("--on-error", choices=("stop", "skip"), default="stop", help="on a corrupt row")
    s.set_defaults(func=cmd_gate)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpecterbenchError as err:
        if args.debug:
            raise
        print(f"specterbench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
