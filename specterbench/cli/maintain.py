"""Maintainers' commands: rebuild what ships with the package (the stand-ins, their calibration and cards, the
prompt sets and lm-eval tasks) and write random checkpoints for tests.

``specterbench train | fidelity | routing-stats | make-workloads | make-tasks | random-checkpoint``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from specterbench.errors import UsageError


def add_parser(sub) -> None:
    from specterbench.catalog.embedded import EMBEDDED_MODELS
    from specterbench.engine.seam import SUPPORTED_FAMILIES
    from specterbench.studies.routing_stats import EVAL_WINDOWS
    from specterbench.studies.specs import DRAFT_SPECS, SPECS

    s = sub.add_parser("train", help="(maintainers) train one shipped stand-in (or the dense draft tiny-draft) on the "
                       "Shakespeare training works")
    s.add_argument("--model", required=True, choices=sorted(SPECS) + sorted(DRAFT_SPECS))
    g = s.add_mutually_exclusive_group()
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the model's fixed count)")
    g.add_argument("--minutes", type=float, default=None, help="wall-time budget; calibrates the step count")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, default=None, help="output dir (default: the package's stand_ins/<NAME>)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a training setting (aux_seq=0.05) or config key (config.num_experts=32)")
    s.add_argument("--no-card", action="store_true",
                   help="skip the draft calibration, CARD.md and the realism report (an experiment)")
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("fidelity", help="(maintainers) a stand-in's experts-removed and draft rows; --fit stores "
                       "its draft-fidelity calibration")
    s.add_argument("--model", required=True, choices=EMBEDDED_MODELS)
    s.add_argument("--path", type=Path, default=None, help="model directory (default: the package's)")
    s.add_argument("--fit", action="store_true", help="fit the error scales and write draft_calibration.json")
    s.add_argument("--windows", type=int, default=16, help="held-out windows")
    s.set_defaults(func=cmd_fidelity)

    s = sub.add_parser("routing-stats", help="(maintainers) routing statistics of a stand-in on held-out text")
    s.add_argument("--model", required=True, choices=EMBEDDED_MODELS)
    s.add_argument("--path", type=Path, default=None, help="model directory (default: the package's)")
    s.add_argument("--windows", type=int, default=EVAL_WINDOWS)
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--write-card", action="store_true", help="also (re)write CARD.md in the model directory")
    s.set_defaults(func=cmd_routing_stats)

    for name, what in (("make-workloads", "the packaged prompt sets"), ("make-tasks", "the shipped lm-eval tasks")):
        s = sub.add_parser(name, help=f"(maintainers) rebuild {what} (deterministic)")
        s.add_argument("--out", type=Path, default=None, help="folder to write (default: the package's)")
        s.add_argument("--check", action="store_true", help="fail if the files in --out differ from a fresh build")
        s.set_defaults(func=cmd_make_files)

    s = sub.add_parser("readme", help="(maintainers) write README.md's example table from a run (make readme); "
                       "--check: fail when it is stale (make readme-check, in CI)")
    s.add_argument("run_dir", help="the run whose rows the table shows (make readme: results/reference)")
    s.add_argument("--model", required=True, help="the model whose rows are shown")
    s.add_argument("--strategies", required=True, help="the strategies shown, in order (comma-separated)")
    s.add_argument("--command", required=True, help="the command line that made the run, shown above the table")
    s.add_argument("--readme", type=Path, default=Path("README.md"))
    s.add_argument("--check", action="store_true", help="exit 1 when the README's section differs from a fresh one")
    s.add_argument("--section", choices=("example", "batch"), default="example",
                   help="example (default): the per-budget table of the gate reference; batch: a batch sweep's "
                        "tokens/s per user and in total")
    s.set_defaults(func=cmd_readme)

    s = sub.add_parser("random-checkpoint", help="(tests) write a random-init checkpoint of a supported family "
                       "for --model-path")
    s.add_argument("out", help="folder to write")
    s.add_argument("--family", required=True, choices=SUPPORTED_FAMILIES)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--set", dest="fields", action="append", default=[], metavar="KEY=VALUE",
                   help="a config field (JSON value), repeatable: --set num_hidden_layers=32 --set hidden_size=512")
    s.set_defaults(func=cmd_random_checkpoint)


def cmd_train(args) -> int:
    from specterbench.studies.specs import DRAFT_SPECS
    from specterbench.studies.train import train
    from specterbench.studies.train_draft import train_draft

    overrides = dict(item.split("=", 1) for item in args.set)
    if args.model in DRAFT_SPECS:
        if args.minutes is not None:
            raise UsageError(f"--minutes is for the stand-ins; {args.model} trains a fixed step count: use --steps")
        train_draft(args.model, steps=args.steps, seed=args.seed, out_dir=args.out,
                    log=lambda s: print(s, flush=True), overrides=overrides)
        return 0
    train(args.model, steps=args.steps, minutes=args.minutes, seed=args.seed, out_dir=args.out,
          log=lambda s: print(s, flush=True), overrides=overrides, card=not args.no_card)
    return 0


def cmd_fidelity(args) -> int:
    from specterbench.catalog import embedded
    from specterbench.studies import realism
    from specterbench.studies.fidelity import fit_calibration
    from specterbench.studies.realism_tables import format_fidelity

    torch.set_num_threads(1)
    directory = Path(args.path) if args.path is not None else embedded.model_dir(args.model)
    model, tokenizer = embedded.load(args.model, dtype=torch.float32, path=directory)
    training = directory / "training.json"
    seq_len = int(json.loads(training.read_text()).get("seq_len", 256)) if training.is_file() else 256
    if args.fit:
        cal = fit_calibration(model, tokenizer, seq_len, log=lambda s: print(s, flush=True))
        (directory / embedded.CALIBRATION_FILE).write_text(cal.to_json())
        print(f"{args.model}: draft error scales: routed experts ×{cal.error_scale}, head ×{cal.head_error_scale} "
              f"-> {directory / embedded.CALIBRATION_FILE}")
        model.config.draft_error_scale = cal.error_scale
        model.config.draft_head_error_scale = cal.head_error_scale
    size = realism.ReportSize(draft_windows=args.windows)
    print(format_fidelity({"fidelity": realism.fidelity_rows(model, tokenizer, seq_len, size)}))
    return 0


def cmd_routing_stats(args) -> int:
    from specterbench.catalog import embedded
    from specterbench.studies import card
    from specterbench.studies.routing_stats import for_model, format_table

    stats = for_model(args.model, path=args.path, n_windows=args.windows)
    if args.write_card:
        card.write_card(args.model, args.path or embedded.model_dir(args.model), routing=stats)
    print(json.dumps(stats, indent=1) if args.json else format_table(stats))
    return 0


def cmd_make_files(args) -> int:
    """Write (or ``--check``) one JSON-lines file per set built by the command's module."""
    if args.command == "make-workloads":
        from specterbench.studies.make_workloads import OUT_DIR, build, dump
        changed = "a changed prompt set needs a new version suffix"
    else:
        from specterbench.quality.tasks.make_tasks import OUT_DIR, build, dump
        changed = "a changed task needs a new metadata.version"
    out = args.out or OUT_DIR
    status = 0
    for name, rows in build().items():
        path = out / f"{name}.jsonl"
        text = dump(rows)
        if args.check:
            same = path.is_file() and path.read_text(encoding="utf-8") == text
            print(f"{path}: {'up to date' if same else f'DIFFERS ({changed})'}")
            status |= 0 if same else 1
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({len(rows)} items)")
    return status


def cmd_readme(args) -> int:
    from specterbench.analysis.readme import batch_example, example, splice
    from specterbench.runfiles.results import read_rows

    strategies = tuple(x.strip() for x in args.strategies.split(",") if x.strip())
    render = batch_example if args.section == "batch" else example
    section = render(read_rows(Path(args.run_dir)), args.model, strategies, " ".join(args.command.split()))
    try:
        text = args.readme.read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot read {args.readme} ({err.strerror or err}); give --readme PATH") from None
    fresh = splice(text, section, args.readme, args.section)
    if args.check:
        if fresh != text:
            print(f"specterbench: {args.readme}'s {args.section} table is stale (its run or its command changed); "
                  f"regenerate it with make readme", file=sys.stderr)
            return 1
        print(f"{args.readme}: the {args.section} table is up to date")
        return 0
    args.readme.write_text(fresh, encoding="utf-8")
    print(f"written: {args.readme} ({args.section} table of {args.model} from {args.run_dir})")
    return 0


def cmd_random_checkpoint(args) -> int:
    from specterbench.catalog.checkpoint import write_random_checkpoint
    from specterbench.catalog.tiny import tiny_config

    config = tiny_config(args.family)
    for pair in args.fields:
        key, sep, value = pair.partition("=")
        if not sep or not hasattr(config, key):
            raise UsageError(f"{pair!r} is not KEY=VALUE of a {args.family} config field")
        try:
            setattr(config, key, json.loads(value))
        except json.JSONDecodeError:
            setattr(config, key, value)
    path = write_random_checkpoint(args.out, config, seed=args.seed)
    print(f"written: {path} (run it with --model-path {path})")
    return 0


