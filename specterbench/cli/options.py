"""Options several commands share: strategy options, the decode setting, the target's precision, run folders."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from specterbench.errors import UsageError


def csv_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def strategy_options(pairs: list[str]) -> dict:
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


def add_output_argument(parser) -> None:
    """``--output md|csv|json|jsonl``: the printed table's format (:mod:`specterbench.analysis.formats`); checked
    by the command before any work, so an unknown one is one line."""
    parser.add_argument("--output", default="md", help="the printed table: md (default, for people), csv, json or "
                        "jsonl (every column, one record per row; the other lines go to stderr)")


def add_precision_arguments(parser) -> None:
    """``--expert-bits``, ``--dense-bits``, ``--expert-quantizer``, ``--expert-group``: the target's stored precision
    (:mod:`specterbench.engine.precision`)."""
    parser.add_argument("--expert-bits", default="16", help="the target's routed experts: 16 (bf16), 8, 4, 3 or 2 "
                        "bits, group-wise, or a name (bf16, q8, q4, q3, q2; the row states bits per weight with "
                        "scales); the reference is the quantized model and budgets are shares of the stored (packed) "
                        "expert bytes")
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
        from specterbench.runfiles.rundir import explicit_dests

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


def fold(flag: str, values, key=lambda v: v, show=lambda v: v) -> tuple:
    """``values`` without repeats, with one note per repeat: ``--strategies lru,lru`` runs lru once (a cell twice
    would be measured and stored twice)."""
    out, seen = [], {}
    for value in values:
        k = key(value)
        if k in seen:
            from specterbench.plugins.registry import warn

            first = show(seen[k])
            same = f"{show(value)!r} is {first!r} again" if show(value) != first else f"{first!r} twice"
            warn(f"{flag} names {same}; it runs once")
            continue
        seen[k] = value
        out.append(value)
    return tuple(out)


def run_folder_arg(path: str) -> Path:
    """A run folder given to report/gate/compare; a rows.jsonl path is refused with the folder to give."""
    p = Path(path)
    if p.is_file():
        raise UsageError(f"{p} is a file; give the run folder that holds it: {p.parent}")
    if not p.is_dir():
        raise UsageError(f"no run folder {p}; give a folder written by `specterbench run` (results/<run-id>)")
    return p


@contextlib.contextmanager
def report_files(run_dir: Path, again: str):
    """Writing summary.md and the plots: a full disk or an unwritable folder is one line (the rows are kept)."""
    try:
        yield
    except OSError as err:
        raise UsageError(f"writing {err.filename or run_dir} failed ({err.strerror or err}); the rows in "
                         f"{run_dir / 'rows.jsonl'} are kept; free space, then write the summary and plots with "
                         f"{again}") from None


def flag_integrity(rows, run_dir: Path) -> None:
    """One warning per integrity problem of a run folder's rows (a duplicated cell, a foreign run id)."""
    from specterbench.plugins.registry import warn
    from specterbench.runfiles.results import integrity_problems
    from specterbench.runfiles.rundir import run_ids

    for problem in integrity_problems(rows, run_dir / "rows.jsonl", run_ids(run_dir)):
        warn(problem)


def dated_folder(out: Path, base: str, args) -> Path:
    """A new folder named ``base`` (``base-2``, ``base-3``, ... when a run started in the same second took it),
    claimed by creating it, so that two runs started together never share one."""
    for i in range(1, 1000):
        path = out / (base if i == 1 else f"{base}-{i}")
        try:
            out.mkdir(parents=True, exist_ok=True)
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as err:
            raise UsageError(f"cannot write the run folder {path} ({err.strerror or err}); choose a writable --out "
                             f"(and check free disk space)") from None
        args.claimed_folder = True
        return path
    raise UsageError(f"{out}: a thousand runs named {base}*; give --run-id")


def add_card_arguments(parser) -> None:
    """``--gpu-memory`` and ``--gpu-reserve``: budgets as what a card of that memory leaves for experts
    (:mod:`specterbench.bench.device_memory`)."""
    parser.add_argument("--gpu-memory", default=None, metavar="SIZES", help="card sizes with a unit, e.g. 24GiB or "
                        "24GiB,48GiB: each cell's expert budget is what the card holds after the dense weights at "
                        "their precision, every request's KV cache at the cell's context, activations and "
                        "--gpu-reserve (at the priced geometry). In place of --budgets' default; with --budgets "
                        "given too, both run. --budgets device takes the --profile's memory")
    parser.add_argument("--gpu-reserve", default=None, metavar="SIZE", help="the runtime's own device memory on a "
                        "card budget (CUDA context, allocator slack, workspaces; default 1GiB, docs/clock.md)")


def run_budgets(args, host, flag: str = "--budgets") -> tuple:
    """The budgets of ``--budgets`` and ``--gpu-memory`` (``device``: the profile's memory), each once."""
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.device_memory import card_budgets, parse_memory, with_profile_memory
    from specterbench.runfiles.rundir import explicit_dests

    budgets = [parse_budget(b) for b in csv_list(args.budgets)]
    reserve = getattr(args, "gpu_reserve", None)
    if getattr(args, "gpu_memory", None):
        cards = card_budgets(args.gpu_memory, reserve)
        argv = getattr(args, "argv", None)
        given = argv is not None and "budgets" in explicit_dests(argv, ["budgets"])
        budgets = budgets + cards if given else cards
    elif reserve:
        parse_memory(reserve, "--gpu-reserve")
        if not any(b.card_bytes is not None for b in budgets):
            raise UsageError("--gpu-reserve sizes a card's runtime reserve, but no budget is a card; add "
                             "--gpu-memory 24GiB (or --budgets device), or drop --gpu-reserve")
    if any(b.card_bytes == 0 for b in budgets):
        budgets = list(with_profile_memory(budgets, host.profiles().get(args.profile_name), reserve))
    return fold(flag, budgets, key=lambda b: b.key(), show=lambda b: b.text)
