"""The offloaded MoE engine: experts live on the host, a byte-budgeted cache lives on the device.

The seam into transformers: every supported MoE block calls ``self.experts(hidden, top_k_index, top_k_weights)``
with fused expert tensors. :class:`OffloadedExperts` takes that call's place and asks the engine for experts by
``(moe_layer, expert)``; the engine asks the cache, waits on the clock, and computes. The strategy behind the
cache is called directly at fixed points and never sees the clock or the store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from specterbench.engine.cache import DeviceCache, ExpertKey, Slot
from specterbench.errors import BudgetError, EngineViolation
from specterbench.engine.geometry import Geometry, geometry_from_config
from specterbench.engine.seam import ExpertStore, OffloadedExperts, find_moe_blocks, router_of
from specterbench.plugins.strategy import FETCH, ON_HOST, SUBSTITUTE, Request, Strategy
from specterbench.engine.clocks import DEMAND_PRIORITY, HostWallClock

@dataclass(slots=True)
class EngineStats:
    hits: int = 0
    misses: int = 0
    prefetch_issued: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0
    prefetch_cancelled: int = 0
    h2d_bytes: int = 0
    demand_bytes: int = 0
    prefetch_bytes: int = 0
    expert_computes: int = 0
    host_experts: int = 0  # misses computed on the host CPU
    activation_bytes: int = 0  # activations sent to and back from the host for those (both directions)
    substituted: int = 0  # misses computed with a strategy's substitute (lossy)


@dataclass(slots=True)
class StepSample:
    tokens: int
    clock_s: float
    wall_s: float


@dataclass(slots=True)
class RoutingRecorder:
    """Collects routing while enabled: the (layer, experts) trace and per-expert token counts."""

    counts: torch.Tensor
    trace: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)


class Engine:
    def __init__(self, model: nn.Module, *, name: str, device: str | torch.device = "cpu",
                 tokenizer=None, geometry: Geometry | None = None, store_dtype: torch.dtype = torch.bfloat16):
        self.name = name
        self.device = torch.device(device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        blocks = find_moe_blocks(model)
        self.compute_dtype = next(model.parameters()).dtype
        self.store = ExpertStore(blocks, store_dtype, pin=self.device.type == "cuda")
        for layer, block in enumerate(blocks):
            block.experts = OffloadedExperts(self, layer, block.experts.act_fn)
        self.gates = [router_of(block) for block in blocks]  # routers, for strategies that predict ahead
        self.model.to(self.device)
        self.own_geometry = geometry_from_config(model.config, name, len(blocks))
        self.geometry = geometry or self.own_geometry
        self.num_layers = len(blocks)
        self.num_experts = self.store.num_experts
        self.top_k = self.own_geometry.top_k
        self.cache: DeviceCache | None = None
        self.clock = HostWallClock()
        self.strategy: Strategy | None = None
        self.stats = EngineStats()
        self.recorder: RoutingRecorder | None = None
        self.expert_override = None  # callable(layer, act_fn, hidden, idx, weights) for draft passes
        self.samples: list[StepSample] = []
        self.current_hidden: torch.Tensor | None = None  # the MoE input of the layer being run, [T, H]
        self._mark = (0.0, 0.0)
        self._fwd_tokens = 1
        self._fwd_context = 1

    # ---- sizes -------------------------------------------------------------------------------------
    @property
    def expert_bytes(self) -> int:
        return self.store.expert_bytes

    @property
    def priced_expert_bytes(self) -> int:
        """Bytes one expert copy is priced at by the modeled clock (the geometry's, per modeled layer)."""
        return int(self.geometry.expert_bytes * self.geometry.layer_scale)

    @property
    def total_expert_bytes(self) -> int:
        return self.store.total_bytes

    def min_budget_bytes(self) -> int:
        """What one decode forward needs: the top-k experts of one layer."""
        return self.top_k * self.expert_bytes

    # ---- cell setup ----------------------------------------------------------------------------------
    def configure(self, strategy: Strategy, budget_bytes: int, clock) -> None:
        """Give ``strategy`` a fresh cache of ``budget_bytes`` minus what it keeps on the device itself."""
        extra = strategy.device_bytes(self)
        cache_bytes = budget_bytes - extra
        need = strategy.min_cache_bytes(self)
        if cache_bytes < need:
            raise BudgetError(
                f"budget {budget_bytes} bytes leaves {cache_bytes} for the expert cache after {extra} bytes the "
                f"strategy {strategy.name!r} keeps on the device; it needs at least {need + extra} bytes "
                f"({(need + extra) / self.total_expert_bytes:.1%} of expert bytes)")
        self.cache = DeviceCache(cache_bytes)
        self.clock = clock
        self.strategy = strategy
        self.stats = EngineStats()
        strategy.attach(self)

    # ---- decoding ----------------------------------------------------------------------------------
    def new_kv_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, kv, *, all_logits: bool = False, experts=None) -> torch.Tensor:
        """One forward pass over ``input_ids`` [1, T]; returns logits [T, V] (or [1, V] unless ``all_logits``).

        ``experts``: a callable with the fused-experts signature plus the layer index, used instead of the
        offloaded cache for this pass (a resident self-draft); the strategy is not consulted then.
        """
        T = input_ids.shape[1]
        self._fwd_tokens = T
        self._fwd_context = kv.get_seq_length() + T
        self.expert_override = experts
        if experts is None:
            self.strategy.on_step_start(T)
        self._charge_dense_layers(T)
        try:
            out = self.model(input_ids=input_ids.to(self.device), cache=kv, use_cache=True,
                             logits_to_keep=0 if all_logits else 1)
        finally:
            self.expert_override = None
        g = self.geometry
        self.clock.compute(2 * out.logits.shape[1] * g.vocab * g.hidden, g.vocab * g.hidden * g.dtype_bytes, 2)
        if self.cache.used_bytes > self.cache.capacity_bytes:  # defence in depth; insert() already refuses
            raise EngineViolation(f"cache holds {self.cache.used_bytes} bytes, over {self.cache.capacity_bytes}")
        return out.logits[0].float()

    def begin_request(self, request: Request) -> None:
        settle = getattr(self.clock, "settle", None)
        if settle is not None:
            settle()
        self.samples = []
        self.clock.sync()
        self._mark = (self.clock.now(), time.perf_counter())
        self.strategy.on_request_start(request)

    def emit(self, n_tokens: int) -> None:
        """Record that ``n_tokens`` became available to the user since the last mark (first call: TTFT)."""
        self.clock.sync()
        now = (self.clock.now(), time.perf_counter())
        self.samples.append(StepSample(n_tokens, now[0] - self._mark[0], now[1] - self._mark[1]))
        self._mark = now

    def decode(self, request: Request, sampler=None) -> list[int]:
        """Autoregressive decoding of ``request``, one token per forward, tokens chosen by ``sampler`` (default: a
        fresh ``request.sampler()``; pass one made with ``record_margins=True`` to keep each token's margin)."""
        sampler = sampler if sampler is not None else request.sampler()
        position = len(request.prompt_ids)  # absolute position of the next token
        kv = self.new_kv_cache()
        logits = self.forward(torch.tensor([request.prompt_ids]), kv)
        tokens = [sampler.pick(logits[-1], position)]
        self.emit(1)
        self.strategy.on_step_end(tokens[-1:])
        while len(tokens) < request.max_new_tokens:
            logits = self.forward(torch.tensor([[tokens[-1]]]), kv)
            tokens.append(sampler.pick(logits[-1], position + len(tokens)))
            self.emit(1)
            self.strategy.on_step_end(tokens[-1:])
        return tokens

    greedy_decode = decode  # the name before decode modes existed

    @staticmethod
    def rollback(kv, keep_tokens: int) -> None:
        """Crop a KV cache back to its first ``keep_tokens`` positions (after rejected speculative tokens)."""
        drop = kv.get_seq_length() - keep_tokens
        if drop > 0:
            kv.crop(-drop)

    # ---- the MoE seam ------------------------------------------------------------------------------
    def _charge_dense_layers(self, T: int) -> None:
        g = self.geometry
        for _ in range(g.layers - g.moe_layers):
            self._charge_layer(T, moe=False)

    def _charge_layer(self, T: int, moe: bool) -> None:
        g, S = self.geometry, self._fwd_context
        params = g.layer_dense_params(moe)
        kv_bytes = 2 * S * g.kv_heads * g.head_dim * g.dtype_bytes
        self.clock.compute(g.layer_scale * (2 * T * params + 4 * T * S * g.heads * g.head_dim),
                           g.layer_scale * (params * g.dtype_bytes + kv_bytes), launches=round(8 * g.layer_scale))

    def charge_expert(self, n_tokens: int, bytes_ratio: float = 1.0) -> None:
        """Modeled cost of one expert over ``n_tokens`` (``bytes_ratio`` < 1 for quantized copies)."""
        g = self.geometry
        self.clock.compute(g.layer_scale * 2 * n_tokens * g.expert_params,
                           g.layer_scale * g.expert_bytes * bytes_ratio, launches=round(3 * g.layer_scale))

    def run_moe_layer(self, layer, act_fn, hidden, top_k_index, top_k_weights):
        T = hidden.shape[0]
        self._charge_layer(T, moe=True)
        if self.expert_override is not None:
            return self.expert_override(layer, act_fn, hidden, top_k_index, top_k_weights)
        counts = torch.bincount(top_k_index.reshape(-1), minlength=self.num_experts)  # [E]
        experts = counts.nonzero().flatten().tolist()
        n_tokens = counts[experts].tolist()
        if self.recorder is not None:
            self.recorder.counts[layer] += counts.cpu()
            self.recorder.trace.append((layer, tuple(experts)))
        strategy, cache, clock, stats = self.strategy, self.cache, self.clock, self.stats
        self.current_hidden = hidden
        strategy.before_layer(layer, experts, n_tokens)

        keys = [(layer, e) for e in experts]
        pending = set(keys)
        elsewhere: dict[ExpertKey, str] = {}  # misses the strategy runs on the host or with a substitute
        for key, n in zip(keys, n_tokens):
            if key in cache:
                stats.hits += 1
                continue
            stats.misses += 1
            strategy.on_miss(key)
            if key in cache:
                continue
            place = strategy.place_miss(key, n)
            if place == FETCH:
                self._fetch(key, DEMAND_PRIORITY, prefetched=False, protect=pending)
            elif place in (ON_HOST, SUBSTITUTE):
                elsewhere[key] = place
                pending.discard(key)
            else:
                raise EngineViolation(f"strategy {strategy.name!r} placed {key} at {place!r}; use fetch, host or "
                                      f"substitute")
        outputs, host_done = {}, 0.0
        for key, place in elsewhere.items():  # host experts start first: they run beside the device
            token_idx, pos = torch.where(top_k_index == key[1])
            if place == ON_HOST:
                host_weights = tuple(w.to(self.compute_dtype) for w in self.store.weights[key])
                y = self._expert(host_weights, act_fn, hidden[token_idx].cpu(),
                                 top_k_weights[token_idx, pos, None].cpu()).to(hidden.device)
                host_done = max(host_done, self._charge_host(len(token_idx)))
                stats.host_experts += 1
                stats.activation_bytes += 2 * y.numel() * y.element_size()  # inputs down, results back
            else:
                weights, ratio = strategy.substitute(key)
                y = self._expert(weights, act_fn, hidden[token_idx], top_k_weights[token_idx, pos, None])
                self.charge_expert(len(token_idx), ratio)
                stats.substituted += 1
            outputs[key[1]] = (token_idx, y)
        # compute what has landed first, then in order of arrival; misses that found no room come last and are
        # fetched as soon as a computed expert frees a place, so their copies still overlap compute
        order = sorted((k for k in keys if k not in elsewhere), key=self._arrival)
        deferred = [k for k in order if k not in cache]
        for key in order:
            while deferred and (deferred[0] in cache or self._fetch(
                    deferred[0], DEMAND_PRIORITY, prefetched=False, protect=pending) is not None):
                deferred.pop(0)
            slot = self._acquire(key, pending)
            cache.in_use = key
            token_idx, pos = torch.where(top_k_index == key[1])
            outputs[key[1]] = (token_idx, self._expert(slot.weights, act_fn, hidden[token_idx],
                                                       top_k_weights[token_idx, pos, None]))
            self.charge_expert(len(token_idx))
            stats.expert_computes += 1
            cache.in_use = None
            pending.discard(key)
        if host_done:
            clock.wait_until(host_done)
        out = torch.zeros_like(hidden)
        for e in experts:  # fixed summation order: numerics do not depend on the strategy
            token_idx, y = outputs[e]
            out.index_add_(0, token_idx, y.to(out.dtype))
        strategy.after_layer(layer, experts)
        return out

    @staticmethod
    def _expert(weights, act_fn, x, scale):  # x [n, H], scale [n, 1] -> [n, H]
        gate_up, down = weights
        gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
        return F.linear(act_fn(gate) * up, down) * scale

    def _charge_host(self, n_tokens: int) -> float:
        g = self.geometry
        return self.clock.host_compute(g.layer_scale * 2 * n_tokens * g.expert_params,
                                       g.layer_scale * g.expert_bytes, 2 * n_tokens * g.hidden * g.dtype_bytes)

    def _arrival(self, key: ExpertKey) -> float:
        slot = self.cache.get(key)
        if slot is None:
            return float("inf")
        return self.clock.expected_arrival(slot.transfer)

    def _acquire(self, key: ExpertKey, pending: set) -> Slot:
        slot = self.cache.get(key)
        if slot is None:  # no room when the layer started: make it now, sparing experts still to compute
            slot = self._fetch(key, DEMAND_PRIORITY, prefetched=False, protect=pending - {key})
            if slot is None:
                slot = self._fetch(key, DEMAND_PRIORITY, prefetched=False, protect=(), force=True)
            if slot is None:
                raise BudgetError(f"the expert cache ({self.cache.capacity_bytes} bytes) cannot hold one expert "
                                  f"({self.expert_bytes} bytes)")
        self.clock.wait(slot.transfer)
        if not slot.used:
            if self.device.type == "cuda":  # pragma: no cover - needs CUDA
                for w in slot.weights:  # copied on the copy stream, read on this one: keep the allocator honest
                    w.record_stream(torch.cuda.current_stream(self.device))
            slot.used = True
            if slot.prefetched:
                self.stats.prefetch_used += 1
        self.cache.touch(key)
        return slot

    # ---- what strategies may call ------------------------------------------------------------------
    def prefetch(self, key: ExpertKey, priority: float = 0.0) -> bool:
        """Queue a copy of ``key`` if it is not cached and fits in the free bytes; True when queued."""
        if key in self.cache or self.cache.free_bytes < self.expert_bytes:
            return False
        return self._fetch(key, priority, prefetched=True, protect=()) is not None

    def evict(self, key: ExpertKey) -> None:
        slot = self.cache.get(key)
        if slot is None:
            raise EngineViolation(f"expert {key} is not cached, so it cannot be evicted")
        if not self.clock.ready(slot.transfer):
            if not self.clock.cancel(slot.transfer):
                raise EngineViolation(f"expert {key} is still being copied and cannot be evicted until it lands")
            self.stats.prefetch_cancelled += 1
            self._unledger(slot)
        elif slot.prefetched and not slot.used:
            self.stats.prefetch_wasted += 1
        self.cache.remove(key)

    def evictable(self) -> list[ExpertKey]:
        """Cached experts that may be evicted now (not in use, not mid-copy), least recently used first."""
        clock, in_use = self.clock, self.cache.in_use
        return [k for k, s in self.cache.slots.items()
                if k != in_use and (clock.ready(s.transfer) or not clock.started(s.transfer))]

    def make_room(self, nbytes: int, protect=(), needed: ExpertKey | None = None, force: bool = False) -> bool:
        """Evict the strategy's choices until ``nbytes`` are free. False when nothing more may be evicted, or
        when the strategy declines (``choose_victim`` returned None) and ``force`` is not set; with ``force``
        the least recently used candidate goes, so that a forward always makes progress."""
        cache = self.cache
        while cache.free_bytes < nbytes:
            candidates = [k for k in self.evictable() if k not in protect]
            if not candidates:
                landing = [s for k, s in cache.slots.items() if k not in protect and not self.clock.ready(s.transfer)]
                if not landing:
                    return False
                self.clock.wait(min(landing, key=lambda s: self.clock.expected_arrival(s.transfer)).transfer)
                continue
            victim = self.strategy.choose_victim(candidates, needed)
            if victim is None:
                if not force:
                    return False
                victim = candidates[0]
            if victim not in candidates:
                raise EngineViolation(f"strategy {self.strategy.name!r} chose {victim} to evict, which is not "
                                      f"evictable now (in use, mid-copy, protected or not cached)")
            self.evict(victim)
        return True

    def link_bytes_per_s(self) -> float | None:
        """The link bandwidth estimated from copies that have moved so far (None before the first)."""
        t = self.clock.totals
        return t.link_bytes / t.link_busy_s if t.link_busy_s > 0 else None

    def expected_arrival(self, key: ExpertKey) -> float | None:
        slot = self.cache.get(key)
        return None if slot is None else self.clock.expected_arrival(slot.transfer)

    def _fetch(self, key: ExpertKey, priority: float, *, prefetched: bool, protect, force=False) -> Slot | None:
        if not self.make_room(self.expert_bytes, protect=protect, needed=key, force=force):
            return None
        src = self.store.weights[key]
        landed = []

        def copy():
            landed.extend(t.to(self.device, dtype=self.compute_dtype, non_blocking=True) for t in src)

        transfer = self.clock.issue(key, self.priced_expert_bytes, priority, copy)
        slot = Slot(key, self.expert_bytes, tuple(landed), transfer, prefetched)
        self.cache.insert(slot)
        self.stats.h2d_bytes += self.expert_bytes
        if prefetched:
            self.stats.prefetch_issued += 1
            self.stats.prefetch_bytes += self.expert_bytes
        else:
            self.stats.demand_bytes += self.expert_bytes
        return slot

    def _unledger(self, slot: Slot) -> None:
        self.stats.h2d_bytes -= slot.nbytes
        if slot.prefetched:
            self.stats.prefetch_bytes -= slot.nbytes
        else:
            self.stats.demand_bytes -= slot.nbytes

    # ---- routing records ---------------------------------------------------------------------------
    def start_recording(self) -> RoutingRecorder:
        self.recorder = RoutingRecorder(torch.zeros(self.num_layers, self.num_experts, dtype=torch.long))
        return self.recorder

    def stop_recording(self) -> RoutingRecorder:
        rec, self.recorder = self.recorder, None
        return rec
