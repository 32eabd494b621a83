"""Quantized copies of the routed experts: the self-draft's experts (and lossy fallbacks).

``BitsAndBytesConfig`` only quantizes ``nn.Linear``; fused expert tensors are quantized here per expert slice
(``gate_up`` [2I, H] and ``down`` [H, I]). Three quantizers:

- ``bnb``: bitsandbytes blockwise nf4/fp4 (4-bit) or int8 (8-bit), fp32 absmax per block;
- ``int``: the project's own asymmetric round-to-nearest per group along the input dimension, 2/3/4/8 bits, an
  fp16 scale and a ``bits``-bit zero point per group — at 4 bits and group 128 this is GPTQ INT4 g128's layout
  (4 + 20/128 ≈ 4.16 bits per weight), the artifact's draft;
- ``hqq``: Half-Quadratic Quantization (the ``hqq`` package, optional), 2/3/4/8 bits, fp16 scale and zero per group;
- ``sym``: symmetric int8 with one scale per output channel (no zero, no groups; ``blocksize`` unused) — the format
  torch's int8 weight-only matmul takes (gpt-fast's int8 layout); the default of a draft's 8-bit dense copy.

The copies hold exactly that on the device: packed codes plus per-group metadata (:mod:`specterbench.engine.packing`),
computed with torch's int4 weight-only kernel or bitsandbytes' 4-bit gemv where the format has one, otherwise
dequantized into a reused scratch buffer — a draft step's routed experts together (the projections of this
project's ``int``/``hqq`` packing that no low-bit kernel takes, beside a projection that one does), otherwise one
expert (or one block of rows) at a time. Bytes — packed values,
metadata and that scratch — are known before quantizing (a budget can be checked first) and are charged to the
strategy that keeps the copies on the device; :meth:`QuantizedExperts.allocated_bytes` reports the storage really
held, for the row's ``strategy_device_bytes_allocated``. A copy lives for one cell: :func:`release_drafts` frees
every copy when the cell ends (nothing is parked on the host). The modeled clock prices the kernel that runs: the
draft's routed experts of one layer as one fused low-bit MoE kernel, plus the scratch traffic and launches of the
dequantization where no low-bit kernel exists.

The draft's optional low-bit copy of everything else it reads per token (attention, shared experts, dense MLPs,
the output head) is :mod:`specterbench.engine.dense_copy`; it shares this module's formats and pricing.
"""

from __future__ import annotations

import torch

from specterbench.engine import bitpack, lowbit_ops, packing
from specterbench.engine.geometry import PRICED_DTYPE_BYTES
from specterbench.engine.kernels import LaunchCounter
from specterbench.engine.lowbit import BF16, INT4_TORCH, INT8, kernel_for
from specterbench.engine.quant_spec import QuantSpec, error_scaled
from specterbench.engine.routing import group_tokens


def kernel_name_for(shape, spec: QuantSpec, engine) -> str:
    """The kernel a weight of ``shape`` quantized with ``spec`` runs on ``engine``'s device (before quantizing)."""
    rows, cols = shape
    group = spec.blocksize if cols % spec.blocksize == 0 else cols
    if (spec.quantizer == "int" and spec.bits == 4 and group in lowbit_ops.INT4_GROUPS and rows % 16 == 0
            and cols % (16 * lowbit_ops.INT4_INNER_K_TILES) == 0
            and lowbit_ops.int4_kernel_works(str(engine.device), engine.compute_dtype)):
        return "int4mm"
    if spec.quantizer == "sym" and lowbit_ops.int8_kernel_works(str(engine.device), engine.compute_dtype):
        return "int8mm"
    if spec.quantizer == "bnb" and spec.bits == 4 and engine.device.type == "cuda":  # pragma: no cover - CUDA
        return "bnb-gemv"
    return "dequant"


def scratch_elems(shape, spec: QuantSpec, kernel: str, rows: int | None = None) -> int:
    """What :meth:`PackedWeight.scratch_elems` will say for this weight (before quantizing)."""
    r, c = shape
    if kernel in packing.LOWBIT_KERNELS:  # a low-bit kernel computes from the packed weight
        return 0
    return min(r, rows or r) * c


def priced_share(engine, elems: float) -> int:
    """``elems`` 16-bit values at the priced geometry, in the engine's byte units (their share of all expert bytes)."""
    g = engine.geometry
    return int(round(elems * g.dtype_bytes / g.all_expert_bytes * engine.total_expert_bytes))


def grouped_dequant(kernels, spec: QuantSpec, shapes) -> bool:
    """Whether a draft step's routed experts are dequantized together (one unpack over the stacked codes of the
    routed experts, one batched GEMM per dequantized projection): at least one weight dequantized, every dequantized
    one in a format of this project's packing (``int``, ``hqq``) that stacks. A projection a low-bit kernel runs
    (int4 at a shape its kernel takes, beside a projection it does not) stays on that kernel, one call per expert;
    bitsandbytes' own layout, or no dequantized weight at all, runs the per-expert path."""
    dequantized = [s for k, s in zip(kernels, shapes) if k == "dequant"]
    return bool(dequantized) and all(packing.StackedWeights.fits(s, spec) for s in dequantized)


SCRATCH_SHARE = 0.05  # the most of a draft's own bytes a grouped dequantization's scratch may take


def draft_chunk(engine, spec: QuantSpec, kernels, shapes) -> int:
    """How many routed experts a draft step dequantizes together: ``top_k`` where their weights' scratch stays
    within ``SCRATCH_SHARE`` of the draft's bytes at the priced geometry (every real model the project prices:
    Mixtral 2, Qwen1.5-MoE 4, DeepSeek-V2-Lite 6), fewer where it would not (a tiny model at its own sizes: 1);
    1 where the format runs per expert."""
    if not grouped_dequant(kernels, spec, shapes):
        return 1
    g = engine.geometry  # at a projection each modeled layer stands for layer_scale real ones, as the bytes do
    draft = spec.bits_per_weight() / 8 * g.num_experts * g.moe_layers * g.layer_scale * g.expert_params
    weight = _priced_dequantized_elems(g, kernels) * g.dtype_bytes  # the larger dequantized projection
    chunk = min(engine.top_k, int(SCRATCH_SHARE * draft // weight))
    return chunk if chunk > 1 else 1


def expert_scratch_bytes(engine, spec: QuantSpec) -> int:
    """Device bytes of the scratch a :class:`QuantizedExperts` with ``spec`` keeps: the largest weight of the experts
    a step dequantizes together (:func:`draft_chunk`; none for a low-bit kernel) in the compute dtype, plus the
    unpacking tables — what it allocates at the model's own geometry; at a projection, the real model's share of as
    many expert weights."""
    gate_up, down = engine.store.weights[next(iter(engine.store.weights))]
    kernels = [kernel_name_for(w.shape, spec, engine) for w in (gate_up, down)]
    experts = draft_chunk(engine, spec, kernels, (gate_up.shape, down.shape))
    if engine.geometry is not engine.own_geometry:
        return priced_share(engine, experts * _priced_dequantized_elems(engine.geometry, kernels))
    elems = max(scratch_elems(w.shape, spec, k) for w, k in zip((gate_up, down), kernels))
    return experts * elems * itemsize(engine.compute_dtype) + bitpack.unpack_table_bytes(spec.bits)


def _priced_dequantized_elems(g, kernels) -> int:
    """At the priced geometry ``g``: values of the larger of an expert's projections that ``kernels`` (gate_up's,
    down's, as the stand-in runs them) dequantize — gate_up [2I, H], down [H, I]; 0 where a low-bit kernel runs both."""
    sizes = (2 * g.expert_intermediate * g.hidden, g.hidden * g.expert_intermediate)
    return max((n for k, n in zip(kernels, sizes) if k == "dequant"), default=0)


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def price_kernel(kernels, spec: QuantSpec):
    """The :class:`~specterbench.engine.lowbit.LowBitKernel` that prices weights run by ``kernels`` (the names
    :class:`~specterbench.engine.packing.PackedWeight` reports): torch's int4 mm and bitsandbytes' 4-bit gemv at
    their measured efficiency, torch's int8 weight-only matmul at gpt-fast's int8 weight-only figure (the same
    layout: int8 codes, one scale per output channel); a weight dequantized into the 16-bit scratch is a 16-bit GEMM,
    its unpacking paid as the scratch's write and read (in the caller's bytes) and the dequantization's launches."""
    kernels = set(kernels)
    if "dequant" in kernels:
        return BF16
    if kernels <= {"int4mm", "bnb-gemv"}:
        return INT4_TORCH
    if kernels == {"int8mm"}:
        return INT8
    return kernel_for(spec)  # pragma: no cover - a kernel this module does not know yet


def quantized_bytes(engine, spec: QuantSpec) -> int:
    """Device bytes of every routed expert quantized with ``spec`` (packed values and metadata) plus the scratch it
    computes with; equals :attr:`QuantizedExperts.nbytes`."""
    item = itemsize(engine.compute_dtype)
    packed = sum(spec.weight_bytes(w.shape, kernel_name_for(w.shape, spec, engine), item)
                 for pair in engine.store.weights.values() for w in pair)
    return packed + expert_scratch_bytes(engine, spec)


_STORES = ("_quantized_experts", "_quantized_dense")


def shared(engine, store: str, spec: QuantSpec, make):
    """The one copy per (engine, ``store``, spec) in this cell, made by ``make(engine, spec)`` the first time."""
    copies = engine.__dict__.setdefault(store, {})
    if spec not in copies:
        copies[spec] = make(engine, spec)
    return copies[spec]


def shared_quantized(engine, spec: QuantSpec) -> "QuantizedExperts":
    """One quantized copy per (engine, spec) within a cell (a strategy and its helpers share it); released with
    every other copy by :func:`release_drafts` when the cell ends. A spec without an error scale takes the model's
    calibration (the copy's ``spec`` says which)."""
    return shared(engine, "_quantized_experts", spec.for_model(engine.model), QuantizedExperts)


def live_drafts(engine) -> list:
    """The quantized copies the engine holds now (this cell's)."""
    return [d for store in _STORES for d in engine.__dict__.get(store, {}).values()]


def drafts_allocated_bytes(engine) -> int:
    """Storage bytes of every live quantized copy, scratch included: the row's ``strategy_device_bytes_allocated``."""
    return sum(d.allocated_bytes() for d in live_drafts(engine))


def release_drafts(engine) -> None:
    """At the end of a cell: free every quantized copy's packed weights and scratch (a strategy object that still
    holds one holds an empty shell), so nothing the next cell is not charged for stays allocated."""
    for d in live_drafts(engine):
        d.release()
    for store in _STORES:
        engine.__dict__.pop(store, None)


class QuantizedExperts:
    """Every routed expert quantized and resident on the device, packed; callable in place of the offloaded cache.

    Each expert's ``gate_up`` [2I, H] and ``down`` [H, I] are :class:`~specterbench.engine.packing.PackedWeight`s:
    int4 (group 32-256) runs torch's int4 weight-only matmul, bitsandbytes 4-bit on CUDA its gemv, every other
    weight is dequantized into one reused scratch buffer: for a draft step (one token), where :func:`draft_chunk`
    allows, the step's routed experts' weights of that projection together (:attr:`stacks`), a projection on a
    low-bit kernel beside it called once per expert; otherwise one weight at a time. Each call records the experts
    it routed to, so a strategy can read the draft's routing.
    """

    def __init__(self, engine, spec: QuantSpec):
        self.engine = engine
        self.spec = spec
        self.nbytes = quantized_bytes(engine, spec)
        self.packed: dict = {}
        for key in engine.store.weights:
            pair = engine.store.values(key)  # the target's values (a quantized target's dequantized from its store)
            scaled = (error_scaled(w.to(engine.device), spec).to(engine.compute_dtype) for w in pair)
            self.packed[key] = tuple(packing.PackedWeight(w, spec, engine.compute_dtype) for w in scaled)
        first = self.packed[next(iter(self.packed))]
        # layer -> (gate_up, down): each a StackedWeights where that projection is dequantized (a step's routed
        # experts dequantized together), None where a low-bit kernel runs it (one call per expert)
        self.stacks: dict = {}
        # layer -> (gate_up, down): where a low-bit kernel runs that projection, each expert's kernel with its
        # operands bound (what _compute_grouped calls once per routed expert); None where it is stacked
        self.kernel_ops: dict = {}
        self.chunk = draft_chunk(engine, spec, [p.kernel for p in first], [p.shape for p in first])
        if self.chunk > 1:  # (a chunk of one runs the per-expert path: fewer launches than a stacked one)
            for layer in range(engine.num_layers):
                pairs = [self.packed[(layer, e)] for e in range(engine.num_experts)]
                stacked = [first[j].kernel == "dequant" for j in (0, 1)]
                self.stacks[layer] = tuple(packing.StackedWeights([p[j] for p in pairs]) if stacked[j] else None
                                           for j in (0, 1))
                self.kernel_ops[layer] = tuple(None if stacked[j] else [p[j].kernel_op() or p[j].linear for p in pairs]
                                               for j in (0, 1))
        elems = max(p.scratch_elems() for p in first) * self.chunk
        self.scratch = torch.empty(elems, dtype=engine.compute_dtype, device=engine.device)
        self.runs = first[0].kernel if first[0].kernel == first[1].kernel else "mixed"  # what computes the draft
        self.kernel = price_kernel([p.kernel for p in first], spec)  # and how the modeled clock prices it
        self.dequantized = sum(p.kernel == "dequant" for p in first) / 2  # share of weights dequantized per call
        # the bytes a kernel reads at the priced dtype (an int4 kernel's table in 16-bit, as on the GPU the clock
        # prices), over 16-bit weights (the cost model's unit), whatever the target's own precision
        packed_bytes = sum(p.spec.weight_bytes(p.shape, p.kernel, PRICED_DTYPE_BYTES)
                           for pair in self.packed.values() for p in pair)
        self.stored_ratio = packed_bytes / (PRICED_DTYPE_BYTES * engine.store.total_params)
        # what computing an expert reads and writes over a 16-bit expert's bytes, the price strategies estimate
        # with: the packed bytes, plus a 16-bit write and read of the scratch where a weight is dequantized
        self.bytes_ratio = self.stored_ratio + 2 * self.dequantized
        self.routing: list[tuple[int, list[int], list[int]]] = []  # (layer, experts, tokens per expert)
        self.layer_launches, self.chunk_launches, self.expert_launches = self._count_launches()

    def allocated_bytes(self) -> int:
        """Storage bytes of every tensor this copy holds on its device, scratch and unpacking tables included."""
        if not self.packed:
            return 0  # released
        held = sum(p.nbytes() for pair in self.packed.values() for j, p in enumerate(pair)
                   if not self.stacks or self.stacks[0][j] is None)  # a kernel's own weights
        # a stacked projection's weights are views of their layer's stack: count the stacks once
        held += sum(w.nbytes() for pair in self.stacks.values() for w in pair if w is not None)
        return held + bitpack.storage_bytes(self.scratch) + bitpack.unpack_table_bytes(self.spec.bits)

    def release(self) -> None:
        """Free the packed weights and the scratch (the end of the cell)."""
        self.packed, self.stacks, self.kernel_ops, self.scratch = {}, {}, {}, torch.empty(0)

    def weights(self, key):
        """Dense weights of one quantized expert, dequantized into new tensors (a substitute for a missed one)."""
        return tuple(p.dequantize(self.engine.compute_dtype) for p in self.packed[key])

    def __call__(self, layer, act_fn, hidden, top_k_index, top_k_weights):  # [T, H], [T, k], [T, k]
        out, groups = self._compute(layer, act_fn, hidden, top_k_index, top_k_weights)
        self.routing.append((layer, groups.experts, groups.tokens_per_expert))
        self.charge_fused(groups.tokens_per_expert)
        return out

    def _compute(self, layer, act_fn, hidden, top_k_index, top_k_weights):  # -> [T, H], TokenGroups
        groups = group_tokens(top_k_index, top_k_weights, self.engine.num_experts)
        if self.stacks and hidden.shape[0] == 1:  # a draft step: its k experts dequantized and multiplied together
            return self._compute_grouped(layer, act_fn, hidden, top_k_index, top_k_weights, groups.ids[0]), groups
        return self._compute_loop(layer, act_fn, hidden, groups), groups

    def _compute_loop(self, layer, act_fn, hidden, groups):  # [T, H] -> [T, H]: one expert at a time
        out = torch.zeros_like(hidden)  # [T, H]
        for e, token_idx, scale in groups:  # token_idx [n], scale [n, 1]
            gate_up, down = self.packed[(layer, e)]
            gate, up = gate_up.linear(hidden[token_idx], self.scratch).chunk(2, dim=-1)
            y = down.linear(act_fn(gate) * up, self.scratch) * scale  # [n, H]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out

    def _compute_grouped(self, layer, act_fn, hidden, top_k_index, top_k_weights, ids):  # [1, H] -> [1, H]
        """One token's routed experts (``ids``: their numbers on the host, as the layer's one routing read gave
        them), in its routing's order: a dequantized projection's k weights dequantized into the scratch in one pass
        over the stacked codes, then one batched GEMM (the scratch is reused for ``down``); a projection a low-bit
        kernel runs, that kernel once per expert, the results stacked for the other projection's batched GEMM."""
        gate_up, down = self.stacks[layer]
        gate_up_ops, down_ops = self.kernel_ops[layer]
        out, h, hidden = None, hidden.shape[1], hidden.contiguous()  # (the bound kernels take contiguous inputs)
        for lo in range(0, top_k_index.shape[1], self.chunk):  # chunks of the routed experts (distinct)
            experts = top_k_index[0, lo:lo + self.chunk]  # [c]
            c = experts.shape[0]
            if gate_up is not None:
                x = hidden.expand(c, h).unsqueeze(1)  # [c, 1, H]
                gu = torch.bmm(x, gate_up.dequantize(experts, self.scratch).transpose(1, 2))  # [c, 1, 2I]
            else:
                gu = torch.stack([gate_up_ops[e](hidden) for e in ids[lo:lo + c]])  # [c, 1, 2I]
            gate, up = gu.chunk(2, dim=-1)
            a = act_fn(gate) * up  # [c, 1, I]
            if down is not None:
                y = torch.bmm(a, down.dequantize(experts, self.scratch).transpose(1, 2))  # [c, 1, H]
            else:
                y = torch.stack([down_ops[e](a[i]) for i, e in enumerate(ids[lo:lo + c])])
            part = torch.mm(top_k_weights[:, lo:lo + c].to(y.dtype), y.view(c, h))  # [1, H]
            out = part if out is None else out + part
        return out.to(hidden.dtype)

    def _count_launches(self) -> tuple[int, int, int]:
        """(launches once per layer, per chunk of :attr:`chunk` experts, per expert) of :meth:`_compute` for one
        token, counted on this copy's own kernels under inference mode as the engine runs it: one token routed to one
        expert, to two (one chunk, where a chunk holds two) and to ``chunk + 1`` (a second chunk), after a call that
        builds the lazily made unpacking tables. Launches a chunk's size changes (a low-bit kernel's projection, one
        call per expert; every launch of the per-expert path) are per expert; what :meth:`charge_fused` charges, not a
        typed constant."""

        engine, silu = self.engine, torch.nn.functional.silu
        h = next(iter(self.packed.values()))[1].shape[0]
        x = torch.zeros(1, h, dtype=engine.compute_dtype, device=engine.device)  # [1, H]
        counts = []
        with torch.inference_mode():
            for k in (1, 1, 2, self.chunk + 1):  # the first call builds the tables and is not counted
                idx = torch.arange(k, device=engine.device).view(1, k)  # [1, k]
                w = torch.full((1, k), 1.0 / k, dtype=engine.compute_dtype, device=engine.device)
                with LaunchCounter() as counter:
                    self._compute(0, silu, x, idx, w)
                counts.append(counter.total)
        one, two, spill = counts[1:]
        if self.chunk == 1:  # one expert at a time: every launch but the layer's is an expert's
            per_expert, per_chunk = two - one, 0
        else:
            per_expert = two - one  # one chunk either way: what the second expert added
            per_chunk = spill - one - self.chunk * per_expert
        return one - per_chunk - per_expert, per_chunk, per_expert

    def fused_op(self, tokens_per_expert):
        """One layer's routed experts as this copy runs them: every routed expert's FLOPs and bytes read by the
        kernel that runs them (where the format has no low-bit kernel, each expert's weights also written to and
        read from the 16-bit scratch), with the launches its expert path was counted to issue
        (:meth:`_count_launches`) — what :meth:`charge_fused` charges and what a strategy's estimate reads."""
        costs = self.engine.clock.costs
        n = len(tokens_per_expert)
        launches = self.layer_launches + self.chunk_launches * -(-n // self.chunk) + self.expert_launches * n
        op = costs.experts_fused(tokens_per_expert, self.bytes_ratio, self.kernel)
        return op._replace(launches=round(launches * costs.geometry.layer_scale))

    def fused_s(self, tokens_per_expert) -> float:
        """Modeled seconds of :meth:`fused_op`."""
        return self.engine.clock.costs.op_seconds(*self.fused_op(tokens_per_expert))

    def charge_fused(self, n_tokens) -> None:
        """Charge one layer's routed experts (:meth:`fused_op`) to the clock."""
        self.engine.charge(self.fused_op(n_tokens))
