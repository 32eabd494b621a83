"""What the engine counts while it runs: cache and copy totals, one sample per emitted step, recorded routing."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class EngineStats:
    hits: int = 0
    misses: int = 0
    prefetch_issued: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0
    prefetch_cancelled: int = 0
    h2d_bytes: int = 0
    d2h_bytes: int = 0  # evicted experts copied back to the host (lru.swap: engine.use_swap_copies)
    demand_bytes: int = 0
    prefetch_bytes: int = 0
    expert_computes: int = 0
    host_experts: int = 0  # misses computed on the host CPU
    streamed_experts: int = 0  # prefill misses copied through the staging area (STREAM) and dropped after
    staged_experts: int = 0  # prefill copies issued for the next layer before this layer's host experts joined
    staged_unused: int = 0  # of those, guessed experts the next layer did not route to
    activation_bytes: int = 0  # activations sent to and back from the host for those (both directions)
    substituted: int = 0  # misses computed with a strategy's substitute (lossy)
    host_expert_tokens: int = 0  # tokens those host experts computed (each token of each host expert once)
    decode_layer_calls: int = 0  # MoE layers run in decode steps (one new token per request)
    decode_distinct_experts: int = 0  # distinct experts those layers routed to, summed over them
    decode_routings: int = 0  # (token, expert) routings of those layers: tokens times top-k


@dataclass(slots=True)
class StepSample:
    tokens: int
    clock_s: float
    wall_s: float
    stall_s: float = 0.0  # compute-stream stall since the last sample (the first sample of a request: prefill)
    h2d_bytes: int = 0  # host->device bytes the link carried since the last sample
    per_request: tuple[int, ...] | None = None  # a batched step whose requests received different counts: each one's


@dataclass(slots=True)
class RoutingRecorder:
    """Collects routing while enabled: the (layer, experts) trace and per-expert token counts."""

    counts: torch.Tensor
    trace: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
