"""``specterbench fit``: "what should I run on my card?" — device memory swept over the sizes users own."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from specterbench.cli.options import add_precision_arguments, csv_list, dated_folder, fold, precision_setting
from specterbench.errors import SpecterbenchError, UsageError


def add_parser(sub) -> None:
    from specterbench.bench.fit import DEFAULT_SIZES, DEFAULT_STRATEGIES

    s = sub.add_parser("fit", help="sweep device memory over common card sizes: the best strategy and its setting "
                       "per size, with a plot of tokens/s against device memory (modeled)")
    s.add_argument("--model", default="mixtral", help="one model (a preset such as mixtral runs its stand-in priced "
                   "at the real model's sizes when the checkpoint is absent)")
    s.add_argument("--profile", default="a100-40g-pcie4", help="hardware profile of the modeled clock (its link, "
                   "memory bandwidth and compute; the card's memory is the swept axis)")
    s.add_argument("--host-profile", default="desktop-ddr5", help="host CPU profile (host-computed experts)")
    s.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES), help="comma-separated strategies "
                   f"(default: {', '.join(DEFAULT_STRATEGIES)}; n-cpu-moe at n=fit)")
    s.add_argument("--sizes", default=DEFAULT_SIZES, help=f"card sizes with a unit (default {DEFAULT_SIZES})")
    s.add_argument("--geometry", default="auto", help="the priced geometry, as for run (auto: the real model a "
                   "stand-in stands for)")
    s.add_argument("--gpu-reserve", default=None, metavar="SIZE", help="the runtime's own device memory (default "
                   "1GiB)")
    s.add_argument("--tokens", type=int, default=8, help="new tokens per prompt (a small workload: default 8)")
    s.add_argument("--prompts", type=int, default=2, help="prompts from the workload (default 2)")
    s.add_argument("--workload", default="shakespeare-heldout-v1")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--set", action="append", metavar="STRATEGY.OPTION=VALUE", help="strategy option")
    add_precision_arguments(s)
    s.add_argument("--plot", metavar="PNG", help="also write the plot here (e.g. docs/img/fit-mixtral.png)")
    s.add_argument("--out", default="results")
    s.add_argument("--run-id")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=cmd_fit)


def fit_config(args, host):
    """The run configuration of ``fit``'s options, checked (one line per problem) before anything loads."""
    import argparse
    import dataclasses

    from specterbench.bench.budget import Budget
    from specterbench.bench.config import BenchConfig
    from specterbench.bench.device_memory import parse_memory
    from specterbench.bench.fit import parse_sizes
    from specterbench.cli.options import strategy_options
    from specterbench.cli.run import stand_in_for_a_missing_preset

    models = csv_list(args.model)
    if len(models) != 1:
        raise UsageError(f"--model {args.model!r}: fit sizes one model at a time; give one (e.g. --model mixtral)")
    strategies = csv_list(args.strategies)
    if not strategies:
        raise UsageError("--strategies is empty; name strategies, e.g. --strategies n-cpu-moe,specter,lru")
    sizes = parse_sizes(args.sizes)
    reserve = None if args.gpu_reserve is None else parse_memory(args.gpu_reserve, "--gpu-reserve")
    shim = argparse.Namespace(model=models[0], model_path=None, clock="modeled", geometry=args.geometry)
    stand_in_for_a_missing_preset(shim)  # mixtral without its checkpoint: the stand-in at Mixtral's sizes
    config = BenchConfig(
        models=(shim.model,), strategies=fold("--strategies", strategies), budgets=(), profile=args.profile,
        host_profile=args.host_profile, geometry=shim.geometry or None, clock="modeled", workload=args.workload,
        prompts=args.prompts, tokens=args.tokens, seed=args.seed, warmup=False,
        strategy_options=strategy_options(args.set), precision=precision_setting(args))
    dataclasses.replace(config, budgets=(Budget("50%", fraction=0.5),)).validate(host)  # names, options, profile
    return config, sizes, reserve


def cmd_fit(args) -> int:
    from specterbench.analysis.fit_report import fit_plot, fit_table
    from specterbench.bench.fit import Fit
    from specterbench.plugins.host import get_host

    host = get_host()
    config, sizes, reserve = fit_config(args, host)
    if args.run_id is not None:
        if not args.run_id.strip() or "/" in args.run_id:
            raise UsageError(f"--run-id {args.run_id!r} must be a plain folder name (no '/')")
        run_dir = Path(args.out) / args.run_id
        if (run_dir / "rows.jsonl").exists():
            raise UsageError(f"{run_dir} already holds rows; pick another --run-id")
    else:
        run_dir = dated_folder(Path(args.out), time.strftime("%Y%m%d-%H%M%S") + "-fit-" + config.models[0], args)
    progress = None if args.quiet else (lambda msg: print(f"· {msg}", file=sys.stderr, flush=True))
    fit = Fit(host, config, sizes, run_dir, progress=progress, reserve=reserve)
    try:
        points = fit.run()
    except SpecterbenchError:
        if not (run_dir / "rows.jsonl").exists():
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    print(fit_table(points), end="")
    name = f"fit__{config.models[0]}__{config.profile}.png"
    for target in [run_dir / "plots" / name, *([Path(args.plot)] if args.plot else [])]:
        path = fit_plot(points, target)
        if path is not None:
            print(f"plot: {path}")
    print(f"rows: {run_dir / 'rows.jsonl'} (specterbench report {run_dir})")
    return 0
