"""The batch axis of a run (``--batch 1,2,4,8``): B requests of the workload decode together in each cell.

- **Prompts.** A batch decodes in lock step, so its requests have one prompt length: with a batch axis every prompt
  of the run is cut to the shortest one's tokens before the reference is recorded (so each request's batch-1
  reference is of the same prompt it decodes in a batch). The run decodes ``max(--prompts, largest batch)``
  prompts; a cell at B decodes the first ``⌊P / B⌋ · B`` of them, ``⌊P / B⌋`` batches one after another.
- **KV in the budget.** Each request's KV cache (prompt + new tokens, every real layer, at the priced geometry) is
  charged to the device budget of every cell of a batch axis (B = 1 too, so the axis compares like with like): the
  expert cache gets the budget less B requests' KV. A batch whose KV leaves a strategy less than it needs is refused
  before anything runs, naming the largest batch that fits. ``resident`` (a fixed 100% budget, the reference) is
  not charged.
- **Strategies.** One that declares ``max_batch`` below B gets a row that says so (status ``unsupported``), not an
  error; the others decode through :meth:`~specterbench.Strategy.generate_batch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from specterbench.bench.budget import Budget
from specterbench.bench.device_memory import kv_bytes_per_token
from specterbench.engine.batch import begin_batch, per_request_samples, step_tokens
from specterbench.errors import BudgetError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine
    from specterbench.runfiles.results import ResultRow

UNSUPPORTED = "unsupported"  # a row's status: the strategy does not decode this many requests together


def parse_batches(text: str) -> tuple[int, ...]:
    """``1,2,4,8`` → (1, 2, 4, 8), each a positive integer, each once, in the order given."""
    out: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"--batch {part!r} is not a batch size; give positive integers, e.g. --batch 1,4,16")
        if int(part) not in out:
            out.append(int(part))
    if not out:
        raise UsageError("--batch is empty; give batch sizes, e.g. --batch 1,4,16")
    return tuple(out)


def run_prompts(prompts: int, batches: Sequence[int]) -> int:
    """How many prompts a run with this batch axis decodes: enough for its largest batch (a non-positive count is
    left as given, for the config's own check to refuse)."""
    return max([prompts, *batches]) if prompts > 0 else prompts


def check_batches(batches: Sequence[int], workload: str, available: int) -> None:
    """Every batch within the workload's prompts (one line naming the largest that it holds)."""
    over = [b for b in batches if b > available]
    if over:
        raise UsageError(f"--batch {max(over)} is more than workload {workload!r} holds ({available} prompts); use "
                         f"--batch {available} or less")


def cut_to_shortest(prompts: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
    """Every prompt cut to the shortest one's tokens (a batch decodes requests of one length)."""
    n = min(len(ids) for _, ids in prompts)
    return [(pid, ids[:n]) for pid, ids in prompts]


def kv_bytes(engine: "Engine", batch: int, context: int) -> tuple[int, int]:
    """``(priced, charged)``: the KV cache of ``batch`` requests of ``context`` positions at the priced geometry,
    and the same share of the engine's own expert bytes (what the cell's budget is counted in)."""
    g = engine.geometry
    priced = kv_bytes_per_token(g) * context * batch
    return priced, int(priced * engine.total_expert_bytes / g.all_expert_bytes)


def charged_kv(runner, engine: "Engine", cls, budget: Budget, batch: int, context: int) -> tuple[int, int]:
    """The KV charged to a cell of ``cls`` at ``batch``: none without a batch axis, none for a fixed budget, none
    for a card's memory (``--gpu-memory``: its plan holds the KV of the run's largest batch already)."""
    if runner.config.batches == (1,) or cls.fixed_budget_fraction is not None or budget.card_bytes is not None:
        return 0, 0
    return kv_bytes(engine, batch, context)


def check_fit(runner, engine: "Engine", prompts) -> None:
    """Before any long pass: every budget of the run, less the KV of each batch, still holds what each strategy
    needs (one line naming the largest batch that fits otherwise)."""
    cfg = runner.config
    if cfg.batches == (1,):
        return
    context = len(prompts[0][1]) + cfg.tokens
    total = engine.total_expert_bytes
    for name in cfg.strategies:
        cls = runner.host.strategies().get(name)
        if cls.fixed_budget_fraction is not None:
            continue
        options = dict(cfg.strategy_options.get(name, {}))
        floor = cls.min_budget(engine, options)
        for budget in runner.budgets:
            if budget.card_bytes is not None:  # a card's plan holds the largest batch's KV (refused there)
                continue
            nbytes = budget.resolve(total)
            for batch in sorted(cfg.batches):
                priced, charged = kv_bytes(engine, batch, context)
                if holds(cls, engine, nbytes - charged, floor, options):
                    continue
                fits = [b for b in range(1, batch)
                        if holds(cls, engine, nbytes - kv_bytes(engine, b, context)[1], floor, options)]
                largest = f"the largest that fits is --batch {max(fits)}" if fits else "no batch fits"
                raise BudgetError(f"--batch {batch} does not fit budget {budget.text} for {name}: the KV cache of "
                                  f"{batch} request(s) of {context} positions ({priced / 2**20:.1f} MiB at "
                                  f"{engine.geometry.name}) leaves {(nbytes - charged) / total:.1%} of expert bytes, "
                                  f"less than it needs (at least {floor / total:.1%}, and any draft it keeps); "
                                  f"{largest}, or raise the budget")


def holds(cls, engine: "Engine", nbytes: int, floor: int, options: dict) -> bool:
    """Whether ``nbytes`` (a budget less the KV) holds what ``cls`` needs: its floor, and what its own
    :meth:`~specterbench.Strategy.check_budget` asks (a draft it keeps on the device)."""
    if nbytes < floor:
        return False
    try:
        cls.check_budget(engine, nbytes, options)
    except BudgetError:
        return False
    return True


def batch_cells(runner, model: str):
    """The runner's cells with the batch axis: ``(key, strategy, class, budget, repeat, batch)``; a cell key gains
    ``b<B>`` only when the run has a batch axis (keys of runs without one are unchanged)."""
    batches = runner.config.batches
    for key, sname, cls, budget, repeat in runner.cells(model):
        for batch in batches:
            yield (key if batches == (1,) else f"{key}|b{batch}"), sname, cls, budget, repeat, batch


def unsupported(row: "ResultRow", cls, batch: int) -> bool:
    """Mark ``row`` unsupported when ``cls`` declares a smaller ``max_batch`` than ``batch``; True then."""
    if cls.max_batch is None or batch <= cls.max_batch:
        return False
    row.status = UNSUPPORTED
    why = f" ({cls.max_batch_reason})" if cls.max_batch_reason else ""
    row.error = (f"{cls.name} decodes at most {cls.max_batch} request(s) together{why}; not run at batch {batch} "
                 f"(its batch-{cls.max_batch} row is its figure)")
    return True


def decode_cell(engine: "Engine", strategy, prompts, request, batch: int):
    """A cell's measured requests (``request(pid, ids)`` makes one): one at a time through
    :meth:`~specterbench.Strategy.generate` at batch 1, else :func:`decode_batches`. Returns (tokens per request id,
    each request's samples, the steps' samples of each batch)."""
    if batch > 1:
        return decode_batches(engine, strategy, [request(pid, ids) for pid, ids in prompts], batch)
    outputs, samples = {}, []
    for pid, ids in prompts:
        engine.begin_request(request(pid, ids))
        outputs[pid] = tuple(strategy.generate(engine, request(pid, ids)))
        samples.append(list(engine.samples))
    return outputs, samples, samples


def decode_batches(engine: "Engine", strategy, requests, batch: int):
    """Decode ``requests`` ``batch`` at a time (full batches only). Returns (tokens per request id, each request's
    samples, each batch's step samples)."""
    outputs, per_request, steps = {}, [], []
    for i in range(0, len(requests) - batch + 1, batch):
        group = requests[i:i + batch]
        begin_batch(engine, group)
        for request, tokens in zip(group, strategy.generate_batch(engine, group)):
            outputs[request.id] = tuple(tokens)
        per_request.extend(per_request_samples(engine.samples, batch))
        steps.append(list(engine.samples))
    return outputs, per_request, steps


def budget_less_kv(budget: Budget, total: int, charged: int) -> int:
    """The expert cache's share of a budget once the KV is charged to it."""
    return budget.resolve(total) - charged


def _pct(xs, q: float):
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def fill_batch_metrics(row: "ResultRow", engine: "Engine", steps, batch: int) -> None:
    """The row's batch figures: ``steps`` holds each batch's step samples (each request's own at batch 1). Per
    decode step (the prefill apart): distinct experts per MoE layer, routings per activated expert, link bytes;
    tokens per second over all requests and per user; the per-request TPOT's 99th percentile."""
    st = engine.stats
    row.batch = batch
    if st.decode_layer_calls:
        row.distinct_experts_per_step = st.decode_distinct_experts / st.decode_layer_calls
        row.tokens_per_expert = st.decode_routings / st.decode_distinct_experts
    decode = [s for group in steps for s in group[1:]]
    seconds = sum(s.wall_s if row.clock == "host" else s.clock_s for s in decode)
    tokens = sum(step_tokens(s, batch) for s in decode)  # every request's, over the batch's time
    link = sum(s.h2d_bytes for s in decode)  # the engine's own step samples: every byte of the step, once
    if decode:
        row.link_bytes_per_step = link / len(decode)
        row.link_bytes_per_token = link / tokens if tokens else None
    row.host_expert_tokens = st.host_expert_tokens
    if seconds > 0:
        row.tokens_per_s_per_user = tokens / batch / seconds
        row.tokens_per_s_total = tokens / seconds
    row.tpot_p99_ms = _pct(row.samples.get("tpot_ms") or [], 0.99)


def unsupported_class(cls, batch: int) -> bool:
    """Whether ``cls`` declares a ``max_batch`` below ``batch`` (its cell is not run)."""
    return cls.max_batch is not None and batch > cls.max_batch
