"""``specterbench eval``: the quality table — lm-eval tasks for the reference, each strategy and the draft alone.

For every model: the **reference** (the target with every expert resident), each strategy at the budget,
and the **draft** alone (the target with its routed experts quantized to 4 bits, what a speculative
strategy drafts with) run the same lm-eval tasks through :class:`specterbench.quality.lmeval.SpecterbenchLM`. One
row per (model, variant, task): the task's headline metric with its stderr and the delta to the reference.

Lossless strategies must reproduce the reference sample for sample — every log-likelihood bit for bit,
every generated string character for character; any difference makes the row ``mismatch`` and the command
exit non-zero. The draft and lossy strategies show what they cost instead (delta, and how often their
decisions agree with the reference's). A strategy that raises is an ``error`` row; the others continue.
"""

from __future__ import annotations

import os

# Nothing downloads at run time (DESIGN rule 7); an explicit user setting wins. Set before lm-eval and
# ``datasets`` are imported, since ``datasets`` reads these variables once at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

from specterbench.errors import SpecterbenchError, UsageError  # noqa: E402

EVAL_SCHEMA_VERSION = 1
REFERENCE, DRAFT = "reference", "draft"
DEFAULT_BUDGET = "50%"
DEFAULT_BOOTSTRAP_ITERS = 1000  # stderr of perplexity-type metrics is bootstrapped; lm-eval's 100000 is slow


@dataclass(slots=True)
class EvalRow:
    """One (model, variant, task) result; ``variant`` is ``reference``, ``draft`` or a strategy name."""

    run_id: str
    model: str
    variant: str
    kind: str  # reference | strategy | draft
    task: str
    lossless: bool | None = None  # what the variant promises (None: the reference itself)
    metric: str | None = None  # the task's headline metric (first of its metric_list)
    higher_is_better: bool | None = None
    score: float | None = None
    stderr: float | None = None
    delta: float | None = None  # score - reference score on the same task and metric
    check: str = ""  # how the samples compare with the reference's
    status: str = "ok"  # ok | mismatch | error
    error: str | None = None
    samples: int | None = None
    limit: int | None = None
    budget_bytes: int | None = None
    budget_fraction: float | None = None
    metrics: dict = field(default_factory=dict)  # every metric lm-eval reported for the task
    info: dict = field(default_factory=dict)  # SpecterbenchLM.get_model_info(): bytes, hits, draft size
    env: dict = field(default_factory=dict)
    duration_s: float = 0.0
    schema_version: int = EVAL_SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)


# ---- tasks ---------------------------------------------------------------------------------------
def shipped_hint() -> str:
    from specterbench.quality.tasks import SHIPPED_TASKS, SUITE

    return (f"shipped tasks: {', '.join(SHIPPED_TASKS)} (group {SUITE}); standard lm-eval tasks (hellaswag, "
            f"arc_easy, ...) run by name when their dataset is in the local datasets cache, see docs/eval.md")


def resolve_tasks(tasks, include_path: str | None = None, include_defaults: bool | None = None):
    """A TaskManager that knows the shipped tasks, and the leaf task names ``tasks`` expand to.

    lm-eval's own ~14k task index takes ~10-20 s to build; it is skipped when every name is a shipped one
    (``include_defaults=None``). Unknown names raise :class:`UsageError` with lm-eval's own message and the
    shipped tasks; data that cannot be loaded offline raises one naming the task and the fix.
    """
    from lm_eval.tasks import TaskManager

    from specterbench.quality.tasks import SHIPPED_TASKS, SUITE, TASKS_DIR

    tasks = list(tasks)
    if not tasks:
        raise UsageError(f"no tasks given; {shipped_hint()}")
    if include_defaults is None:
        include_defaults = bool(include_path) or not set(tasks) <= {*SHIPPED_TASKS, SUITE}
    paths = [str(TASKS_DIR)] + ([str(include_path)] if include_path else [])
    manager = TaskManager(include_path=paths, include_defaults=include_defaults)
    try:
        loaded = manager.load(tasks)
    except KeyError as err:
        message = " ".join(str(err.args[0] if err.args else err).split())
        raise UsageError(f"{message} (lm-eval); {shipped_hint()}") from None
    except Exception as err:  # noqa: BLE001 - a dataset that is not available offline, a broken YAML
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UsageError(f"task(s) {', '.join(tasks)} could not be loaded ({type(err).__name__}: {first}); runs "
                         f"are offline (HF_DATASETS_OFFLINE=1): a standard task needs its dataset in the local "
                         f"datasets cache first, see docs/eval.md") from None
    return manager, tasks, list(loaded["tasks"])


# ---- per-sample comparison -----------------------------------------------------------------------
def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return float(value)
    return value


def _by_doc(samples) -> dict:
    return {s["doc_id"]: s for s in samples or []}


def _decision(sample):
    """What a sample decided: the chosen option (multiple choice) or the text (generation); else None."""
    resps = sample.get("filtered_resps")
    if isinstance(resps, (list, tuple)) and resps and all(isinstance(r, (list, tuple)) and len(r) == 2
                                                          for r in resps):
        lls = [float(r[0]) for r in resps]
        return max(range(len(lls)), key=lls.__getitem__) if len(lls) > 1 else None
    if isinstance(resps, (list, tuple)) and resps and all(isinstance(r, str) for r in resps):
        return tuple(resps)
    return None


def compare_samples(samples, reference) -> tuple[int, int, int | None, float | None]:
    """``(differ, total, first differing doc id, decision agreement)`` of two runs' per-sample outputs.

    Outputs are compared raw (``resps``: every log-likelihood, the whole generated text), before any task
    filter; decisions (the chosen option, the filtered answer) come from ``filtered_resps``.
    """
    mine, ref = _by_doc(samples), _by_doc(reference)
    differ, first = 0, None
    agree = decided = 0
    for doc_id in sorted(set(mine) | set(ref), key=str):
        a, b = mine.get(doc_id), ref.get(doc_id)
        if a is None or b is None or _plain(a.get("resps")) != _plain(b.get("resps")):  # raw model outputs
            differ += 1
            first = doc_id if first is None else first
        if a is not None and b is not None:
            da, db = _decision(a), _decision(b)
            if da is not None and db is not None:
                decided += 1
                agree += da == db
    return differ, len(set(mine) | set(ref)), first, (agree / decided if decided else None)


# ---- results -> rows -----------------------------------------------------------------------------
def headline(results: dict, task: str) -> tuple[str | None, str | None]:
    """``(metric, results key)`` of a task's headline metric: the first of its metric_list that was reported."""
    reported = results.get("results", {}).get(task, {})
    metric_list = (results.get("configs", {}).get(task, {}) or {}).get("metric_list") or []
    names = [m.get("metric") for m in metric_list if isinstance(m, dict)]
    names += [k.split(",")[0] for k in reported if "," in k and "_stderr" not in k]
    for name in names:
        for key in reported:
            if isinstance(name, str) and key.startswith(f"{name},"):
                return name, key
    return None, None


def _number(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value else None  # NaN (lm-eval's "N/A") -> None


def _metric_value(value):
    """JSON-friendly: numpy and NaN numbers become floats and None; text ("N/A", the task name) stays."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    return _number(value)


def rows_from_results(results: dict, base: dict, leaf_tasks: list[str]) -> list[EvalRow]:
    rows = []
    for task in leaf_tasks:
        reported = results.get("results", {}).get(task, {})
        metric, key = headline(results, task)
        stderr_key = key.replace(",", "_stderr,", 1) if key else None
        row = EvalRow(**base, task=task, metric=metric, score=_number(reported.get(key)) if key else None,
                      stderr=_number(reported.get(stderr_key)) if stderr_key else None,
                      samples=(results.get("n-samples", {}).get(task, {}) or {}).get("effective"),
                      metrics={k: _metric_value(v) for k, v in reported.items() if k != "alias"})
        row.higher_is_better = (results.get("higher_is_better", {}).get(task, {}) or {}).get(metric)
        row.info = dict(row.info)  # each row its own copy
        rows.append(row)
    return rows


_RATIO_METRICS = ("bits_per_byte", "byte_perplexity", "word_perplexity")  # lm-eval reports no stderr for these


def ratio_stderr(samples, metric: str) -> float | None:
    """Standard error of a perplexity-type metric from its per-document ``(loglikelihood, units)`` pairs.

    These metrics are ratios of sums over documents (``-Σ ll / Σ units``), which lm-eval does not bootstrap.
    The delta method for a ratio estimator gives ``SE(r) = sqrt(Σ (y_i - r x_i)² / (n (n-1))) / mean(x)`` with
    ``y = -ll`` and ``x = units``; ``bits_per_byte`` divides by ln 2, the perplexities scale by ``exp(r)``.
    """
    import math

    pairs = [s.get(metric) for s in samples or []]
    pairs = [(float(p[0]), float(p[1])) for p in pairs if isinstance(p, (list, tuple)) and len(p) == 2]
    n = len(pairs)
    if n < 2 or metric not in _RATIO_METRICS:
        return None
    y = [-ll for ll, _ in pairs]
    x = [units for _, units in pairs]
    mean_x = sum(x) / n
    if mean_x <= 0:
        return None
    r = sum(y) / sum(x)  # nats per unit
    se = math.sqrt(sum((yi - r * xi) ** 2 for yi, xi in zip(y, x)) / (n * (n - 1))) / mean_x
    if metric == "bits_per_byte":
        return se / math.log(2)
    return math.exp(r) * se


def _error_rows(base: dict, leaf_tasks: list[str], err: BaseException) -> list[EvalRow]:
    message = f"{type(err).__name__}: {' '.join(str(err).split())}"
    rows = []
    for task in leaf_tasks:
        row = EvalRow(**base, task=task, status="error", error=message, check="-")
        if not isinstance(err, SpecterbenchError):
            row.info["traceback"] = traceback.format_exc(limit=8)
        rows.append(row)
    return rows


# ---- the evaluation ------------------------------------------------------------------------------
def default_strategies(host=None) -> list[str]:
    """Registered strategies that take a budget and need no recorded reference routing (lossless and lossy).

    Left out: fixed-budget ones (``resident`` is the reference by construction) and bounds that replay the
    reference's routing (``oracle``); name them with ``--strategies`` to include them anyway.
    """
    from specterbench.plugins.host import get_host

    host = host or get_host()
    out = []
    for name in host.strategies().names():
        cls = host.strategies().get(name)
        if cls.fixed_budget_fraction is None and not cls.uses_reference_trace:
            out.append(name)
    return out


def run_eval(models, strategies, tasks, *, limit: int | None = None, budget: str = DEFAULT_BUDGET,
             profile: str = "a100-40g-pcie4", device: str = "cpu", strategy_options: dict | None = None,
             include_path: str | None = None, include_defaults: bool | None = None, draft: bool = True,
             bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS, run_id: str = "eval", env: dict | None = None,
             progress: Callable[[str], None] | None = None, writer: Callable[[EvalRow], None] | None = None,
             decode=None,
             ) -> list[EvalRow]:
    """Evaluate ``tasks`` for each model: reference, each strategy, then the draft alone. Returns the rows.

    ``writer`` is called with each row as soon as its variant finishes (append it to a file there).
    """
    import lm_eval

    from specterbench.quality.lmeval import SpecterbenchLM, load_engine
    from specterbench.plugins.host import get_host

    host = get_host()
    progress = progress or (lambda msg: None)
    strategy_options = strategy_options or {}
    manager, task_names, leaf_tasks = resolve_tasks(tasks, include_path, include_defaults)
    for name in strategies:
        host.strategies().entry(name)  # did-you-mean before anything runs
    for name in models:
        host.models().entry(name)
    env = env if env is not None else host.environment()
    rows: list[EvalRow] = []
    for model in models:
        engine = load_engine(model, device, host)
        calibration = None
        reference: dict[str, tuple[EvalRow, list]] = {}
        variants = [REFERENCE, *strategies] + ([DRAFT] if draft else [])
        for variant in variants:
            kind = variant if variant in (REFERENCE, DRAFT) else "strategy"
            progress(f"{model} · {variant}")
            base = dict(run_id=run_id, model=model, variant=variant, kind=kind, limit=limit, env=env)
            if kind == "strategy":
                base["lossless"] = bool(host.strategies().get(variant).lossless)
            elif kind == DRAFT:
                base["lossless"] = False
            started = time.perf_counter()
            try:
                lm = SpecterbenchLM(engine=engine, strategy=variant, budget=budget, profile=profile,
                                    calibration=calibration, progress=False, decode=decode,
                                    **strategy_options.get(variant, {}))
                calibration = lm.calibration or calibration
                results = lm_eval.simple_evaluate(model=lm, tasks=task_names, task_manager=manager, limit=limit,
                                                  log_samples=True, bootstrap_iters=bootstrap_iters)
                info = lm.get_model_info()
                base.update(budget_bytes=info["budget_bytes"], budget_fraction=info["budget_fraction"], info=info)
                new = rows_from_results(results, base, leaf_tasks)
                samples = results.get("samples", {})
                for row in new:
                    if row.stderr is None and row.metric in _RATIO_METRICS:
                        row.stderr = ratio_stderr(samples.get(row.task), row.metric)
                        row.info["stderr_" + row.metric] = "delta method over documents (specterbench)"
            except KeyboardInterrupt:
                raise
            except Exception as err:  # one variant's failure is its rows', never the run's
                new, samples = _error_rows(base, leaf_tasks, err), {}
            elapsed = time.perf_counter() - started
            for row in new:
                row.duration_s = elapsed
                _check(row, samples.get(row.task), reference)
                if variant == REFERENCE and row.status == "ok":
                    reference[row.task] = (row, samples.get(row.task) or [])
                rows.append(row)
                if writer is not None:
                    writer(row)
    return rows


def _check(row: EvalRow, samples, reference: dict) -> None:
    """Fill ``delta`` and ``check`` against the reference; a lossless variant that differs fails."""
    if row.status != "ok":
        return
    if row.kind == REFERENCE:
        row.check = "reference"
        return
    if row.task not in reference:
        row.check = "no reference (its row failed)"
        return
    ref_row, ref_samples = reference[row.task]
    if row.score is not None and ref_row.score is not None and row.metric == ref_row.metric:
        row.delta = row.score - ref_row.score
    differ, total, first, agreement = compare_samples(samples, ref_samples)
    if row.lossless:
        if differ:
            row.status = "mismatch"
            row.check = f"MISMATCH {differ}/{total} samples (first doc {first})"
            row.error = (f"{row.variant} is lossless but {differ} of {total} samples of {row.task} differ from the "
                         f"reference (first: doc {first})")
        else:
            row.check = f"identical ({total} samples)"
        return
    if differ == 0:
        row.check = f"identical ({total} samples)"
    elif agreement is not None:
        row.check = f"lossy: {agreement:.1%} of decisions agree"
    else:
        row.check = f"lossy: {differ}/{total} samples differ"


# ---- table ---------------------------------------------------------------------------------------
def _fmt(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _budget_cell(r: EvalRow) -> str:
    if r.kind == REFERENCE:
        return "all resident"
    if r.kind == DRAFT:
        total, draft = r.info.get("total_expert_bytes"), r.info.get("draft_device_bytes")
        return f"draft {draft / total:.0%}" if total and draft else "-"
    return "-" if r.budget_fraction is None else f"{r.budget_fraction:.0%}"


def quality_table(rows: list[EvalRow]):
    import pandas as pd

    records = []
    for r in rows:
        direction = {True: "↑", False: "↓"}.get(r.higher_is_better, "")
        records.append({
            "model": r.model,
            "variant": r.variant if r.kind != DRAFT else f"draft ({r.info.get('draft_quant', '4-bit')}, alone)",
            "budget": _budget_cell(r),
            "task": r.task,
            "metric": f"{r.metric} {direction}".strip() if r.metric else "-",
            "score": "-" if r.score is None else (
                f"{r.score:.4f}" + (f" ± {r.stderr:.4f}" if r.stderr is not None else "")),
            "Δ vs reference": "-" if r.delta is None else f"{r.delta:+.4f}",
            "check": r.check if r.status == "ok" else (r.check if r.status == "mismatch" else f"ERROR: {r.error}"),
        })
    return pd.DataFrame(records)


def render_markdown(rows: list[EvalRow]) -> str:
    df = quality_table(rows)
    if df.empty:
        return "(no rows)\n"
    return df.to_markdown(index=False) + "\n"


def write_report(run_dir: Path, rows: list[EvalRow], *, limit, budget: str, profile: str) -> Path:
    lines = [f"# specterbench eval {run_dir.name}", "",
             "Quality of each strategy against the **reference** (the target, every expert resident) on the same "
             "lm-eval tasks. Lossless strategies must match the reference sample for sample (`identical`); the "
             "**draft** row is the 4-bit self-draft alone, i.e. what quantization alone costs. ↑/↓: direction of "
             "the metric.", "",
             f"Budget {budget} of expert bytes; modeled clock profile `{profile}` (speed is not measured here); "
             f"limit {limit if limit else 'none'} samples per task.", "", render_markdown(rows)]
    path = run_dir / "eval.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# ---- command line --------------------------------------------------------------------------------
def _csv(text: str) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def default_models(host=None) -> list[str]:
    """The embedded trained models that are registered; the random seam-test model when none is."""
    from specterbench.plugins.host import get_host

    host = host or get_host()
    names = host.models().names()
    embedded = [n for n in ("tiny-mixtral", "tiny-qwen-moe") if n in names]
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
    s.add_argument("--bootstrap-iters", type=int, default=DEFAULT_BOOTSTRAP_ITERS,
                   help="bootstrap iterations for perplexity stderr (lm-eval's default is 100000)")
    s.add_argument("--out", default="results")
    s.add_argument("--run-id")
    s.add_argument("--quiet", action="store_true")
    from specterbench.cli import add_decode_arguments
    from specterbench.engine.sampling import GREEDY

    add_decode_arguments(s, default=GREEDY)  # lm-eval's exact-match tasks score greedy continuations
    s.set_defaults(func=cmd_eval)


def cmd_eval(args) -> int:
    import torch

    from specterbench.plugins.host import get_host

    host = get_host()
    torch.set_num_threads(1)
    models = _csv(args.model) or default_models(host)
    if args.strategies in ("default", ""):
        strategies = default_strategies(host)
    elif args.strategies == "none":
        strategies = []
    elif args.strategies == "all":
        strategies = host.strategies().names()
    else:
        strategies = _csv(args.strategies)
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be a positive number of samples per task, got {args.limit}")
    options: dict = {}
    for pair in args.set or []:
        lhs, sep, value = pair.partition("=")
        if not sep or "." not in lhs:
            raise UsageError(f"malformed --set {pair!r}; write STRATEGY.OPTION=VALUE, e.g. specter.k=4")
        name, option = lhs.split(".", 1)
        options.setdefault(name, {})[option] = value
    run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S") + "-" + models[0]
    run_dir = Path(args.out) / f"eval-{run_id}"
    _quiet_libraries()
    progress = None if args.quiet else (lambda msg: print(f"· {msg}", file=sys.stderr, flush=True))
    run_dir.mkdir(parents=True, exist_ok=True)
    jsonl = run_dir / "eval.jsonl"

    def write(row: EvalRow) -> None:
        with open(jsonl, "a", encoding="utf-8") as f:
            f.write(row.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    from specterbench.cli import decode_setting

    rows = run_eval(models, strategies, _csv(args.tasks), limit=args.limit, budget=args.budget,
                    decode=decode_setting(args), profile=args.profile, device=args.device, strategy_options=options,
                    include_path=args.include_path, draft=not args.no_draft, bootstrap_iters=args.bootstrap_iters,
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


def _quiet_libraries() -> None:
    """lm-eval and datasets log every task load; the table is what this command prints."""
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - lm-eval depends on datasets
        pass
