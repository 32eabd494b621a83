"""The offloaded MoE engine: experts live on the host, a byte-budgeted cache lives on the device.

The seam into transformers: every supported MoE block calls ``self.experts(hidden, top_k_index, top_k_weights)``
with fused expert tensors. :class:`OffloadedExperts` takes that call's place and asks the engine for experts by
``(moe_layer, expert)``; the engine asks the cache, waits on the clock, and computes (the per-layer phases live
in :mod:`specterbench.engine.moe_layer`). The strategy behind the cache is called directly at fixed points; it
asks questions through the engine's public methods and ``engine.costs`` (:mod:`specterbench.engine.costs`),
never through the clock's or the cache's internals.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import torch
from torch import nn

from specterbench.engine import moe_layer
from specterbench.engine.cache import ON_HOST, DeviceCache
from specterbench.engine.cell_setup import CellSetup
from specterbench.engine.clocks import Clock
from specterbench.engine.compat import cache_kwarg, check_transformers, transformers_version
from specterbench.engine.estimates import CostEstimates
from specterbench.engine.fused import fuse_rms_norms
from specterbench.engine.geometry import Geometry, geometry_from_config
from specterbench.engine.graphs import GraphController
from specterbench.engine.host_clock import HostWallClock
from specterbench.engine.host_memory import host_memory_returns_to_the_os
from specterbench.engine.kernels import DEFAULT_KERNELS
from specterbench.engine.launch_count import count_model_launches
from specterbench.engine.pool import SlotPool
from specterbench.engine.precision import BF16
from specterbench.engine.prefill import DEVICE, POLICIES, drop_streamed, stage_next, take_staged
from specterbench.engine.residency import CacheControl
from specterbench.engine.routing import LayerRouting, RouterGuess, group_tokens
from specterbench.engine.seam import OffloadedExperts, find_moe_blocks, router_of
from specterbench.engine.stats import EngineStats, RoutingRecorder, StepSample
from specterbench.engine.store import ExpertStore
from specterbench.errors import EngineViolation, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.strategy import Request, Strategy


class Engine(CacheControl, CellSetup):
    def __init__(self, model: nn.Module, *, name: str, device: str | torch.device = "cpu",
                 tokenizer=None, geometry: Geometry | None = None, store_dtype: torch.dtype = torch.bfloat16,
                 precision=BF16):
        check_transformers()
        host_memory_returns_to_the_os()
        self.name = name
        self.kernels = DEFAULT_KERNELS  # until this model's own are counted (end of __init__)
        self.device = torch.device(device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        blocks = find_moe_blocks(model)
        self.compute_dtype = next(model.parameters()).dtype
        self.store = ExpertStore(blocks, store_dtype, pin=self.device.type == "cuda", device_dtype=self.compute_dtype,
                                 spec=precision.expert_spec)  # built layer by layer; packed for a quantized target
        for layer, block in enumerate(blocks):
            block.experts = OffloadedExperts(self, layer, block.experts.act_fn)
        self.moe_blocks = blocks  # the model's MoE blocks, by MoE layer
        self.gates = [router_of(block) for block in blocks]  # routers, for strategies that predict ahead
        self.model.to(self.device)
        self.cache_kwarg = cache_kwarg(model)  # the name this transformers' forward takes the KV cache under
        self.fused_norms = fuse_rms_norms(self.model)  # RMSNorms as one kernel each (engine.fused)
        self.own_geometry = geometry_from_config(model.config, name, len(blocks))
        self.geometry = geometry or self.own_geometry
        self.num_layers = len(blocks)
        self.num_experts = self.store.num_experts
        self.top_k = self.own_geometry.top_k
        self.cache: DeviceCache | None = None
        self.pool: SlotPool | None = None  # the cache's expert slots on the device (made per cell)
        self.clock: Clock = self._bind(HostWallClock())
        self.costs = CostEstimates(self)  # estimates for strategies, in seconds (see specterbench.engine.costs)
        self.strategy: "Strategy | None" = None
        self.stats = EngineStats()
        self.recorder: RoutingRecorder | None = None
        self.expert_override = None  # callable(layer, act_fn, hidden, idx, weights) for draft passes
        self.host_placed_s = 0.0  # host seconds of this layer's misses placed on the host, not yet started
        self.precision = BF16  # the target's stored precision (``--expert-bits``/``--dense-bits``): set_precision()
        self.dense_ratio = 1.0  # weight bytes of the dense layers and head over 16-bit in this pass (a draft's copy)
        self.dense_kernel = None  # the kernel reading them (None: 16-bit; a draft copy's LowBitKernel)
        self.samples: list[StepSample] = []
        self.warming_up = False  # True between begin_warmup() and end_warmup()
        self.current_layer: int | None = None  # the MoE layer being run (None between layers' experts)
        self.current_hidden: torch.Tensor | None = None  # the MoE input of the layer being run, [T, H]
        self.routing: LayerRouting | None = None  # router signals of the layer being run
        self.forward_tokens = 1  # tokens of the forward being run (1 while decoding; K+1 when verifying; B·T in a
        # batched step)
        self.batch = 1  # requests decoding together in this forward (engine.batch: a batched step's B)
        self.cell_batch = 1  # requests the cell's measured batches decode together (set before the strategy's prepare)
        self.context_len = 1  # positions the forward attends to, its own included
        self._host_threads: int | None = None
        self.pageable_copies = self.swap_copies = False  # the copy path (configure resets it, a strategy picks it)
        self._wants_landed = False
        self._budget_bytes = self._device_bytes_left = self._device_bytes_charged = 0
        self._pending: set = set()
        self._routed_guard = False
        self._mark = (0.0, 0.0, 0.0)
        self.prefilling = False  # True from begin_request until the request's first target forward has run
        self.streamed: list = []  # the running layer's experts staged by a STREAM prefill policy (dropped after it)
        self.staged: list = []  # copies issued for the next layer by a prefill's overlap (engine.prefill.stage_next)
        self.staged_stream = False  # those were staged under STREAM (dropped after that layer)
        self.context_tokens = 0  # the request's leading prompt positions prefilled outside its timing (--depth)
        self.graphs = GraphController(self)  # CUDA graphs of the MoE layers' static pieces (--cuda-graphs)
        self.kernels = count_model_launches(self)  # what this model's dense parts launch: the prices' launches
        self.clock.costs.kernels = self.kernels
        self.scratch: torch.Tensor | None = None  # packed experts are dequantized here on the device (per cell)
        if precision.quantized:
            self.set_precision(precision)

    # ---- sizes -------------------------------------------------------------------------------------
    @property
    def expert_bytes(self) -> int:
        """Bytes one expert holds in the device cache, the budget's unit: on CUDA what it really allocates (the
        compute dtype); elsewhere the store's 16-bit bytes (so budgets and modeled results do not depend on the
        CPU's compute dtype); a quantized target's packed bytes everywhere (a slot holds exactly them). What one copy
        moves is ``store.expert_bytes``."""
        return self.store.device_expert_bytes if self.device.type == "cuda" else self.store.expert_bytes

    @property
    def priced_expert_bytes(self) -> int:
        """Bytes one expert copy is priced at by the modeled clock (the geometry's, per modeled layer)."""
        return int(self.geometry.expert_bytes * self.geometry.layer_scale)

    @property
    def host_threads(self) -> int:
        """Host threads for experts run on the host (a strategy may set fewer than the clock has)."""
        return self._host_threads if self._host_threads is not None else self.clock.host_threads_available

    @host_threads.setter
    def host_threads(self, n: int) -> None:
        if not 1 <= n <= self.clock.host_threads_available:
            raise UsageError(f"host_threads={n}: the host has 1..{self.clock.host_threads_available}")
        self._host_threads = int(n)

    @property
    def total_expert_bytes(self) -> int:
        return self.expert_bytes * len(self.store.weights)

    def min_budget_bytes(self) -> int:
        """What one decode forward needs: the top-k experts of one layer."""
        return self.top_k * self.expert_bytes

    def begin_warmup(self) -> None:
        """The runner's warm-up request starts: ``engine.warming_up`` is True until :meth:`end_warmup`."""
        self.warming_up = True

    def end_warmup(self) -> None:
        """The warm-up is over: the engine's counters and the clock's totals restart, then the strategy's
        :meth:`~specterbench.Strategy.on_warmup_end` runs (to restart its own metrics)."""
        self.warming_up = False
        self.stats = EngineStats()
        self.clock.totals = type(self.clock.totals)()
        self.strategy.on_warmup_end()

    # ---- decoding ----------------------------------------------------------------------------------
    def new_kv_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, kv, *, all_logits: bool = False, experts=None,
                dense=None) -> torch.Tensor:
        """One forward pass over ``input_ids`` [1, T]; returns logits [T, V] (or [1, V] unless ``all_logits``).

        ``experts``: a callable with the fused-experts signature plus the layer index, used instead of the
        offloaded cache for this pass (a resident self-draft); the strategy is not consulted then.
        ``dense``: a :class:`~specterbench.engine.dense_copy.QuantizedDense` swapped in for this pass (a draft's
        low-bit attention, shared experts and head), its weights priced at its ``bytes_ratio``.
        """
        D = self.context_tokens
        if D and 0 < D < input_ids.shape[1] and input_ids.shape[0] == 1 and kv.get_seq_length() == 0:
            return self._after_context(input_ids, kv, all_logits=all_logits, experts=experts, dense=dense)
        return self._forward(input_ids, kv, all_logits=all_logits, experts=experts, dense=dense)[0].float()

    def _after_context(self, input_ids: torch.Tensor, kv, **kw) -> torch.Tensor:
        """A request's first forward over its context and prompt (``request.context_tokens`` > 0, ``--depth``): the
        context is prefilled first, priced as any forward, and the request's timing mark moves past it — its
        time, stall and link bytes belong to no sample — then the prompt is processed at that depth."""
        D = self.context_tokens
        self.clock.sync()
        before = (self.clock.now(), time.perf_counter(), self.clock.totals.stall_s, self.stats.h2d_bytes)
        prefilling = self.prefilling
        head = self._forward(input_ids[:, :D], kv, **kw)[0].float()  # [D or 1, V]
        self.prefilling = prefilling  # the prompt after its context is still the request's prefill
        self.clock.sync()
        after = (self.clock.now(), time.perf_counter(), self.clock.totals.stall_s, self.stats.h2d_bytes)
        self._mark = tuple(m + (a - b) for m, a, b in zip(self._mark, after, before))
        tail = self._forward(input_ids[:, D:], kv, **kw)[0].float()  # [T - D or 1, V]
        return torch.cat([head, tail]) if kw.get("all_logits") else tail

    @torch.inference_mode()
    def _forward(self, input_ids: torch.Tensor, kv, *, all_logits: bool = False, experts=None,
                 dense=None) -> torch.Tensor:
        """:meth:`forward` over ``input_ids`` [B, T] (B: ``self.batch`` requests of equal length, one KV cache
        holding each request's own rows); the raw logits [B, T or 1, V]."""
        B, T = input_ids.shape
        before = kv.get_seq_length()
        self.forward_tokens = B * T
        self.context_len = before + T
        self.expert_override = experts
        self.dense_ratio = self.precision.dense_ratio if dense is None else dense.bytes_ratio  # None: the target's
        self.dense_kernel = self.precision.dense_kernel if dense is None else dense.kernel
        if experts is None:
            self.strategy.on_step_start(B * T)
        self._charge_dense_layers(B * T)
        try:
            with dense if dense is not None else contextlib.nullcontext():
                out = self.model(input_ids=input_ids.to(self.device), use_cache=True,
                                 logits_to_keep=0 if all_logits else 1, **{self.cache_kwarg: kv})
            rows = out.logits.shape[0] * out.logits.shape[1]
            self.clock.compute(*self.clock.costs.head(rows, self.dense_ratio, self.dense_kernel))
            self.clock.compute(*self.clock.costs.sample(rows))  # each returned row is picked once, on the device
        finally:
            self.expert_override = None
            self.dense_ratio, self.dense_kernel = self.precision.dense_ratio, self.precision.dense_kernel
            self.current_layer = self.current_hidden = self.routing = None
        if experts is None:  # a request's prefill is its first target forward, batched or not
            self.prefilling = False
        if kv.get_seq_length() != before + T:  # a cache passed under a name the forward swallows stays empty
            raise EngineViolation(f"the KV cache holds {kv.get_seq_length()} positions after a forward of {T} "
                                  f"tokens over {before}: the model did not use it (transformers "
                                  f"{transformers_version()} took it as {self.cache_kwarg!r}); report this with "
                                  f"the transformers version")
        if self.cache.used_bytes > self.cache.capacity_bytes:  # defence in depth; insert() already refuses
            raise EngineViolation(f"cache holds {self.cache.used_bytes} bytes, over {self.cache.capacity_bytes}")
        return out.logits

    def begin_request(self, request: "Request") -> None:
        self.clock.settle()
        self.samples = []
        self.context_tokens = int(getattr(request, "context_tokens", 0) or 0)
        self.prefilling = True
        self.clock.sync()
        self._mark = (self.clock.now(), time.perf_counter(), self.clock.totals.stall_s, self.stats.h2d_bytes)
        self.strategy.on_request_start(request)

    def emit(self, n_tokens: int, per_request=None) -> None:
        """Record that ``n_tokens`` became available to the user since the last mark (first call: TTFT); a batched
        step whose requests received different counts gives each one's in ``per_request`` (batch order)."""
        self.clock.sync()
        now = (self.clock.now(), time.perf_counter(), self.clock.totals.stall_s, self.stats.h2d_bytes)
        self.samples.append(StepSample(n_tokens, now[0] - self._mark[0], now[1] - self._mark[1],
                                       max(0.0, now[2] - self._mark[2]), now[3] - self._mark[3],
                                       None if per_request is None else tuple(per_request)))
        self._mark = now
        self._deliver_landed()

    def decode(self, request: "Request", sampler=None) -> list[int]:
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
    def charge(self, op) -> float:
        """Charge one device operation (a :class:`~specterbench.engine.costs.Op`, e.g. from
        ``engine.clock.costs.experts_fused(...)``) on the compute stream; its price in seconds."""
        return self.clock.compute(*op)

    def charge_expert(self, n_tokens: int, bytes_ratio: float | None = None) -> float:
        """Charge one expert over ``n_tokens`` on the compute stream (``bytes_ratio``: a quantized copy's bytes over
        16-bit; None: the target's own expert at its stored precision)."""
        return self.clock.compute(*self.clock.costs.expert(n_tokens, bytes_ratio))

    def _charge_dense_layers(self, T: int) -> None:
        g, costs = self.geometry, self.clock.costs
        for _ in range(g.layers - g.moe_layers):
            self.clock.compute(*costs.dense_layer(T, self.context_len, moe=False, bytes_ratio=self.dense_ratio,
                                                  kernel=self.dense_kernel, requests=self.batch))

    def run_moe_layer(self, layer, act_fn, hidden, top_k_index, top_k_weights):  # [T, H], [T, k], [T, k]
        """One MoE layer through the cache (the seam's call); phases in :mod:`specterbench.engine.moe_layer`."""
        T = hidden.shape[0]
        self.clock.compute(*self.clock.costs.dense_layer(T, self.context_len, moe=True, bytes_ratio=self.dense_ratio,
                                                         kernel=self.dense_kernel, captured=self.graphs.replays(T),
                                                         requests=self.batch))
        if self.expert_override is not None:
            return self.expert_override(layer, act_fn, hidden, top_k_index, top_k_weights)
        groups = group_tokens(top_k_index, top_k_weights, self.num_experts)
        if T == self.batch:  # a decode step: one new token per request (the per-step expert metrics)
            self.stats.decode_layer_calls += 1
            self.stats.decode_distinct_experts += len(groups.experts)
            self.stats.decode_routings += sum(groups.tokens_per_expert)
        if self.recorder is not None:
            self.recorder.counts[layer, groups.experts] += torch.tensor(groups.tokens_per_expert)
            self.recorder.trace.append((layer, tuple(groups.experts)))
        self.current_layer, self.current_hidden = layer, hidden
        self.routing = LayerRouting(layer, hidden, top_k_index, top_k_weights, groups, self.gates[layer])
        self._deliver_landed()
        self._pending = {(layer, e) for e in groups.experts}
        self._routed_guard = True  # until placed, the strategy may not evict what this layer is routed to
        try:
            self.strategy.before_layer(layer, groups.experts, groups.tokens_per_expert)
            outputs: dict = {}
            self.host_placed_s = 0.0
            policy = DEVICE
            prefill = self.prefilling and T > 1
            if prefill:
                take_staged(self, layer, groups.experts)
                policy = self.strategy.prefill_layer(layer, groups.experts, groups.tokens_per_expert)
                if policy not in POLICIES:
                    raise EngineViolation(f"strategy {self.strategy.name!r} chose prefill policy {policy!r} for "
                                          f"layer {layer}; use one of {', '.join(POLICIES)}")
            elsewhere = moe_layer.place(self, layer, groups, policy)
        finally:
            self._routed_guard = False
        jobs = moe_layer.run_elsewhere(self, elsewhere, groups, act_fn, hidden, outputs)
        on_device = moe_layer.run_on_device(self, layer, groups, elsewhere, act_fn, hidden, outputs)
        if prefill and self.strategy.prefill_ahead(layer):  # before the host is joined: the link runs beside it
            drop_streamed(self)  # the device op has read them: their bytes are free for the next layer's copies
            stage_next(self, layer, policy, [len(groups.of(k[1])[0]) for k, w in elsewhere.items() if w == ON_HOST])
        moe_layer.join_host(self, jobs, hidden, outputs)
        out = moe_layer.combine(hidden, groups, on_device, outputs)
        if self.streamed:
            drop_streamed(self)
        self.strategy.after_layer(layer, groups.experts)
        self._pending = set()
        return out

    _expert = staticmethod(moe_layer.expert_forward)

    def _deliver_landed(self) -> None:
        landed = self.clock.drain_landed()
        if self._wants_landed:
            for t in landed:
                slot = self.cache.get(t.key)
                if slot is not None and slot.transfer is t:
                    self.strategy.on_copy_landed(t.key)

    # ---- what strategies may call ------------------------------------------------------------------
    def router_guess(self, layer: int, hidden: torch.Tensor | None = None) -> RouterGuess:
        """Apply MoE ``layer``'s router to ``hidden`` [T, H] (default: the MoE input of the layer being run) —
        e.g. the next layer's gate one layer early. Charged on the compute stream as one router op."""
        if hidden is None:
            if self.current_hidden is None:
                raise UsageError("router_guess without hidden states is only possible while a MoE layer runs")
            hidden = self.current_hidden
        if not 0 <= layer < self.num_layers:
            raise UsageError(f"router_guess: MoE layer {layer} does not exist (0..{self.num_layers - 1})")
        self.clock.compute(*self.clock.costs.router(hidden.shape[0]))
        with torch.inference_mode():
            logits, weights, index = self.gates[layer](hidden)
        return RouterGuess(layer, logits, weights, index)

    # ---- routing records ---------------------------------------------------------------------------
    def start_recording(self) -> RoutingRecorder:
        self.recorder = RoutingRecorder(torch.zeros(self.num_layers, self.num_experts, dtype=torch.long))
        return self.recorder

    def stop_recording(self) -> RoutingRecorder:
        rec, self.recorder = self.recorder, None
        return rec
