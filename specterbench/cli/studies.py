"""``specterbench realism``: does a stand-in route like the real model it stands for?"""

from __future__ import annotations

import json
from pathlib import Path

from specterbench.cli.options import add_decode_arguments, decode_setting
from specterbench.studies.realism import DEFAULT_SIZE, ReportSize, report
from specterbench.studies.realism_tables import format_fidelity, format_table


def add_parser(subparsers) -> None:
    from specterbench.catalog.embedded import EMBEDDED_MODELS

    s = subparsers.add_parser("realism", help="does a stand-in route like its real model? local routing "
                                             "consistency beside the published figures (arXiv 2505.16056)")
    s.add_argument("--model", required=True, choices=EMBEDDED_MODELS)
    s.add_argument("--path", type=Path, default=None, help="model directory (default: the package's)")
    s.add_argument("--windows", type=int, default=DEFAULT_SIZE.heldout_windows, help="held-out windows, teacher-forced")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--no-decode", action="store_true", help="teacher-forced only (skip the sampled decode)")
    s.add_argument("--no-draft", action="store_true", help="skip the int4/int3/int2 draft-fidelity rows")
    s.add_argument("--seed", type=int, default=0, help="noise stream of the sampled decode")
    add_decode_arguments(s)
    s.set_defaults(func=cmd_realism)


def cmd_realism(args) -> int:
    """Print the realism report; exit 0 (a miss of the tolerances is reported, not an error)."""
    from specterbench.errors import UsageError

    if args.windows < 1:
        raise UsageError(f"--windows must be a positive number of held-out windows, got {args.windows}")
    setting = decode_setting(args)  # validated before any model loads
    rep = report(args.model, path=args.path, decode=setting, size=ReportSize(heldout_windows=args.windows),
                 draft=not args.no_draft, decode_column=not args.no_decode)
    print(json.dumps(rep, indent=1) if args.json else format_table(rep) + "\n\n" + format_fidelity(rep))
    return 0
