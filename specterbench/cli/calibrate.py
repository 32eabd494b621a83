"""``specterbench calibrate`` (measure this machine, write a profile file) and ``specterbench validate`` (the same
cells measured and modeled, the model's error)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specterbench.bench.calibrate import calibrate, check_device
from specterbench.bench.validate import DEFAULT_STRATEGIES, validate
from specterbench.cli.options import strategy_options
from specterbench.errors import UsageError


# ---- command line --------------------------------------------------------------------------------------
def add_validate_parser(sub) -> None:
    s = sub.add_parser("validate", help="run cells measured and modeled; print modeled-vs-measured TPOT error")
    s.add_argument("--profile", required=True, help="profile file written by `specterbench calibrate`")
    s.add_argument("--model", default="tiny-mixtral")
    s.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    s.add_argument("--budgets", default="50%")
    s.add_argument("--prompts", type=int, default=4)
    s.add_argument("--tokens", type=int, default=16)
    s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    s.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    s.add_argument("--threads", type=int, default=None, help="host threads (default: the profile's host threads)")
    s.add_argument("--out", default=None, help="folder for the results (default results/validate-<time>)")
    s.add_argument("--max-error", type=float, default=None,
                   help="exit 1 when any cell's |error| exceeds this fraction (default: report only)")
    s.add_argument("--set", action="append", metavar="STRATEGY.OPTION=VALUE", help="strategy option (as in run)")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=cmd_validate)


def cmd_validate(args) -> int:
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.calibrate import check_device
    from specterbench.plugins.host import get_host

    check_device(args.device)
    if not Path(args.profile).is_file():
        host = get_host()
        if args.profile in host.profiles().names():
            raise UsageError(f"--profile {args.profile} is a built-in profile (another machine's published figures); "
                             f"validate checks a profile measured on this machine: write it with `specterbench "
                             f"calibrate --out results/profile.toml`, then validate --profile results/profile.toml")
        raise UsageError(f"--profile {args.profile}: no such file; write this machine's profile with `specterbench "
                         f"calibrate --out {args.profile}`, then validate it")
    if args.threads is not None:
        from specterbench.bench.config import check_threads

        if args.threads <= 0:
            raise UsageError(f"--threads must be positive, got {args.threads}")
        check_threads(args.threads)
    if args.prompts <= 0 or args.tokens <= 1:
        raise UsageError("--prompts must be positive and --tokens at least 2 (TPOT needs a decode token)")
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    budgets = tuple(parse_budget(b) for b in args.budgets.split(",") if b.strip())
    progress = None if args.quiet else (lambda msg: print(f"· {msg}", file=sys.stderr, flush=True))
    if args.out is None:
        import time

        args.out = f"results/validate-{time.strftime('%Y%m%d-%H%M%S')}"
    comparisons, text = validate(get_host(), profile_path=args.profile, model=args.model, strategies=strategies,
                                 budgets=budgets, prompts=args.prompts, tokens=args.tokens, device=args.device,
                                 out=Path(args.out), threads=args.threads, dtype=getattr(torch, args.dtype),
                                 strategy_options=strategy_options(args.set), progress=progress)
    print(text, end="")
    print(f"written: {Path(args.out) / 'validate.md'}, {Path(args.out) / 'validate.json'}")
    failed = [c for c in comparisons if c.status != "ok"]
    if failed:
        print(f"specterbench: {len(failed)} cell(s) failed: " + "; ".join(f"{c.strategy}: {c.status}"
                                                                         for c in failed), file=sys.stderr)
        return 1
    if args.max_error is not None and any(c.error is not None and abs(c.error) > args.max_error
                                          for c in comparisons):
        return 1
    return 0


# ---- command line --------------------------------------------------------------------------------------
def add_calibrate_parser(sub) -> None:
    s = sub.add_parser("calibrate", help="measure this machine's link, launch and compute; write a profile file")
    s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda, cuda:N or cpu (default: cuda when there is one)")
    s.add_argument("--out", default="results/profile.toml", help="profile file to write (TOML)")
    s.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    s.add_argument("--threads", type=int, default=None, help="host threads (default: torch's)")
    s.add_argument("--name", help="profile name (default calibrated-<host>-<device>)")
    s.add_argument("--shape", default="2048,4096", metavar="HIDDEN,INTER",
                   help="weight shape of the compute measurements: the hidden and expert sizes of the model you "
                        "will run (decode shapes), e.g. 4096,14336 for Mixtral, 256,160 for tiny-mixtral")
    s.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (seconds, noisier)")
    s.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    device = check_device(args.device)
    if args.threads is not None and args.threads <= 0:
        raise UsageError(f"--threads must be positive, got {args.threads}")
    if args.threads is not None:
        from specterbench.bench.config import check_threads

        check_threads(args.threads)
    if args.name is not None and not args.name.strip():
        raise UsageError("--name is empty; name the profile (what --profile selects), or leave --name out")
    if Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a folder; give the profile file to write, e.g. "
                         f"{Path(args.out) / 'profile.toml'}")
    try:
        hidden, inter = (int(x) for x in args.shape.split(","))
    except ValueError:
        raise UsageError(f"--shape {args.shape!r}: write HIDDEN,INTER, e.g. 4096,14336") from None
    if hidden <= 0 or inter <= 0:
        raise UsageError(f"--shape {args.shape!r}: both sizes must be positive")
    cal = calibrate(device, dtype=getattr(torch, args.dtype), quick=args.quick, threads=args.threads, name=args.name,
                    hidden=hidden, inter=inter)
    try:
        path = cal.write(args.out)
    except OSError as err:
        raise UsageError(f"cannot write --out {args.out} ({err.strerror or err}); give a writable file (and check "
                         f"free disk space), then calibrate again") from None
    p, h, m = cal.profile, cal.host, cal.measured
    print(f"profile {p.name}: {p.accelerator}")
    for n, t in zip(m["copy_bytes"], m["copy_seconds"]):
        print(f"  copy {n / 2**20:8.3f} MiB  {t * 1e6:10.1f} us  {n / t / 1e9:7.2f} GB/s")
    print(f"  link: {p.link_bytes_per_s / 1e9:.2f} GB/s, latency {p.link_latency_us:.1f} us (fit)")
    print(f"  launch: {p.launch_us:.2f} us per kernel")
    print(f"  compute ({m['device_dtype']}): gemv {p.mem_bytes_per_s / 1e9:.2f} GB/s "
          f"({m['device_gemv_flops_per_s'] / 1e9:.2f} GFLOP/s at 1 token), "
          f"{p.flops_per_s / 1e9:.1f} GFLOP/s at 64 tokens")
    print(f"  host experts: {h.mem_bytes_per_s / 1e9:.2f} GB/s DRAM, {h.flops_per_s / 1e9:.1f} GFLOP/s, "
          f"{h.threads} threads, {h.launch_us:.1f} us dispatch")
    if h.isa is None:
        print("  host expert kernels: no amx / avx512 / avx2 flag in /proc/cpuinfo; add [host_profile.expert_kernels."
              "<isa>.bf16] to the file to price host experts with it")
    else:
        print(f"  host expert kernels: {h.isa} bf16 written (int8 / int4 not measured)")
    print(f"written: {path}  (use: --profile {path})")
    return 0


def add_parser(sub) -> None:
    add_calibrate_parser(sub)
    add_validate_parser(sub)
