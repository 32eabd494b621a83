"""Setting up the engine for one benchmark cell: the strategy's cache within its budget, the copy path and host
kernels it asks for, the target's precision, and releasing everything when the cell ends. A mixin of
:class:`~specterbench.engine.engine.Engine` (it reads and sets the engine's own state)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from specterbench.engine.cache import DeviceCache
from specterbench.engine.clocks import Clock
from specterbench.engine.costs import CostModel
from specterbench.engine.cuda_clock import CudaClock
from specterbench.engine.draft import release_drafts
from specterbench.engine.graphs import GraphState
from specterbench.engine.host_memory import trim_host_memory
from specterbench.engine.kernels import EXPERT_OP_LAUNCHES, HOST_READ_LAUNCHES
from specterbench.engine.moe_layer import count_packed_launches
from specterbench.engine.pool import SlotPool
from specterbench.engine.precision import priced_geometry
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.engine.stats import EngineStats
from specterbench.errors import BudgetError, EngineViolation, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.strategy import Strategy


class CellSetup:
    def setup_graphs(self, setting: str) -> GraphState:
        """Apply ``--cuda-graphs`` (``auto`` | ``off``): on CUDA the MoE layers' routers and shared experts replay
        CUDA graphs in decode and verification forwards; elsewhere, or when off or when a capture fails, every
        kernel runs eagerly. The state says which, and why (:mod:`specterbench.engine.graphs`)."""
        return self.graphs.setup(setting)

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
