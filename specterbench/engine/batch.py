"""Several requests decoding together: one batched forward per step.

B requests of equal prompt length decode in lock step. Each step is one forward over ``input_ids`` [B, T] with one
KV cache holding every request's own rows (attention per request: no request sees another's positions, and no
padding is needed since every request has the same length at every step). Each MoE layer runs once over all B·T
tokens of the step: the strategy sees the step's routing of all of them (``engine.routing`` rows request-major,
row ``b·T + t``), each routed expert is placed once for the union of the requests' routings, and the grouped op runs
every expert over the tokens routed to it. The modeled clock prices the dense layers' weights once per step, each
request's KV read by its own attention, and a batched expert by what bounds it at its token count (its weights'
read or its FLOPs, :meth:`~specterbench.engine.costs.CostModel.op_seconds`).

Each request keeps its own sampler (noise keyed by request and position), so its tokens are the ones it would get
decoding alone. One :class:`~specterbench.engine.stats.StepSample` is recorded per step: every request received one
token at that time (:func:`per_request_samples` gives each request its view).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

import torch

from specterbench.engine.stats import StepSample
from specterbench.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine
    from specterbench.strategy import Request


def check_batch(requests: Sequence["Request"]) -> None:
    """A batch is non-empty, of one prompt length and one number of new tokens (one line otherwise)."""
    if not requests:
        raise UsageError("a batch needs at least one request")
    lengths = {len(r.prompt_ids) for r in requests}
    if len(lengths) != 1:
        raise UsageError(f"the requests of a batch have prompts of {sorted(lengths)} tokens; cut them to one length "
                         f"(the runner cuts a batch's prompts to its shortest)")
    if len({r.max_new_tokens for r in requests}) != 1:
        raise UsageError("the requests of a batch ask for different numbers of new tokens; give them one")


def begin_batch(engine: "Engine", requests: Sequence["Request"]) -> None:
    """Start a batch: the clock settles, the step samples restart, and the strategy hears of every request (in
    batch order) through :meth:`~specterbench.Strategy.on_request_start`."""
    check_batch(requests)
    engine.begin_request(requests[0])
    for request in requests[1:]:
        engine.strategy.on_request_start(request)


def decode_batch(engine: "Engine", requests: Sequence["Request"], samplers=None) -> list[list[int]]:
    """Decode ``requests`` together, one token for each per batched forward; each request's tokens chosen by its
    own sampler (default: a fresh ``request.sampler()``). Returns the tokens of each request, in batch order.

    The strategy's :meth:`~specterbench.Strategy.on_step_start` receives the step's B·T tokens and
    :meth:`~specterbench.Strategy.on_step_end` the step's new token of every request, in batch order."""
    check_batch(requests)
    samplers = samplers if samplers is not None else [r.sampler() for r in requests]
    B = len(requests)
    position = len(requests[0].prompt_ids)  # absolute position of the next token, the same for every request
    kv = engine.new_kv_cache()
    engine.batch = B
    try:
        logits = engine._forward(torch.tensor([list(r.prompt_ids) for r in requests]), kv)  # [B, 1, V]
        tokens = [[s.pick(logits[b, -1].float(), position)] for b, s in enumerate(samplers)]
        engine.emit(1)
        engine.strategy.on_step_end([t[-1] for t in tokens])
        while len(tokens[0]) < requests[0].max_new_tokens:
            logits = engine._forward(torch.tensor([[t[-1]] for t in tokens]), kv)  # [B, 1, V]
            n = len(tokens[0])
            for b, s in enumerate(samplers):
                tokens[b].append(s.pick(logits[b, -1].float(), position + n))
            engine.emit(1)
            engine.strategy.on_step_end([t[-1] for t in tokens])
    finally:
        engine.batch = 1
    return tokens


def per_request_samples(samples: Sequence[StepSample], batch: int) -> list[list[StepSample]]:
    """Each request's view of a batch's step samples: the same times and stalls (every request waited for every
    step), the step's link bytes shared out evenly (so bytes per token stay bytes over all tokens). A step that
    says how many tokens each request received (``per_request``: a batched speculative window) gives each request
    its own count; a step that gave a request none (it already had all its tokens) is not one of its samples."""
    out: list[list[StepSample]] = [[] for _ in range(batch)]
    for s in samples:
        counts = s.per_request or (s.tokens,) * batch
        for b in range(batch):
            if counts[b]:
                out[b].append(replace(s, tokens=counts[b], h2d_bytes=s.h2d_bytes / batch, per_request=None))
    return out


def step_tokens(sample: StepSample, batch: int) -> int:
    """Tokens a batch's step gave all its requests together."""
    return sum(sample.per_request) if sample.per_request is not None else sample.tokens * batch
