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

**The next layer's copies, overlapped** (:func:`stage_next`, for a strategy whose
:meth:`~specterbench.strategy.Strategy.prefill_ahead` says so): once layer ``L``'s device experts have run, and
*before* the engine joins ``L``'s host experts, the engine guesses layer ``L + 1``'s routing (its router applied to
``L``'s MoE input, charged as one router op) and issues the copies of the guessed missing experts that the hybrid
rule would fetch (largest token count first, each to the link while a copy issued now lands and computes before the
host, behind its queue, would finish it) — none while the host's experts are DRAM-bound on the share a copy leaves
them (:func:`dram_bound`: every miss, computed on the host or copied, reads its weights from host DRAM once, so then
a copy only takes the host's bytes). Those copies run on the link while the host finishes ``L`` and the device
runs ``L + 1``'s attention, so a prefill's link and host work are pipelined across layers; the clock charges that
overlap only because the copies really are issued earlier (the modeled clock starts a copy when it is issued and the
link is free; host jobs already queued are re-timed against the link's busy intervals, so the copies' share of host
DRAM is paid). Room: under STREAM the copies take free bytes only (this layer's staged experts are dropped first)
and are dropped after layer ``L + 1``; otherwise they evict as a demand fetch does (the strategy chooses), sparing
``L + 1``'s cached experts. A guessed expert ``L + 1`` does not route to is counted in ``stats.staged_unused``.
The host's price grows with the tokens each expert serves, the copy's does not: short prompts (a few tokens per
expert) stay on the host, long ones copy — the token threshold of llama.cpp's op offload, scaled by ``experts /
top_k``, falls out of the two rates rather than being a constant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import torch

from specterbench.engine.scheduler import DEMAND_PRIORITY

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


def dram_bound(engine: "Engine", tokens: Sequence[int]) -> bool:
    """Whether a host expert over the mean of ``tokens`` loses pace while a copy holds the link (by the cost model's
    DRAM sharing rule: its weights read at ``host.mem_bytes_per_s - link_bytes_per_s`` outlast its arithmetic).
    Then every byte a copy reads from host DRAM is a byte the host cannot: copying ahead cannot finish the prefill
    sooner."""
    model = engine.costs.model
    if not tokens or model.host is None:
        return False
    op = model.host_expert(max(1, round(sum(tokens) / len(tokens))))
    alone = model.host_seconds(op, engine.host_threads)
    return model.host_seconds_shared(op, engine.host_threads, float("inf")) > alone


def stage_next(engine: "Engine", layer: int, policy: str, tail_tokens: Sequence[int] = ()) -> int:
    """Layer ``layer``'s device experts have run and its host experts may still be running: issue the copies layer
    ``layer + 1`` will want, by its router's guess over this layer's MoE input (see the module's last paragraph).
    ``policy``: this layer's prefill policy (STREAM: free bytes only, dropped after the next layer); ``tail_tokens``:
    the token counts of this layer's host experts, still running. Nothing is staged while the host's jobs (this
    layer's, or the next layer's by the guess) are DRAM-bound on the share a copy leaves them (:func:`dram_bound`);
    otherwise a guessed miss is copied when that finishes the next layer's experts sooner than leaving it to the
    host: ``max(host, link + copy_s + in_layer_s(n)) < max(host + host_expert_s(n), link)``. Returns the copies
    issued."""
    nxt = layer + 1
    if nxt >= engine.num_layers or engine.current_hidden is None:
        return 0
    guess = engine.router_guess(nxt)  # [T, k] guessed routing, charged as one router op
    counts = torch.bincount(guess.top_k_index.reshape(-1).cpu(), minlength=engine.num_experts).tolist()
    cache, costs, stats = engine.cache, engine.costs, engine.stats
    wanted = sorted(((n, e) for e, n in enumerate(counts) if n), reverse=True)
    if dram_bound(engine, tail_tokens) or dram_bound(engine, [n for n, _ in wanted]):
        engine.staged = []
        return 0
    protect = {(nxt, e) for _, e in wanted if (nxt, e) in cache}
    host, link, issued, copy_s = costs.host_backlog_s(), costs.link_backlog_s(), [], costs.copy_s()
    for n, e in wanted:
        key = (nxt, e)
        if key in cache:
            continue
        on_host = host + costs.host_expert_s(n) if costs.model.host is not None else float("inf")
        if max(host, link + copy_s + costs.expert_in_layer_s(n)) >= max(on_host, link):
            host = on_host  # the host finishes the next layer sooner without this copy
            continue
        if policy == STREAM and cache.free_bytes < engine.expert_bytes:
            break
        if engine._fetch(key, DEMAND_PRIORITY, prefetched=True, protect=protect) is None:
            break  # no room the strategy would give
        protect.add(key)
        issued.append(key)
        link += copy_s
    stats.staged_experts += len(issued)
    engine.staged = issued
    engine.staged_stream = policy == STREAM
    return len(issued)


def take_staged(engine: "Engine", layer: int, experts: Sequence[int]) -> None:
    """Layer ``layer`` starts: the copies staged for it become its own — dropped after it when they were staged under
    STREAM; guessed experts it is not routed to are counted unused."""
    staged, engine.staged = engine.staged, []
    if not staged:
        return
    routed = {(layer, e) for e in experts}
    engine.stats.staged_unused += sum(1 for key in staged if key not in routed)
    if engine.staged_stream:
        engine.streamed.extend(key for key in staged if key in engine.cache)
