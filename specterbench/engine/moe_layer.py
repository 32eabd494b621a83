"""One offloaded MoE layer, in its four phases.

1. :func:`place`   — hits and misses: each routed expert is a hit, or a miss the strategy places (fetch it, run it
   on the host, or substitute it); fetches are queued at demand priority.
2. :func:`run_elsewhere` — misses placed on the host start first (they run beside the device) and substitutes run.
3. :func:`run_on_device` — the device experts are acquired (landed copies first, then in order of arrival) and run
   as **one grouped op** over the cache's slot pool (:func:`grouped_experts`: one grouped GEMM per projection, tokens
   grouped on the device). Only when the cache cannot hold the layer's device experts at once do they run one by
   one (the per-expert path), misses fetched as soon as a computed expert frees a place; a quantized target's
   experts always do (their slots hold packed weights, which no grouped kernel reads: each is dequantized into the
   engine's scratch and multiplied there).
4. :func:`combine` — every routing's expert output, weighted by its routing weight and summed per token.

The host learns the layer's routing once (:func:`specterbench.engine.routing.group_tokens`); no phase synchronises
with the device per expert.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from specterbench.engine.cache import FETCH, ON_HOST, SUBSTITUTE, ExpertKey, Slot
from specterbench.engine.kernels import LaunchCounter, section
from specterbench.engine.packing import PackedWeight
from specterbench.engine.pool import SlotPool
from specterbench.engine.prefill import DEVICE, STREAM
from specterbench.engine.routing import TokenGroups, group_tokens
from specterbench.engine.scheduler import DEMAND_PRIORITY, CopyScheduler
from specterbench.errors import BudgetError, EngineViolation

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine


def expert_forward(weights, act_fn, x, scale=None, scratch=None):  # x [n, H], scale [n, 1] or None -> [n, H]
    """One expert over its tokens: the per-expert path. ``weights``: two tensors, or two packed weights
    (:class:`~specterbench.engine.packing.PackedWeight`, a quantized target) computed by their kernel — dequantized
    into ``scratch`` (a flat buffer of ``x``'s dtype, reused) and multiplied there."""
    gate_up, down = weights
    if isinstance(gate_up, PackedWeight):
        gate, up = gate_up.linear(x, scratch).chunk(2, dim=-1)
        y = down.linear(act_fn(gate) * up, scratch)
    else:
        gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
        y = F.linear(act_fn(gate) * up, down)
    return y if scale is None else y * scale


_HOST = threading.local()


def host_scratch(weights, dtype: torch.dtype) -> torch.Tensor | None:
    """A host thread's reused scratch for a packed expert's weights (None for 16-bit weights)."""
    if not isinstance(weights[0], PackedWeight):
        return None
    elems = max(w.scratch_elems() for w in weights)
    buf = getattr(_HOST, "scratch", None)
    if buf is None or buf.numel() < elems or buf.dtype != dtype:
        buf = _HOST.scratch = torch.empty(elems, dtype=dtype)
    return buf


def host_weights(engine: "Engine", key: ExpertKey):
    """Expert ``key`` as the host computes it: its store tensors in the compute dtype, or (packed) the store's own
    packed weights, dequantized per call into the host thread's scratch."""
    weights = engine.store.weights[key]
    if engine.store.packed:
        return weights
    return tuple(w.to(engine.compute_dtype) for w in weights)


def count_packed_launches(engine: "Engine") -> tuple[int, int]:
    """(launches once per layer, launches per expert) of a quantized target's per-expert path — gather an expert's
    token rows, :func:`expert_forward` from its packed weights, the combine — counted on the engine's own kernels
    (two of the store's experts on its device, one token routed to one, then to two), as the draft counts its own
    (:meth:`~specterbench.engine.draft.QuantizedExperts._count_launches`)."""

    store, dev, dtype = engine.store, engine.device, engine.compute_dtype
    pairs = [tuple(w.over([p.to(dev) for p in w.parts()]) for w in store.weights[(0, e)]) for e in (0, 1)]
    scratch = torch.empty(max(w.scratch_elems() for w in pairs[0]), dtype=dtype, device=dev)
    hidden = torch.zeros(1, store.shapes[0][1], dtype=dtype, device=dev)  # [1, H]
    counts = []
    with torch.inference_mode():
        for k in (1, 1, 2):  # the first call builds the unpacking tables and is not counted
            idx = torch.arange(k, device=dev).view(1, k)  # [1, k]
            w = torch.full((1, k), 1.0 / k, dtype=dtype, device=dev)
            with LaunchCounter() as counter:
                groups = group_tokens(idx, w, store.num_experts)
                outputs = {}
                for e in groups.experts:
                    token_idx, _ = groups.of(e)
                    outputs[e] = expert_forward(pairs[e], F.silu, hidden[token_idx], scratch=scratch)
                combine(hidden, groups, None, outputs)
            counts.append(counter.total)
    per_expert = counts[2] - counts[1]
    return counts[1] - per_expert, per_expert


def grouped_experts(pool: SlotPool, layer: int, act_fn, hidden, top_k_index, top_k_weights, *, combine: bool,
                    window: tuple[int, int], partial: bool):
    """Every routing of one layer through the experts in ``pool`` as one op of a fixed number of launches whatever
    T and top-k (:data:`~specterbench.engine.kernels.EXPERT_OP_LAUNCHES` of the pool's ``mode``):

    - ``grouped``: routings sorted by slot, one ``F.grouped_mm`` per projection over the pool's slots ``window``
      (lowest, highest slot the layer uses) — the GPU path, where a grouped GEMM reads each expert once;
    - ``gathered``: each routing's slot weights gathered, one batched GEMM per projection — the CPU path, whose
      grouped GEMM walks every group in the window on the host (O(slots), not O(routings)).

    ``hidden`` [T, H], ``top_k_index``/``top_k_weights`` [T, k]. ``partial``: some routed experts hold no slot
    (they run elsewhere): their rows are left for the caller to overwrite. ``combine``: return the layer's output
    [T, H]; else the unweighted outputs [T * k, H] in routing order (row ``t * k + j``: token ``t``'s ``j``-th).
    """
    T, k = top_k_index.shape
    slots = pool.table[layer][top_k_index]  # [T, k]: each routing's slot (pool.slots: none)
    if pool.mode == "gathered":
        if partial:
            slots = slots.clamp(max=pool.slots - 1)  # rows of experts without a slot compute anything
        h = torch.matmul(pool.gate_up[slots], hidden[:, None, :, None]).squeeze(-1)  # [T, k, 2I]
        gate, up = h.chunk(2, dim=-1)
        y = torch.matmul(pool.down[slots], (act_fn(gate) * up).unsqueeze(-1)).squeeze(-1)  # [T, k, H]
        if combine:
            return torch.matmul(top_k_weights.unsqueeze(1).to(y.dtype), y).squeeze(1)  # [T, H]
        return y.reshape(T * k, -1)  # [T*k, H]
    lo, hi = window
    sorted_slots, order = torch.sort(slots.reshape(-1), stable=True)  # [T*k], [T*k]: routings grouped by slot
    x = hidden.expand(k, hidden.shape[1]).contiguous() if T == 1 else hidden[order // k]  # [T*k, H]
    offs = torch.searchsorted(sorted_slots, pool.group_ends[lo:hi + 1], right=True, out_int32=True)  # group ends
    h = F.grouped_mm(x, pool.gate_up[lo:hi + 1].transpose(1, 2), offs=offs)  # [T*k, 2I]
    gate, up = h.chunk(2, dim=-1)
    y = F.grouped_mm(act_fn(gate) * up, pool.down[lo:hi + 1].transpose(1, 2), offs=offs)  # [T*k, H]
    if combine and T == 1:
        w = top_k_weights.reshape(-1)[order].to(y.dtype)  # [k]: weights in slot order
        return torch.mm(w.unsqueeze(0), y)  # [1, H]
    rows = torch.empty_like(y).index_copy_(0, order, y)  # [T*k, H] back in routing order
    if combine:
        return torch.bmm(top_k_weights.unsqueeze(1).to(rows.dtype), rows.view(T, k, -1)).squeeze(1)  # [T, H]
    return rows


def place(engine: "Engine", layer: int, groups: TokenGroups, policy: str = DEVICE) -> dict[ExpertKey, str]:
    """Phase 1: count hits and misses, ask the strategy where each miss runs, queue demand fetches. Returns the
    misses that run off the device (host or substitute). A prefill ``policy`` (:mod:`specterbench.engine.prefill`)
    other than DEVICE places every miss itself: HOST on the host, STREAM copied into free bytes (the host where
    none are left)."""
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
        if policy == DEVICE:
            where = strategy.place_miss(key, n)
        elif policy == STREAM and cache.free_bytes >= engine.expert_bytes:
            where = FETCH
            engine.streamed.append(key)
            stats.streamed_experts += 1
        else:
            where = ON_HOST
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
    """Phase 2: start the host experts (their results are joined after the device's) and run substitutes (their
    unweighted outputs [n, H] go to ``outputs[expert]``). Returns the host jobs."""
    clock, stats, costs = engine.clock, engine.stats, engine.clock.costs
    engine.host_placed_s = 0.0  # placed experts become the clock's host jobs now
    jobs = []
    for key, where in elsewhere.items():
        token_idx, _ = groups.of(key[1])
        n = len(token_idx)
        if where == ON_HOST:
            weights = host_weights(engine, key)
            job = clock.run_on_host(lambda x, w=weights: expert_forward(w, act_fn, x, scratch=host_scratch(w, x.dtype)),
                                    costs.host_expert(n), engine.host_threads, hidden[token_idx])
            jobs.append((key, job))
            stats.host_experts += 1
            stats.host_expert_tokens += n
            stats.activation_bytes += 2 * n * hidden.shape[1] * hidden.element_size()  # down and back
        else:
            weights, ratio, *kernel = engine.strategy.substitute(key)  # kernel: optional (a LowBitKernel)
            outputs[key[1]] = expert_forward(weights, act_fn, hidden[token_idx])  # [n, H], unweighted
            clock.compute(*costs.expert(n, ratio, kernel[0] if kernel else None))
            stats.substituted += 1
    return jobs


def run_on_device(engine: "Engine", layer: int, groups: TokenGroups, elsewhere, act_fn, hidden, outputs):
    """Phase 3: the layer's device experts as one grouped op over the slot pool once each has landed; the result
    for :func:`combine` (or, for one token with nothing from elsewhere, the layer's output [1, H])."""
    cache, pending = engine.cache, engine._pending
    keys = [(layer, e) for e in groups.experts if (layer, e) not in elsewhere]
    order = sorted(keys, key=lambda k: _arrival_rank(engine, k))
    if not order:
        return None
    if engine.pool.mode == "packed" or len(order) * engine.expert_bytes > cache.capacity_bytes:
        _run_one_by_one(engine, order, groups, act_fn, hidden, outputs)
        return None
    try:
        for key in order:
            acquire(engine, key)
            cache.busy.add(key)
        with section("experts"):
            whole = not elsewhere
            indices = [cache.get(key).index for key in order]
            result = grouped_experts(engine.pool, layer, act_fn, hidden, groups.top_k_index, groups.top_k_weights,
                                     combine=whole, window=(min(indices), max(indices)), partial=bool(elsewhere))
        engine.clock.compute(*engine.clock.costs.experts_grouped(
            [n for e, n in zip(groups.experts, groups.tokens_per_expert) if (layer, e) not in elsewhere]))
        engine.stats.expert_computes += len(order)
    finally:
        cache.busy.clear()
    pending.difference_update(order)
    return ("whole", result) if whole else result


def _run_one_by_one(engine: "Engine", order, groups: TokenGroups, act_fn, hidden, outputs) -> None:
    """The per-expert path, for a layer whose device experts do not fit the cache at once: landed copies first, then
    in order of arrival; misses that found no room are fetched as soon as a computed expert frees a place."""
    cache, clock, stats, costs, pending = engine.cache, engine.clock, engine.stats, engine.clock.costs, engine._pending
    if engine.pool.mode == "packed":  # the layer's own launches (routing read, combine), counted with the experts'
        clock.compute(*costs.target_layer())
    deferred = [k for k in order if k not in cache]
    for key in order:
        while deferred and (deferred[0] in cache or engine._fetch(
                deferred[0], DEMAND_PRIORITY, prefetched=False, protect=pending) is not None):
            deferred.pop(0)
        slot = acquire(engine, key)
        cache.in_use = key
        token_idx, _ = groups.of(key[1])
        outputs[key[1]] = expert_forward(slot.weights, act_fn, hidden[token_idx],  # [n, H], unweighted
                                         scratch=engine.scratch)
        clock.compute(*costs.expert(len(token_idx)))
        stats.expert_computes += 1
        cache.in_use = None
        pending.discard(key)


def join_host(engine: "Engine", jobs, hidden, outputs) -> None:
    """End of phase 3: the host's results (pinned buffers on a measured CUDA clock) come back to the device without
    blocking the host."""
    if not jobs:
        return
    engine.clock.wait_host([job for _, job in jobs])
    for key, job in jobs:
        outputs[key[1]] = job.result.to(hidden.device, non_blocking=True)


def combine(hidden, groups: TokenGroups, device_result, outputs) -> torch.Tensor:
    """Phase 4: the layer's output [T, H]: each token's expert outputs weighted by its routing weights. Outputs
    computed one expert at a time (``outputs[expert]`` [n, H]) take their routings' rows."""
    if isinstance(device_result, tuple):  # the grouped op combined already
        return device_result[1]
    T, k = groups.top_k_index.shape
    rows = device_result if device_result is not None else hidden.new_empty(T * k, hidden.shape[1])  # [T*k, H]
    for e, y in outputs.items():
        pos = torch.tensor(groups.flat_positions(e), dtype=torch.long, device=hidden.device)  # [n]
        rows.index_copy_(0, pos, y.to(rows.dtype))
    w = groups.top_k_weights.to(rows.dtype).unsqueeze(1)  # [T, 1, k]
    return torch.bmm(w, rows.view(T, k, -1)).squeeze(1)  # [T, H]


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
    engine.clock.wait(slot.transfer)  # the compute stream waits for the copy (the pool's rows are never freed)
    if not slot.used:
        slot.used = True
        if slot.prefetched:
            engine.stats.prefetch_used += 1
    cache.touch(key)
    return slot
