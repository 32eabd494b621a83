"""``specterbench overhead``: host wall time of the engine, all experts resident, against stock
``model.generate``."""

from __future__ import annotations

from specterbench.errors import UsageError
from specterbench.plugins.host import get_host


def cmd_overhead(args) -> int:
    from specterbench.bench.overhead import measure_overhead

    for flag, value in (("--tokens", args.tokens), ("--prompts", args.prompts), ("--threads", args.threads)):
        if value <= 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    from specterbench.bench.config import check_threads

    check_threads(args.threads)

    r = measure_overhead(get_host(), args.model, prompts=args.prompts, tokens=args.tokens, threads=args.threads)
    print(f"model {r.model}: {r.prompts} prompts x {r.tokens} tokens, greedy, host wall time, {args.threads} thread(s)")
    print(f"  stock model.generate   {r.stock_ms_per_token:8.3f} ms/token (median)")
    print(f"  engine, all resident   {r.engine_ms_per_token:8.3f} ms/token (median)")
    print(f"  ratio engine/stock     {r.ratio_median:8.3f} (median of per-prompt ratios; "
          f"min {min(r.ratios):.3f}, max {max(r.ratios):.3f})")
    print(f"  same tokens            {'yes' if r.tokens_equal else 'NO'}")
    return 0 if r.tokens_equal else 1


def add_parser(sub) -> None:
    s = sub.add_parser("overhead", help="host wall time of the engine (all resident) vs stock model.generate")
    s.add_argument("--model", default="tiny-qwen-moe")
    s.add_argument("--prompts", type=int, default=8)
    s.add_argument("--tokens", type=int, default=32)
    s.add_argument("--threads", type=int, default=1)
    s.set_defaults(func=cmd_overhead)

