"""``specterbench eval``: the quality table — lm-eval tasks for the reference, each strategy and the draft alone.

For every model: the **reference** (the target with every expert resident), each strategy at the budget,
and the **draft** alone (the target with its routed experts quantized to 4 bits, what a speculative
strategy drafts with) run the same lm-eval tasks through :class:`specterbench.quality.lmeval.SpecterbenchLM`. One
row per (model, variant, task): the task's headline metric with its stderr and the delta to the reference.

Lossless strategies must reproduce the reference sample for sample — every log-likelihood within the numerics
the compute dtype and depth allow (:mod:`specterbench.engine.numerics`; bit-identity is counted beside it), every
generated string character for character; any other difference makes the row ``mismatch`` and the command exit
non-zero. The draft and lossy strategies show what they cost instead (delta, and how often their
decisions agree with the reference's). A strategy that raises is an ``error`` row; the others continue.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import lm_eval
from lm_eval.tasks import TaskManager

from specterbench.bench.progress import CellProgress
from specterbench.engine.draft import QuantSpec
from specterbench.engine.numerics import loglik_tolerance, margin_tolerance
from specterbench.errors import UsageError
from specterbench.plugins.host import get_host
from specterbench.quality.eval_rows import (
    DEFAULT_BOOTSTRAP_ITERS,
    DEFAULT_BUDGET,
    DRAFT,
    RATIO_METRICS,
    REFERENCE,
    EvalRow,
    check_row,
    error_rows,
    ratio_stderr,
    rows_from_results,
)
from specterbench.quality.lmeval import SpecterbenchLM
from specterbench.quality.scoring_engine import load_engine
from specterbench.quality.tasks import SHIPPED_TASKS, SUITE, TASKS_DIR


# ---- tasks ---------------------------------------------------------------------------------------
def shipped_hint() -> str:

    return (f"shipped tasks: {', '.join(SHIPPED_TASKS)} (group {SUITE}); standard lm-eval tasks (hellaswag, "
            f"arc_easy, ...) run by name when their dataset is in the local datasets cache, see docs/eval.md")


def resolve_tasks(tasks, include_path: str | None = None, include_defaults: bool | None = None):
    """A TaskManager that knows the shipped tasks, and the leaf task names ``tasks`` expand to.

    lm-eval's own ~14k task index takes ~10-20 s to build; it is skipped when every name is a shipped one
    (``include_defaults=None``). Unknown names raise :class:`UsageError` with lm-eval's own message and the
    shipped tasks; data that cannot be loaded offline raises one naming the task and the fix.
    """

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


# ---- the evaluation ------------------------------------------------------------------------------
def default_strategies(host=None) -> list[str]:
    """Registered strategies that take a budget and need no recorded reference routing (lossless and lossy).

    Left out: fixed-budget ones (``resident`` is the reference by construction) and bounds that replay the
    reference's routing (``oracle``); name them with ``--strategies`` to include them anyway.
    """

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
             decode=None, drafts: tuple[dict, ...] | None = None,
             ) -> list[EvalRow]:
    """Evaluate ``tasks`` for each model: reference, each strategy, then the draft alone. Returns the rows.

    ``writer`` is called with each row as soon as its variant finishes (append it to a file there). ``drafts``:
    quantization options of each draft-alone row (default: one row with ``strategy_options["draft"]``); with
    several, each row's variant is ``draft <label>`` (e.g. ``draft int3/g128``).
    """

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

    per_model = 1 + len(strategies) + (len(drafts or (None,)) if draft else 0)
    cells = CellProgress(len(models) * per_model, progress)
    for model in models:
        engine = load_engine(model, device, host)
        tolerance = sample_tolerance(engine)
        near_tie = None
        calibration = None
        reference: dict[str, tuple[EvalRow, list]] = {}
        variants = [(REFERENCE, REFERENCE, {}), *((name, name, strategy_options.get(name, {})) for name in strategies)]
        if draft:
            variants += draft_variants(drafts, strategy_options.get(DRAFT, {}))
        for variant, lm_variant, options in variants:
            kind = lm_variant if lm_variant in (REFERENCE, DRAFT) else "strategy"
            cells.start(f"{model} · {variant}")
            base = dict(run_id=run_id, model=model, variant=variant, kind=kind, limit=limit, env=env)
            if kind == "strategy":
                base["lossless"] = bool(host.strategies().get(variant).lossless)
            elif kind == DRAFT:
                base["lossless"] = False
            started = time.perf_counter()
            try:
                lm = SpecterbenchLM(engine=engine, strategy=lm_variant, budget=budget, profile=profile,
                                    calibration=calibration, progress=False, decode=decode, **options)
                calibration = lm.calibration or calibration
                if variant == REFERENCE:
                    near_tie = routing_near_tie(engine, lm.router_margins)
                results = lm_eval.simple_evaluate(model=lm, tasks=task_names, task_manager=manager, limit=limit,
                                                  log_samples=True, bootstrap_iters=bootstrap_iters)
                info = lm.get_model_info()
                base.update(budget_bytes=info["budget_bytes"], budget_fraction=info["budget_fraction"], info=info)
                new = rows_from_results(results, base, leaf_tasks)
                samples = results.get("samples", {})
                for row in new:
                    if row.stderr is None and row.metric in RATIO_METRICS:
                        row.stderr = ratio_stderr(samples.get(row.task), row.metric)
                        row.info["stderr_" + row.metric] = "delta method over documents (specterbench)"
            except KeyboardInterrupt:
                raise
            except Exception as err:  # one variant's failure is its rows', never the run's
                new, samples = error_rows(base, leaf_tasks, err), {}
            elapsed = time.perf_counter() - started
            for row in new:
                row.duration_s = elapsed
                check_row(row, samples.get(row.task), reference, tolerance, near_tie)
                if variant == REFERENCE and row.status == "ok":
                    reference[row.task] = (row, samples.get(row.task) or [])
                rows.append(row)
                if writer is not None:
                    writer(row)
    return rows


def sample_tolerance(engine):
    """The log-likelihood tolerance of one lm-eval sample on ``engine``: the rounding its compute dtype and depth
    allow (:func:`~specterbench.engine.numerics.loglik_tolerance`) over the most tokens any of its requests scores
    (a continuation, or a whole text for rolling log-likelihoods)."""
    layers = int(engine.model.config.num_hidden_layers)
    encode = engine.tokenizer.encode

    def scored_tokens(args) -> int:
        if len(args) == 1 and isinstance(args[0], str):  # loglikelihood_rolling: the text
            return len(encode(args[0])) + 1
        if len(args) == 2 and isinstance(args[1], str):  # loglikelihood: the continuation
            return len(encode(args[1]))
        return 1

    def tolerance(sample) -> float:
        tokens = max((scored_tokens(tuple(a)) for a in sample.get("arguments") or ()), default=1)
        return loglik_tolerance(engine.compute_dtype, layers, tokens)

    return tolerance


def routing_near_tie(engine, margins: dict):
    """Whether the reference's routing came within the rounding tolerance of a tie while scoring an lm-eval sample
    (its smallest router top-k margin over the sample's requests, recorded by the reference variant)."""
    tol = margin_tolerance(engine.compute_dtype, int(engine.model.config.num_hidden_layers))

    def near_tie(sample) -> bool:
        return any(margins.get(tuple(a), math.inf) < tol for a in sample.get("arguments") or ()
                   if all(isinstance(x, str) for x in a))  # scored requests; generation's arguments hold a dict

    return near_tie


def draft_variants(drafts: tuple[dict, ...] | None, default: dict) -> list[tuple[str, str, dict]]:
    """``(row variant, lm variant, options)`` of each draft-alone row."""

    if not drafts:
        return [(DRAFT, DRAFT, default)]
    if len(drafts) == 1:
        return [(DRAFT, DRAFT, dict(drafts[0]))]
    def label(opts):
        dense = opts.get("dense_bits", 16)
        return QuantSpec.from_options(opts).label() + (f"+d{dense}" if int(dense) != 16 else "")

    return [(f"{DRAFT} {label(opts)}", DRAFT, dict(opts)) for opts in drafts]


