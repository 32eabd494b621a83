"""Rows of ``specterbench eval``: one :class:`EvalRow` per (model, variant, task), built from lm-eval's results,
and the per-sample comparison with the reference that decides a row's ``check`` and ``status``."""

from __future__ import annotations

import dataclasses
import json
import traceback
from dataclasses import dataclass, field

from specterbench.errors import SpecterbenchError

EVAL_SCHEMA_VERSION = 1
DEFAULT_BUDGET = "50%"
DEFAULT_BOOTSTRAP_ITERS = 1000  # stderr of perplexity-type metrics is bootstrapped; lm-eval's 100000 is slow
REFERENCE, DRAFT = "reference", "draft"


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


@dataclass(frozen=True, slots=True)
class SampleComparison:
    """How a variant's samples compare with the reference's: ``bit_identical`` of ``total`` raw outputs equal to the
    last bit; ``beyond`` differ by more than the numerics tolerance (``first``: the first such doc); ``agreement``: the
    share of decisions (chosen option, filtered answer) that agree."""

    total: int
    bit_identical: int
    beyond: int
    first: object
    agreement: float | None
    routing_near_ties: int = 0  # differing beyond the smooth bound where the reference's routing was a near-tie

    @property
    def within_numerics(self) -> int:
        return self.total - self.bit_identical - self.beyond


def _within(a, b, tol: float) -> bool:
    """Raw outputs equal, numbers within ``tol`` (log-likelihoods), anything else exactly."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_within(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= tol
    return a == b


def compare_samples(samples, reference, tolerance=None, near_tie=None) -> SampleComparison:
    """Two runs' per-sample outputs. Raw outputs (``resps``: every log-likelihood, the whole generated text) are
    compared bit for bit and, where they differ, within ``tolerance(sample)`` (the log-likelihood tolerance of the
    reference sample's scored tokens, :func:`specterbench.engine.numerics.loglik_tolerance`; None: exactly);
    generated text and greedy flags always exactly. ``near_tie(sample)``: the reference's routing came near a tie
    while scoring it — a difference beyond the bound is then numerics too, counted apart. Decisions come from
    ``filtered_resps``."""
    mine, ref = _by_doc(samples), _by_doc(reference)
    identical = beyond = ties = 0
    first = None
    agree = decided = 0
    for doc_id in sorted(set(mine) | set(ref), key=str):
        a, b = mine.get(doc_id), ref.get(doc_id)
        if a is not None and b is not None and _plain(a.get("resps")) == _plain(b.get("resps")):
            identical += 1
        elif a is None or b is None or not _within(a.get("resps"), b.get("resps"),
                                                   tolerance(b) if tolerance is not None else 0.0):
            if a is not None and b is not None and near_tie is not None and near_tie(b):
                ties += 1
            else:
                beyond += 1
                first = doc_id if first is None else first
        if a is not None and b is not None:
            da, db = _decision(a), _decision(b)
            if da is not None and db is not None:
                decided += 1
                agree += da == db
    return SampleComparison(len(set(mine) | set(ref)), identical, beyond, first,
                            agree / decided if decided else None, ties)


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


RATIO_METRICS = ("bits_per_byte", "byte_perplexity", "word_perplexity")  # lm-eval reports no stderr for these


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
    if n < 2 or metric not in RATIO_METRICS:
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


def error_rows(base: dict, leaf_tasks: list[str], err: BaseException) -> list[EvalRow]:
    message = f"{type(err).__name__}: {' '.join(str(err).split())}"
    rows = []
    for task in leaf_tasks:
        row = EvalRow(**base, task=task, status="error", error=message, check="-")
        if not isinstance(err, SpecterbenchError):
            row.info["traceback"] = traceback.format_exc(limit=8)
        rows.append(row)
    return rows


def check_row(row: EvalRow, samples, reference: dict, tolerance=None, near_tie=None) -> None:
    """Fill ``delta`` and ``check`` against the reference. A lossless variant passes when every sample equals the
    reference's within numerics (``tolerance``: see :func:`compare_samples`); the check says how many were
    bit-identical. One sample beyond the tolerance fails the row."""
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
    c = compare_samples(samples, ref_samples, tolerance, near_tie)
    row.info["samples_bit_identical"] = c.bit_identical
    row.info["samples_within_numerics"] = c.within_numerics
    row.info["samples_at_routing_near_ties"] = c.routing_near_ties
    if row.lossless:
        if c.beyond:
            row.status = "mismatch"
            row.check = f"MISMATCH {c.beyond}/{c.total} samples beyond numerics (first doc {c.first})"
            row.error = (f"{row.variant} is lossless but {c.beyond} of {c.total} samples of {row.task} differ from "
                         f"the reference by more than the numerics tolerance (first: doc {c.first})")
        elif c.within_numerics:
            ties = f", {c.routing_near_ties} at a routing near-tie" if c.routing_near_ties else ""
            row.check = f"equal within numerics ({c.total} samples, {c.bit_identical} bit-identical{ties})"
        else:
            row.check = f"identical ({c.total} samples)"
        return
    if c.beyond == 0 and c.within_numerics == 0:
        row.check = f"identical ({c.total} samples)"
    elif c.agreement is not None:
        row.check = f"lossy: {c.agreement:.1%} of decisions agree"
    else:
        row.check = f"lossy: {c.beyond + c.within_numerics}/{c.total} samples differ"
