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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from specterbench.engine import moe_layer
from specterbench.engine.cache import DeviceCache
from specterbench.engine.clocks import Clock
from specterbench.engine.costs import CostEstimates, CostModel
from specterbench.engine.cuda_clock import CudaClock
from specterbench.engine.draft import release_drafts
from specterbench.engine.fused import fuse_rms_norms
from specterbench.engine.geometry import Geometry, geometry_from_config
from specterbench.engine.graphs import GraphController, GraphState
from specterbench.engine.host_clock import HostWallClock
from specterbench.engine.kernels import DEFAULT_KERNELS, EXPERT_OP_LAUNCHES, HOST_READ_LAUNCHES
from specterbench.engine.launch_count import count_model_launches
from specterbench.engine.moe_layer import count_packed_launches
from specterbench.engine.pool import SlotPool
from specterbench.engine.precision import BF16, priced_geometry
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.engine.residency import CacheControl
from specterbench.engine.routing import LayerRouting, RouterGuess, group_tokens
from specterbench.engine.seam import OffloadedExperts, find_moe_blocks, router_of
from specterbench.engine.store import ExpertStore
from specterbench.errors import BudgetError, EngineViolation, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.strategy import Request, Strategy

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
    activation_bytes: int = 0  # activations sent to and back from the host for those (both directions)
    substituted: int = 0  # misses computed with a strategy's substitute (lossy)


@dataclass(slots=True)
class StepSample:
    tokens: int
    clock_s: float
    wall_s: float
    stall_s: float = 0.0  # compute-stream stall since the last sample (the first sample of a request: prefill)
    h2d_bytes: int = 0  # host->device bytes the link carried since the last sample


@dataclass(slots=True)
class RoutingRecorder:
    """Collects routing while enabled: the (layer, experts) trace and per-expert token counts."""

    counts: torch.Tensor
    trace: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def _libc():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:  # pragma: no cover - not glibc
        return None


def host_memory_returns_to_the_os() -> None:
    """Large host tensors (cache slots and drafts on a CPU device, quantization temporaries) are mapped one by one
    (glibc's ``M_MMAP_THRESHOLD`` fixed at 1 MiB instead of growing with every freed block), so freeing them gives
    the memory back at once rather than leaving the heap fragmented across cells. A no-op without glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)


def trim_host_memory() -> None:
    """Return free heap pages to the OS (glibc ``malloc_trim``), e.g. when a cell ends."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def check_transformers() -> None:
    """The installed transformers is one pyproject.toml allows (its lowest is the lowest tested): one line
    otherwise."""
    lowest = MIN_TRANSFORMERS
    have = _transformers_version()
    if _version_tuple(have) < _version_tuple(lowest):
        raise UsageError(f"transformers {have} is older than the lowest supported, {lowest}: "
                         f"pip install 'transformers>={lowest},<6'")


MIN_TRANSFORMERS = "5.17"  # pyproject.toml's lower bound (a test keeps the two equal): the lowest tested


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def cache_kwarg(model: nn.Module) -> str:
    """The keyword the model's forward takes its KV cache under: ``past_key_values`` (transformers up to 5.2x),
    ``cache`` (later); a name the forward does not list would be swallowed by ``**kwargs`` and decoding would run
    without its cache."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise UsageError(f"{type(model).__name__}.forward takes no KV cache argument (neither 'cache' nor "
                     f"'past_key_values') under transformers {_transformers_version()}; install a supported "
                     f"transformers (see pyproject.toml)")


class Engine(CacheControl):
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
        self.forward_tokens = 1  # tokens of the forward being run (1 while decoding; K+1 when verifying)
        self.context_len = 1  # positions the forward attends to, its own included
        self._host_threads: int | None = None
        self.pageable_copies = self.swap_copies = False  # the copy path (configure resets it, a strategy picks it)
        self._wants_landed = False
        self._budget_bytes = self._device_bytes_left = self._device_bytes_charged = 0
        self._pending: set = set()
        self._routed_guard = False
        self._mark = (0.0, 0.0, 0.0)
        self.graphs = GraphController(self)  # CUDA graphs of the MoE layers' static pieces (--cuda-graphs)
        self.kernels = count_model_launches(self)  # what this model's dense parts launch: the prices' launches
        self.clock.costs.kernels = self.kernels
        self.scratch: torch.Tensor | None = None  # packed experts are dequantized here on the device (per cell)
        if precision.quantized:
            self.set_precision(precision)

    def setup_graphs(self, setting: str) -> GraphState:
        """Apply ``--cuda-graphs`` (``auto`` | ``off``): on CUDA the MoE layers' routers and shared experts replay
        CUDA graphs in decode and verification forwards; elsewhere, or when off or when a capture fails, every
        kernel runs eagerly. The state says which, and why (:mod:`specterbench.engine.graphs`)."""
        return self.graphs.setup(setting)

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

    def set_precision(self, precision) -> None:
        """The target is stored at ``precision``: its experts packed in the store (done while the engine was built
        when it was given the precision; else here, a layer at a time), so every expert is billed at the bytes it is
        stored, copied and held in a slot as (packed codes plus group metadata) — cache, budgets and link ledger —
        its per-expert path's launches counted, and the geometry priced at those bits. The dense part was quantized
        in place by :func:`~specterbench.engine.precision.quantize_model`."""

        self.precision = precision
        self.dense_ratio, self.dense_kernel = precision.dense_ratio, precision.dense_kernel
        try:
            self.store.pack(precision.expert_spec)  # a no-op when the store was built with it (the engine's path)
        except ValueError as err:
            raise UsageError(str(err)) from None
        if self.store.packed:  # what its per-expert path launches, counted on its own kernels
            layer, per_expert = count_packed_launches(self)
            self.kernels = replace(self.kernels, target_expert=per_expert, target_layer=layer)
            self.clock.costs.kernels = self.kernels
        own, before = self.geometry is self.own_geometry, self.geometry
        self.own_geometry = priced_geometry(self.own_geometry, precision)
        self.geometry = self.own_geometry if own else priced_geometry(self.geometry, precision)
        if self.clock.costs.geometry is before:  # the clock priced this engine's geometry: it prices the new one
            self.clock.costs.geometry = self.geometry

    # ---- cell setup ----------------------------------------------------------------------------------
    def configure(self, strategy: "Strategy", budget_bytes: int, clock) -> None:
        """Give ``strategy`` a fresh cache of ``budget_bytes`` minus what it keeps on the device itself."""
        self.end_cell()  # nothing of the cell before survives: its drafts and scratch are freed
        strategy.fit_budget(self, int(budget_bytes))
        extra = strategy.device_bytes(self)
        cache_bytes = budget_bytes - extra
        need = strategy.min_cache_bytes(self)
        if cache_bytes < need:
            raise BudgetError(
                f"budget {budget_bytes} bytes leaves {cache_bytes} for the expert cache after {extra} bytes the "
                f"strategy {strategy.name!r} keeps on the device; it needs at least {need + extra} bytes "
                f"({(need + extra) / self.total_expert_bytes:.1%} of expert bytes)")
        self.cache = DeviceCache(cache_bytes)
        self.pool = self._new_pool(cache_bytes)
        if self.pool.mode != "packed":
            self.kernels = replace(self.kernels,
                                   grouped_experts=EXPERT_OP_LAUNCHES[self.pool.mode] + HOST_READ_LAUNCHES)
        self.scratch = None
        if self.store.packed:  # one expert weight dequantized at a time, reused by every expert of every layer
            gu, dn = self.store.weights[(0, 0)]
            elems = max(gu.scratch_elems(), dn.scratch_elems())
            self.scratch = torch.empty(elems, dtype=self.compute_dtype, device=self.device)
        self._budget_bytes, self._device_bytes_left = int(budget_bytes), int(extra)
        self._device_bytes_charged = int(extra)
        self.clock = self._bind(clock)
        self.strategy = strategy
        self.stats = EngineStats()
        self.warming_up = False
        self._host_threads = None
        self.pageable_copies = False  # a strategy may ask for accelerate's copy path (use_pageable_copies)
        self.swap_copies = False  # ... or for Mixtral-Offloading's (use_swap_copies)
        self._wants_landed = strategy.wants_copy_landed
        strategy.attach(self)

    def use_pageable_copies(self) -> None:
        """From now on in this cell every expert copy is a synchronous copy from pageable host memory on the
        compute stream — ``tensor.to(device)`` from unpinned memory, what accelerate's offload hooks do — instead of
        a queued copy from pinned memory on the copy stream (:meth:`Clock.copy_sync`; priced at the profile's
        ``pageable_link_bytes_per_s``: a modeled clock whose profile lacks it refuses in one line)."""
        if self.clock.kind == "modeled":
            self.clock.costs.profile.pageable_bytes_per_s()
        self.pageable_copies = True

    def use_torch_bf16_host(self) -> None:
        """From now on in this cell the host's experts are priced as PyTorch runs a bf16 expert on the host CPU —
        Fiddler's CPU path as released (github.com/efeslab/fiddler ``src/fiddler/mixtral.py``,
        ``FiddlerMixtral.run_expert_at_cpu``: the Hugging Face Mixtral expert module in ``torch.bfloat16``, three
        eager GEMVs) — streaming its weights at the host profile's ``torch_bf16_bytes_per_s`` where that is below
        the DRAM share (:meth:`~specterbench.engine.costs.CostModel.host_dram_share`). The host computes them as
        before, with PyTorch's CPU ops. A host profile without the field refuses in one line; a clock without a host
        profile (measured: the host's own time is the price) is left as it is."""
        costs = self.clock.costs
        if costs.host is not None:
            costs.host_kernel_bytes_per_s = costs.host.torch_bf16_rate()

    def use_swap_copies(self) -> None:
        """From now on in this cell every miss swaps, as Mixtral-Offloading's ``ExpertCache._swap`` does
        (github.com/dvmazur/mixtral-offloading, ``src/expert_cache.py``): the evicted expert is copied device→host
        back into its store tensors (pinned host memory on CUDA) and the needed one host→device into the freed slot,
        both on the compute stream (:meth:`Clock.copy_on_compute`), so they run one after the other and serial with
        compute. The write-back's bytes are counted in ``stats.d2h_bytes``. Refused in one line when the slots' dtype
        cannot hold the store's values exactly (the write-back would change them)."""
        slot, store = self.compute_dtype, self.store.dtype
        if not self.store.packed and slot != store and slot not in (torch.float32, torch.float64):
            raise UsageError(f"swap copies write each evicted expert back into the host store ({store}), which the "
                             f"device's {slot} copy cannot do exactly; run the model in {store} or float32, or drop "
                             f"the swap option")
        self.swap_copies = True

    def end_cell(self) -> None:
        """The cell is over: every quantized copy (draft experts, dense copy, their scratch) is freed, the cache
        and the strategy let go, a host-expert thread the cell's clock started is joined, so the next cell starts
        from the engine's own bytes alone."""

        release_drafts(self)
        self.graphs.reset()  # the cell's graphs and their static buffers go with it
        if isinstance(self.clock, CudaClock):  # pragma: no cover - needs CUDA
            self.clock.close()  # a host-expert pool the clock made itself (a run's own pool is the runner's)
        self.cache = None
        self.scratch = None  # the device scratch packed experts are dequantized into goes with the cell
        self.strategy = None
        self.expert_override = None
        trim_host_memory()

    @property
    def device_bytes_released(self) -> int:
        """Device bytes the strategy has given back to the cache this cell (:meth:`release_device_bytes`): the cache's
        capacity is the budget less the strategy's charged bytes, plus these."""
        return self._device_bytes_charged - self._device_bytes_left

    def release_device_bytes(self, nbytes: int) -> None:
        """A strategy stops using ``nbytes`` of what :meth:`Strategy.device_bytes` charged (e.g. it drops its draft):
        they go to the expert cache, never past the cell's budget. More than it was charged and has not released
        yet is refused."""
        if not 0 <= nbytes <= self._device_bytes_left:
            raise EngineViolation(f"release_device_bytes({nbytes}): the strategy holds {self._device_bytes_left} "
                                  f"charged device bytes not yet released")
        self._device_bytes_left -= nbytes
        self.cache.capacity_bytes = min(self._budget_bytes, self.cache.capacity_bytes + nbytes)
        self.pool.grow(self.cache.capacity_bytes // self.expert_bytes)

    def _new_pool(self, cache_bytes: int) -> SlotPool:
        """The slot pool of a cell's cache: as many expert slots as its bytes hold."""
        gate_up, down = self.store.shapes
        return SlotPool(cache_bytes // self.expert_bytes, gate_up, down, self.num_layers, self.num_experts,
                        self.compute_dtype, self.device, template=self.store.weights[(0, 0)] if self.store.packed
                        else None)

    def _bind(self, clock: Clock) -> Clock:
        """A measured clock made without prices gets the default profile's at this engine's geometry."""
        if clock.costs is None:
            clock.costs = CostModel(default_profile(), self.geometry, default_host_profile())
        clock.costs.kernels = self.kernels  # the launches this engine issues
        clock.costs.host_kernel_bytes_per_s = None  # host experts at DRAM's rate until a strategy asks otherwise
        return clock

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
        T = input_ids.shape[1]
        before = kv.get_seq_length()
        self.forward_tokens = T
        self.context_len = before + T
        self.expert_override = experts
        self.dense_ratio = self.precision.dense_ratio if dense is None else dense.bytes_ratio  # None: the target's
        self.dense_kernel = self.precision.dense_kernel if dense is None else dense.kernel
        if experts is None:
            self.strategy.on_step_start(T)
        self._charge_dense_layers(T)
        try:
            with dense if dense is not None else contextlib.nullcontext():
                out = self.model(input_ids=input_ids.to(self.device), use_cache=True,
                                 logits_to_keep=0 if all_logits else 1, **{self.cache_kwarg: kv})
            rows = out.logits.shape[1]
            self.clock.compute(*self.clock.costs.head(rows, self.dense_ratio, self.dense_kernel))
            self.clock.compute(*self.clock.costs.sample(rows))  # each returned row is picked once, on the device
        finally:
            self.expert_override = None
            self.dense_ratio, self.dense_kernel = self.precision.dense_ratio, self.precision.dense_kernel
            self.current_layer = self.current_hidden = self.routing = None
        if kv.get_seq_length() != before + T:  # a cache passed under a name the forward swallows stays empty
            raise EngineViolation(f"the KV cache holds {kv.get_seq_length()} positions after a forward of {T} "
                                  f"tokens over {before}: the model did not use it (transformers "
                                  f"{_transformers_version()} took it as {self.cache_kwarg!r}); report this with "
                                  f"the transformers version")
        if self.cache.used_bytes > self.cache.capacity_bytes:  # defence in depth; insert() already refuses
            raise EngineViolation(f"cache holds {self.cache.used_bytes} bytes, over {self.cache.capacity_bytes}")
        return out.logits[0].float()

    def begin_request(self, request: "Request") -> None:
        self.clock.settle()
        self.samples = []
        self.clock.sync()
        self._mark = (self.clock.now(), time.perf_counter(), self.clock.totals.stall_s, self.stats.h2d_bytes)
        self.strategy.on_request_start(request)

    def emit(self, n_tokens: int) -> None:
        """Record that ``n_tokens`` became available to the user since the last mark (first call: TTFT)."""
        self.clock.sync()
        now = (self.clock.now(), time.perf_counter(), self.clock.totals.stall_s, self.stats.h2d_bytes)
        self.samples.append(StepSample(n_tokens, now[0] - self._mark[0], now[1] - self._mark[1],
                                       max(0.0, now[2] - self._mark[2]), now[3] - self._mark[3]))
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
            self.clock.compute(*costs.dense_layer(T, self.context_len, moe=False,
                                                  bytes_ratio=self.dense_ratio, kernel=self.dense_kernel))

    def run_moe_layer(self, layer, act_fn, hidden, top_k_index, top_k_weights):  # [T, H], [T, k], [T, k]
        """One MoE layer through the cache (the seam's call); phases in :mod:`specterbench.engine.moe_layer`."""
        T = hidden.shape[0]
        self.clock.compute(*self.clock.costs.dense_layer(T, self.context_len, moe=True, bytes_ratio=self.dense_ratio,
                                                         kernel=self.dense_kernel, captured=self.graphs.replays(T)))
        if self.expert_override is not None:
            return self.expert_override(layer, act_fn, hidden, top_k_index, top_k_weights)
        groups = group_tokens(top_k_index, top_k_weights, self.num_experts)
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
            elsewhere = moe_layer.place(self, layer, groups)
        finally:
            self._routed_guard = False
        jobs = moe_layer.run_elsewhere(self, elsewhere, groups, act_fn, hidden, outputs)
        on_device = moe_layer.run_on_device(self, layer, groups, elsewhere, act_fn, hidden, outputs)
        moe_layer.join_host(self, jobs, hidden, outputs)
        out = moe_layer.combine(hidden, groups, on_device, outputs)
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
