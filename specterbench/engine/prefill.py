"""The per-layer prefill policy: where a prompt's forward runs each MoE layer's missing experts.

A request's prefill routes many tokens through each MoE layer, so the choice is made per layer, not per expert. A
strategy returns one of three policies from :meth:`~specterbench.strategy.Strategy.prefill_layer`:

- :data:`DEVICE` — cached experts on the device; each miss placed by ``place_miss`` (fetched on demand, evicting
  as the strategy chooses, or on the host): today's behaviour, and the default of a strategy that does not opt in;
- :data:`STREAM` — every missing routed expert copied through a staging area (the cache's free bytes, bounded,
  never evicting the warmed cache), computed in the layer's grouped op, and dropped once the layer has run; misses
  the staging area has no room for run on the host;
- :data:`HOST` — every missing routed expert computed on the host CPU, where its weights are; cached experts still
  run on the device beside it.

The default (:func:`layer_policy`, ``engine.costs.prefill_policy``) is the MoE-aware threshold made explicit: for a
layer whose missing experts ``M`` receive ``n_e`` tokens each it prices, with the cost model's rates,

    host_s   = host_backlog + sum_e host_expert_s(n_e)
    stream_s = link_backlog + |M| * copy_s + experts_grouped_s([n_e for e in M])
    device_s = stream_s                       (a strategy that fetches every miss: the same copies, each evicting)
    device_s = max(host_end, link_end + experts_grouped_s(fetched))   (a ``hybrid`` strategy: each miss, in
               routing order, to whichever of host and link hands it back first, ``host_or_fetch``'s rule with
               both queues advanced: the two resources work side by side)

and picks the smallest; a tie goes to HOST (no copy), then STREAM (no eviction); STREAM only where the staging area
holds all of ``M`` (else it is not offered).
The host's price grows with the tokens each expert serves, the copy's does not: short prompts (a few tokens per
expert) stay on the host, long ones copy — the token threshold of llama.cpp's op offload, scaled by ``experts /
top_k``, falls out of the two rates rather than being a constant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine

DEVICE = "device"
STREAM = "stream"
HOST = "host"
POLICIES = (DEVICE, STREAM, HOST)


class LayerPolicy(NamedTuple):
    """:func:`layer_policy`'s answer: the policy, its misses, and the three modeled finish times (s)."""

    policy: str
    misses: int
    host_s: float
    stream_s: float
    staging_room: bool
    device_s: float = 0.0


def split_s(engine: "Engine", missing: Sequence[int]) -> float:
    """When a hybrid placement of ``missing`` (token counts, routing order) finishes: each to the host or the link,
    whichever hands it back first with both queues as the placements before it left them."""
    costs = engine.costs
    host, link, fetched = costs.host_backlog_s(), costs.link_backlog_s(), []
    for n in missing:
        on_host = host + costs.host_expert_s(n)
        if on_host < link + costs.copy_s() + costs.expert_in_layer_s(n):
            host = on_host
        else:
            link += costs.copy_s()
            fetched.append(n)
    return max(host, link + (costs.experts_grouped_s(fetched) if fetched else 0.0))


def layer_policy(engine: "Engine", layer: int, experts: Sequence[int], tokens_per_expert: Sequence[int],
                 hybrid: bool = False) -> LayerPolicy:
    """The cheapest policy for MoE ``layer`` of the running forward (see the module's formula); ``hybrid``: the
    strategy places DEVICE's misses by the hybrid rule, so DEVICE is priced as that split."""
    costs, cache = engine.costs, engine.cache
    missing = [n for e, n in zip(experts, tokens_per_expert) if (layer, e) not in cache]
    if not missing:
        return LayerPolicy(DEVICE, 0, 0.0, 0.0, True)
    stream_s = costs.link_backlog_s() + len(missing) * costs.copy_s() + costs.experts_grouped_s(missing)
    room = cache.free_bytes >= len(missing) * engine.expert_bytes
    if costs.model.host is None:  # no host profile: the host cannot be priced, so it is not offered
        return LayerPolicy(STREAM if room else DEVICE, len(missing), float("inf"), stream_s, room, stream_s)
    host_s = costs.host_backlog_s() + sum(costs.host_expert_s(n) for n in missing)
    device_s = split_s(engine, missing) if hybrid else stream_s
    options = [(host_s, 0, HOST), (device_s, 2, DEVICE)] + ([(stream_s, 1, STREAM)] if room else [])
    return LayerPolicy(min(options)[2], len(missing), host_s, stream_s, room, device_s)


def drop_streamed(engine: "Engine") -> None:
    """After a streamed layer has run: its staged experts leave the cache (their bytes are free again)."""
    for key in engine.streamed:
        if key in engine.cache:
            engine.evict(key)
    engine.streamed = []
