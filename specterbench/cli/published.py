"""``specterbench published``: the modeled clock held against published measurements."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from specterbench.bench.published import render, run_record, to_json
from specterbench.bench.published_record import QUICK_IDS, RECORD, load_record
from specterbench.errors import UsageError


def add_parser(sub) -> None:
    s = sub.add_parser("published", help="hold the modeled clock against published measurements (MoE-SpeQ, "
                       "mixtral-offloading, Fiddler, component figures)")
    s.add_argument("--record", default=str(RECORD), help="the published record (TOML; default: the shipped one)")
    s.add_argument("--ids", default="", help="comma-separated measurement ids (default: all)")
    s.add_argument("--quick", action="store_true", help=f"a subset in seconds ({', '.join(QUICK_IDS)}), 1 prompt "
                   "x 8 tokens")
    s.add_argument("--prompts", type=int, default=4, help="benchmark prompts per decode measurement (default 4)")
    s.add_argument("--tokens", type=int, default=32, help="new tokens per prompt (default 32)")
    s.add_argument("--out", default=None, help="folder for rows.jsonl, published.md and published.json "
                   "(default results/published-<time>)")
    s.add_argument("--list", action="store_true", help="list the record's measurements and exit")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=cmd_published)


def cmd_published(args) -> int:
    from specterbench.plugins.host import get_host

    host = get_host()
    measurements = load_record(host, args.record)
    ids = [i.strip() for i in args.ids.split(",") if i.strip()] or (list(QUICK_IDS) if args.quick else [])
    if ids:
        known = {m.id for m in measurements}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise UsageError(f"--ids: unknown measurement(s) {', '.join(unknown)}; see specterbench published --list")
        measurements = [m for m in measurements if m.id in ids]
    if args.list:
        for m in measurements:
            print(f"{m.id:26} {m.kind:13} {m.published_text:22} {m.system} — {m.source}")
        return 0
    prompts, tokens = (1, 8) if args.quick else (args.prompts, args.tokens)
    if prompts <= 0 or tokens <= 1:
        raise UsageError("--prompts must be positive and --tokens at least 2 (TPOT needs a decode token)")
    out = Path(args.out or f"results/published-{time.strftime('%Y%m%d-%H%M%S')}")
    if (out / "rows.jsonl").exists():
        raise UsageError(f"--out {out} already holds rows.jsonl; pass another --out or remove it")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot write --out {out} ({err.strerror or err})") from None
    progress = None if args.quiet else (lambda msg: print(f"· {msg}", file=sys.stderr, flush=True))
    started = time.perf_counter()
    outcomes = run_record(host, measurements, prompts=prompts, tokens=tokens, out=out, progress=progress)
    text = render(outcomes) + (f"\n{prompts} prompt(s) x {tokens} tokens per decode measurement; "
                               f"{time.perf_counter() - started:.0f} s on this machine\n")
    try:
        (out / "published.md").write_text(text, encoding="utf-8")
        (out / "published.json").write_text(json.dumps(to_json(outcomes), indent=2), encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write the results to {out} ({err.strerror or err})") from None
    print(text, end="")
    print(f"written: {out / 'published.md'}, {out / 'published.json'}, {out / 'rows.jsonl'}")
    failed = [o for o in outcomes if o.status != "ok"]
    if failed:
        print(f"specterbench: {len(failed)} measurement(s) failed: " +
              "; ".join(f"{o.measurement.id}: {o.status}" for o in failed), file=sys.stderr)
        return 1
    return 0
