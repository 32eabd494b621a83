"""One offloaded MoE layer, in its four phases.

1. :func:`place`   — hits and misses: each routed expert is a hit, or a miss the strategy places (fetch it, run it
   on the host, or substitute it); fetches are queued at demand priority.
2. :func:`run_elsewhere` — misses placed on the host start first (they run beside the device) and substitutes run.
3. :func:`run_on_device` — the device computes what has landed first, then in order of arrival; misses that found
   no room are fetched as soon as a computed expert frees a place, so their copies still overlap compute.
4. :func:`combine` — outputs are summed in ascending expert order, so numerics do not depend on the strategy.

Tokens were grouped once per layer (:func:`specterbench.engine.routing.group_tokens`); no phase synchronises
with the device per expert.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from specterbench.engine.cache import ExpertKey, Slot
from specterbench.engine.routing import TokenGroups
from specterbench.engine.scheduler import DEMAND_PRIORITY, CopyScheduler
from specterbench.errors import BudgetError, EngineViolation
from specterbench.plugins.strategy import FETCH, ON_HOST, SUBSTITUTE

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine


def expert_forward(weights, act_fn, x, scale):  # x [n, H], scale [n, 1] -> [n, H]
    gate_up, down = weights
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(act_fn(gate) * up, down) * scale


def place(engine: "Engine", layer: int, groups: TokenGroups) -> dict[ExpertKey, str]:
    """Phase 1: count hits and misses, ask the strategy where each miss runs, queue demand fetches. Returns the
    misses that run off the device (host or substitute)."""
    strategy, cache, stats = engine.strategy, engine.cache, engine.stats
    pending = engine._pending
    elsewhere: dict[ExpertKey, str] = {}
    for e, n in zip(groups.experts, groups.tokens_per_expert):
        key = (layer, e)
        if key in cache:
            stats.hits += 1
            continue
        stats.misses += 1
        strategy.on_miss(key)
        if key in cache:
            continue
        where = strategy.place_miss(key, n)
        if where == FETCH:
            engine._fetch(key, DEMAND_PRIORITY, prefetched=False, protect=pending)
        elif where in (ON_HOST, SUBSTITUTE):
            elsewhere[key] = where
            pending.discard(key)
            if where == ON_HOST:  # the host's queue, as the next placement of this layer sees it
                costs = engine.clock.costs
                engine.host_placed_s += costs.host_seconds(costs.host_expert(n), engine.host_threads)
        else:
            raise EngineViolation(f"strategy {strategy.name!r} placed {key} at {where!r}; use fetch, host or "
                                  f"substitute")
    return elsewhere


def run_elsewhere(engine: "Engine", elsewhere: dict[ExpertKey, str], groups: TokenGroups, act_fn, hidden,
                  outputs: dict) -> list:
    """Phase 2: start the host experts (their results are joined after the device's) and run substitutes.
    Returns the host jobs with the token rows each serves."""
    clock, stats, costs = engine.clock, engine.stats, engine.clock.costs
    engine.host_placed_s = 0.0  # placed experts become the clock's host jobs now
    jobs = []
    for key, where in elsewhere.items():
        token_idx, scale = groups.of(key[1])
        n = len(token_idx)
        if where == ON_HOST:
            host_weights = tuple(w.to(engine.compute_dtype) for w in engine.store.weights[key])
            job = clock.run_on_host(lambda x, s, w=host_weights: expert_forward(w, act_fn, x, s),
                                    costs.host_expert(n), engine.host_threads, hidden[token_idx], scale)
            jobs.append((key, token_idx, job))
            stats.host_experts += 1
            stats.activation_bytes += 2 * n * hidden.shape[1] * hidden.element_size()  # down and back
        else:
            weights, ratio, *kernel = engine.strategy.substitute(key)  # kernel: optional (a LowBitKernel)
            outputs[key[1]] = (token_idx, expert_forward(weights, act_fn, hidden[token_idx], scale))
            clock.compute(*costs.expert(n, ratio, kernel[0] if kernel else None))
            stats.substituted += 1
    return jobs


def run_on_device(engine: "Engine", layer: int, groups: TokenGroups, elsewhere, act_fn, hidden, outputs) -> None:
    """Phase 3: compute every device expert of the layer, landed copies first, then in order of arrival."""
    cache, clock, stats, costs, pending = engine.cache, engine.clock, engine.stats, engine.clock.costs, engine._pending
    keys = [(layer, e) for e in groups.experts if (layer, e) not in elsewhere]
    order = sorted(keys, key=lambda k: _arrival_rank(engine, k))
    deferred = [k for k in order if k not in cache]
    for key in order:
        while deferred and (deferred[0] in cache or engine._fetch(
                deferred[0], DEMAND_PRIORITY, prefetched=False, protect=pending) is not None):
            deferred.pop(0)
        slot = acquire(engine, key)
        cache.in_use = key
        token_idx, scale = groups.of(key[1])
        x = hidden if hidden.shape[0] == 1 else hidden[token_idx]  # [n, H]
        outputs[key[1]] = (token_idx, expert_forward(slot.weights, act_fn, x, scale))
        clock.compute(*costs.expert(len(token_idx)))
        stats.expert_computes += 1
        cache.in_use = None
        pending.discard(key)


def join_host(engine: "Engine", jobs, hidden, outputs) -> None:
    """End of phase 3: the compute stream waits for the host's results; they come back to the device."""
    if not jobs:
        return
    engine.clock.wait_host([job for _, _, job in jobs])
    for key, token_idx, job in jobs:
        outputs[key[1]] = (token_idx, job.result.to(hidden.device))


def combine(hidden, groups: TokenGroups, outputs) -> torch.Tensor:
    """Phase 4: the layer's output [T, H], summed in ascending expert order."""
    out = torch.zeros_like(hidden)  # [T, H]
    for e in groups.experts:
        token_idx, y = outputs[e]
        out.index_add_(0, token_idx, y.to(out.dtype))
    return out


def _arrival_rank(engine: "Engine", key: ExpertKey) -> tuple:
    slot = engine.cache.get(key)
    if slot is None:
        return (3, 0, 0)
    return CopyScheduler.order_key(slot.transfer)


def acquire(engine: "Engine", key: ExpertKey) -> Slot:
    """The landed entry of ``key``, fetching it now if it found no room earlier (sparing experts still to
    compute, forcing an eviction only when nothing else can work); the compute stream waits for its copy."""
    cache, pending = engine.cache, engine._pending
    slot = cache.get(key)
    if slot is None:
        slot = engine._fetch(key, DEMAND_PRIORITY, prefetched=False, protect=pending - {key})
        if slot is None:
            slot = engine._fetch(key, DEMAND_PRIORITY, prefetched=False, protect=(), force=True)
        if slot is None:
            raise BudgetError(f"the expert cache ({cache.capacity_bytes} bytes) cannot hold one expert "
                              f"({engine.expert_bytes} bytes)")
    engine.clock.wait(slot.transfer)
    if not slot.used:
        if engine.device.type == "cuda":  # pragma: no cover - needs CUDA
            for w in slot.weights:  # copied on the copy stream, read on this one: keep the allocator honest
                w.record_stream(torch.cuda.current_stream(engine.device))
        slot.used = True
        if slot.prefetched:
            engine.stats.prefetch_used += 1
    cache.touch(key)
    return slot
