"""``specterbench eval``: its arguments and the command (the evaluation itself is :func:`~specterbench.quality.
evaluate.run_eval`)."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from specterbench.cli.options import dated_folder, strategy_options
from specterbench.errors import UsageError
from specterbench.quality.eval_report import render_markdown, write_report
from specterbench.quality.eval_rows import DEFAULT_BOOTSTRAP_ITERS, DEFAULT_BUDGET, EvalRow


def csv_list(text: str) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def default_models(host=None) -> list[str]:
    """The embedded trained models that are registered; the random seam-test model when none is."""
    from specterbench.plugins.host import get_host

    host = host or get_host()
    names = host.models().names()
    from specterbench.catalog.embedded import EMBEDDED_MODELS

    embedded = [n for n in EMBEDDED_MODELS if n in names]
    return embedded or ["tiny-random-mixtral"]


def add_parser(subparsers) -> None:
    """Register ``specterbench eval`` on the CLI's subparsers."""
    s = subparsers.add_parser("eval", help="quality table: lm-eval tasks for the reference, each strategy and the "
                                          "4-bit draft alone")
    s.add_argument("--model", default="", help="model name(s), comma-separated (default: the embedded models)")
    s.add_argument("--strategies", default="default",
                   help="comma-separated strategies, 'default' (every one that takes a budget, lossless and "
                        "lossy), 'all' or 'none'")
    s.add_argument("--tasks", default="specterbench_suite",
                   help="comma-separated lm-eval tasks or groups (default: the shipped specterbench_suite)")
    s.add_argument("--limit", type=int, default=None, help="samples per task (default: all)")
    s.add_argument("--budget", default=DEFAULT_BUDGET, help="expert budget for the strategies (default 50%%)")
    s.add_argument("--profile", default="a100-40g-pcie4", help="hardware profile of the modeled clock")
    s.add_argument("--device", default="cpu")
    s.add_argument("--set", action="append", metavar="STRATEGY.OPTION=VALUE",
                   help="strategy option, e.g. specter.k=4 (draft.bits=8 for the draft row)")
    s.add_argument("--include-path", default=None, help="another folder of lm-eval task YAML files")
    s.add_argument("--no-draft", action="store_true", help="leave out the draft-alone row")
    s.add_argument("--drafts", default=None, metavar="SPEC,...",
                   help="one draft-alone row per quantization, e.g. int4/g128,int3/g128,int3/g128+d8,nf4/b64 "
                        "(QUANTIZER BITS / GROUP, +dBITS: the draft's own dense copy; default: one row, "
                        "--set draft.*)")
    s.add_argument("--bootstrap-iters", type=int, default=DEFAULT_BOOTSTRAP_ITERS,
                   help="bootstrap iterations for perplexity stderr (lm-eval's default is 100000)")
    s.add_argument("--out", default="results")
    s.add_argument("--run-id")
    s.add_argument("--quiet", action="store_true")
    from specterbench.cli.options import add_decode_arguments
    from specterbench.engine.sampling import GREEDY

    add_decode_arguments(s, default=GREEDY)  # lm-eval's exact-match tasks score greedy continuations
    s.set_defaults(func=cmd_eval)


def parse_drafts(text: str | None) -> tuple[dict, ...] | None:
    """``int4/g128,nf4/b64`` -> quantization options per draft row (checked here, before any model loads)."""
    import re

    from specterbench.engine.draft import QuantSpec

    if text is None:
        return None
    if not csv_list(text):
        raise UsageError("--drafts is empty; give quantizations, e.g. --drafts int4/g128,nf4/b64, or leave it out for "
                         "one draft row")
    out = []
    for item in csv_list(text):
        item, _, dense = item.partition("+d")
        m = re.fullmatch(r"(int|hqq)([0-9]+)/g([0-9]+)|(nf4|fp4)/b([0-9]+)|int8/b([0-9]+)", item)
        if m is None or (dense and not dense.isdigit()):
            raise UsageError(f"--drafts: cannot read {item + ('+d' + dense if dense else '')!r}; write QUANTIZER "
                             f"BITS / GROUP, e.g. int4/g128, int3/g128, hqq2/g64, nf4/b64, fp4/b64, int8/b64, and "
                             f"+dBITS for the draft's own dense copy (int3/g128+d8)")
        if m.group(1):
            opts = {"quantizer": m.group(1), "bits": int(m.group(2)), "blocksize": int(m.group(3))}
        elif m.group(4):
            opts = {"quantizer": "bnb", "bits": 4, "quant_type": m.group(4), "blocksize": int(m.group(5))}
        else:
            opts = {"quantizer": "bnb", "bits": 8, "blocksize": int(m.group(6))}
        QuantSpec.from_options(opts)  # bits the quantizer cannot do: one line now
        if dense:
            from specterbench.engine.dense_copy import dense_spec

            dense_spec(dense)
            opts["dense_bits"] = int(dense)
        out.append(opts)
    return tuple(out)


def cmd_eval(args) -> int:
    import torch

    from specterbench.plugins.host import get_host
    from specterbench.quality.evaluate import default_strategies, run_eval

    host = get_host()
    torch.set_num_threads(1)
    if args.model.strip() == "," or (args.model and not csv_list(args.model)):
        raise UsageError("--model is empty; name a model (e.g. --model tiny-mixtral), or leave --model out for the "
                         "embedded models")
    if not args.strategies.strip():
        raise UsageError("--strategies is empty; name strategies (e.g. --strategies lru,specter), or give 'default', "
                         "'all' or 'none'")
    models = csv_list(args.model) or default_models(host)
    if args.strategies == "default":
        strategies = default_strategies(host)
    elif args.strategies == "none":
        strategies = []
    elif args.strategies == "all":
        strategies = host.strategies().names()
    else:
        strategies = csv_list(args.strategies)
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be a positive number of samples per task, got {args.limit}")
    from specterbench.bench.budget import parse_budget

    parse_budget(args.budget)  # a bad budget is one line now, not after the reference ran (once per model)
    options = strategy_options(args.set)
    decode, drafts = check_eval_options(args, host, models, strategies, options)  # all before any evaluation
    if args.run_id is not None:
        if "/" in args.run_id or args.run_id in (".", "..", ""):
            raise UsageError(f"--run-id {args.run_id!r} must be a plain folder name (no '/'); use --out for the "
                             f"parent")
        run_id, run_dir = args.run_id, Path(args.out) / f"eval-{args.run_id}"
        if (run_dir / "eval.jsonl").exists():
            raise UsageError(f"{run_dir} already holds an evaluation; pick another --run-id")
    else:
        run_dir = dated_folder(Path(args.out), f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{models[0]}", args)
        run_id = run_dir.name.removeprefix("eval-")
    _quiet_libraries()
    progress = None if args.quiet else (lambda msg: print(f"· {msg}", file=sys.stderr, flush=True))
    run_dir.mkdir(parents=True, exist_ok=True)
    jsonl = run_dir / "eval.jsonl"

    def write(row: EvalRow) -> None:
        with open(jsonl, "a", encoding="utf-8") as f:
            f.write(row.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    rows = run_eval(models, strategies, csv_list(args.tasks), limit=args.limit, budget=args.budget,
                    decode=decode, profile=args.profile, device=args.device, strategy_options=options,
                    include_path=args.include_path, draft=not args.no_draft, drafts=drafts,
                    bootstrap_iters=args.bootstrap_iters,
                    run_id=run_id, progress=progress, writer=write)
    report = write_report(run_dir, rows, limit=args.limit, budget=args.budget, profile=args.profile)
    print(render_markdown(rows), end="")
    print(f"rows: {jsonl}\nreport: {report}")
    failed = [r for r in rows if r.status != "ok"]
    if failed:
        print(f"specterbench: {len(failed)} eval row(s) failed: " +
              "; ".join(f"{r.model}/{r.variant}/{r.task}: {r.error}" for r in failed), file=sys.stderr)
        return 1
    return 0


def check_eval_options(args, host, models, strategies, options):
    """Every eval option that can be checked without a model, checked now (a bad one is one line before any
    evaluation starts); returns the decode setting and the drafts."""
    from specterbench.bench.checks import check_device
    from specterbench.cli.options import decode_setting
    from specterbench.quality.eval_rows import DRAFT
    from specterbench.quality.evaluate import resolve_tasks

    for name in models:
        host.models().entry(name)
    for name in strategies:
        host.strategies().entry(name)
    for name, opts in options.items():
        if name == DRAFT:
            continue
        cls = host.strategies().get(name)
        if name not in strategies:
            raise UsageError(f"--set {name}.{next(iter(opts))}: strategy {name!r} is not in this evaluation "
                             f"({', '.join(strategies) or 'none'}); add it to --strategies or drop the --set")
        unknown = sorted(set(opts) - set(cls.option_names()))
        if unknown:
            raise UsageError(f"--set {name}.{unknown[0]}: strategy {name!r} has no option {unknown[0]!r}; it "
                             f"accepts: {', '.join(cls.option_names()) or 'none'}")
        cls.validate_options(opts)  # a bad value is one line now, not after the reference ran
    if not csv_list(args.tasks):
        raise UsageError("--tasks is empty; name lm-eval tasks or groups (default: specterbench_suite)")
    if args.include_path is not None and not Path(args.include_path).exists():
        raise UsageError(f"--include-path {args.include_path}: no such folder; give a folder of lm-eval task YAML "
                         f"files")
    resolve_tasks(csv_list(args.tasks), args.include_path)  # a misspelled task: one line, before any folder
    if args.bootstrap_iters < 0:
        raise UsageError(f"--bootstrap-iters must be >= 0, got {args.bootstrap_iters}")
    host.profiles().entry(args.profile)
    check_device(args.device)
    return decode_setting(args), parse_drafts(args.drafts)


def _quiet_libraries() -> None:
    """lm-eval and datasets log every task load; the table is what this command prints."""
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - lm-eval depends on datasets
        pass
