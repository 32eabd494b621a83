"""The one cost model: what every operation costs, and the estimates strategies decide with.

Every time the modeled clock charges comes from :class:`CostModel`; the engine prices each operation through it
and a strategy asks :class:`CostEstimates` (``engine.costs``) the same questions, so an estimate equals what the
modeled clock will charge for the same operation on an idle resource. All times are **seconds** (float), all
sizes **bytes**; "now" is the clock's ``now()`` (modeled: seconds since the cell's clock started; measured:
``time.perf_counter()``). On a measured clock the prices come from the profile the run was given (or one measured
with ``specterbench calibrate``) and the link bandwidth from the copies timed so far.

What a strategy asks (``engine.costs``) is :mod:`specterbench.engine.estimates`.

Launches: every op's launch count comes from the engine's description of the kernels it launches
(:class:`~specterbench.engine.kernels.KernelCounts`, ``CostModel.kernels``; the engine counts its model's own).

Prices (the profile's fields, see :mod:`specterbench.engine.profiles`): a device op costs ``launches · launch_us +
max(flops / flops_per_s, bytes / (mem_bytes_per_s · efficiency), dequant ops / alu_ops_per_s)``, where a low-bit
kernel's efficiency and dequantization instructions per weight come from :mod:`specterbench.engine.lowbit` (16-bit:
1 and 0); a copy ``link_latency_us + bytes / link_bytes_per_s`` (a synchronous copy from pageable memory: ``bytes /
pageable_link_bytes_per_s``, serial with compute; a copy device→host, ``lru.swap``'s write-back of an evicted expert:
``bytes / link_bytes_per_s``, see :meth:`CostModel.d2h_copy_seconds`); a host
expert ``host.launch_us + max(flops / (kernel.flops_per_s · threads / host.threads), weight bytes / min(DRAM share,
kernel.bytes_per_s))`` plus one activation hop each way (``link_latency_us + activation bytes / link_bytes_per_s``),
where ``kernel`` is the host profile's expert kernel for the experts' stored precision (bf16, int8, int4:
:mod:`specterbench.engine.host_kernels`) and the DRAM share is ``host.mem_bytes_per_s`` while the link is idle and
``host.mem_bytes_per_s - link_bytes_per_s`` while it copies (host memory is one resource:
:meth:`CostModel.host_dram_share`) — or, with ``cpu-experts.torch_bf16`` (Fiddler's CPU path), the host profile's
``torch_bf16_bytes_per_s`` where that is lower. Bytes and FLOPs come from the geometry,
each multiplied by ``layer_scale``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

from specterbench.engine.geometry import Geometry
from specterbench.engine.host_kernels import KernelRate, kernel_precision
from specterbench.engine.kernels import DEFAULT_KERNELS, KernelCounts
from specterbench.engine.lowbit import BF16, LowBitKernel, kernel_for_ratio
from specterbench.engine.profiles import HardwareProfile, HostProfile

if TYPE_CHECKING:  # pragma: no cover
    pass


class Op(NamedTuple):
    """One device operation as the clock charges it: ``clock.compute(*op)``. A low-bit kernel's op carries its
    dequantization instructions and the achieved bandwidth efficiency of the bytes it reads (byte-weighted over its
    low-bit and 16-bit parts; :mod:`specterbench.engine.lowbit`)."""

    flops: float
    nbytes: float
    launches: int = 1
    alu_ops: float = 0.0
    efficiency: float = 1.0
    graph_nodes: int = 0  # kernels replayed from a captured CUDA graph (``launches`` then counts the replays)


class HostOp(NamedTuple):
    """One expert on the host: ``clock.run_on_host(fn, op, threads)``."""

    flops: float
    weight_bytes: float
    act_bytes: float  # activations one way (they go down and come back: two hops)


class CostModel:
    """Prices of every operation at a geometry on a hardware profile (and a host profile for host experts)."""

    def __init__(self, profile: HardwareProfile, geometry: Geometry, host: HostProfile | None = None,
                 kernels: KernelCounts = DEFAULT_KERNELS):
        self.profile = profile
        self.geometry = geometry
        self.host = host
        self.kernels = kernels  # launches per op: the engine's own description (``Engine._bind`` sets its model's)
        # the rate a host expert's kernel streams its weights at when DRAM is not the limit; None: DRAM decides
        # (``engine.use_torch_bf16_host``: the host profile's ``torch_bf16_bytes_per_s``, Fiddler's CPU path)
        self.host_kernel_bytes_per_s: float | None = None

    def _launches(self, per_layer: int) -> int:
        return round(per_layer * self.geometry.layer_scale)

    # ---- what an operation is (FLOPs, bytes, launches) ----------------------------------------------
    @staticmethod
    def _lowbit(flops: float, weights: float, bytes_ratio: float, kernel: LowBitKernel | None, other_bytes: float,
                launches: int, dtype_bytes: int) -> Op:
        """An op reading ``weights`` weights stored at ``bytes_ratio`` of 16-bit with ``kernel`` (inferred from the
        ratio when None) plus ``other_bytes`` read at the 16-bit kernel's efficiency (router, KV cache)."""
        kernel = kernel if kernel is not None else kernel_for_ratio(bytes_ratio)
        q_bytes = weights * dtype_bytes * bytes_ratio
        total = q_bytes + other_bytes
        if kernel is BF16 or total <= 0:
            return Op(flops, total, launches)
        efficiency = total / (q_bytes / kernel.bandwidth_efficiency + other_bytes)
        return Op(flops, total, launches, weights * kernel.dequant_ops_per_weight, efficiency)

    def dense_layer(self, n_tokens: int, context: int, moe: bool, bytes_ratio: float = 1.0,
                    kernel: LowBitKernel | None = None, captured: bool = False, requests: int = 1) -> Op:
        """The non-routed part of one decoder layer over ``n_tokens`` new tokens at ``context`` positions
        (``bytes_ratio`` < 1: a draft's low-bit copy of its weights, run with ``kernel``; the router and the KV cache
        stay 16-bit). ``captured``: the engine replays the MoE layer's capturable pieces (router, shared experts;
        :mod:`specterbench.engine.graphs`) from CUDA graphs — their kernels are graph nodes, each piece one replay
        launch, the rest eager launches. ``requests``: a batched step's requests, ``n_tokens`` over all of them;
        the weights are read once, each request's own KV cache of ``context`` positions is read by its attention."""
        g = self.geometry
        params = g.layer_dense_params(moe)
        router = g.hidden * g.num_experts if moe else 0
        kv_bytes = 2 * context * g.kv_heads * g.head_dim * g.dtype_bytes * requests
        s = g.layer_scale
        k = self.kernels
        op = self._lowbit(s * (2 * n_tokens * params + 4 * n_tokens * context * g.heads * g.head_dim),
                          s * (params - router), bytes_ratio, kernel, s * (router * g.dtype_bytes + kv_bytes),
                          self._launches(k.moe_layer_dense if moe else k.dense_layer), g.dtype_bytes)
        if not (captured and moe and k.moe_layer_pieces):
            return op
        return op._replace(launches=self._launches(k.moe_layer_dense - k.moe_layer_captured + k.moe_layer_pieces),
                           graph_nodes=self._launches(k.moe_layer_captured))

    def target_read(self) -> tuple[float, LowBitKernel | None]:
        """``(bytes_ratio, kernel)`` of the target's own experts as the engine runs them: 16-bit, the grouped op
        over the stored bytes; packed (``--expert-bits`` < 16, ``kernels.target_expert`` counted), each expert
        dequantized into the 16-bit scratch and multiplied there — the packed bytes read, the scratch written and
        read back (2 × a 16-bit expert's bytes), by a 16-bit GEMM."""
        g = self.geometry
        stored = g.expert_bytes / (g.expert_params * g.dtype_bytes)
        if self.kernels.target_expert:
            return stored + 2.0, BF16
        return stored, None

    def expert(self, n_tokens: int, bytes_ratio: float | None = None, kernel: LowBitKernel | None = None) -> Op:
        """One routed expert over ``n_tokens`` (``bytes_ratio``: its weight bytes over a 16-bit expert's; a low-bit
        copy runs with ``kernel``, inferred from the ratio when None). No ratio: the target's own expert as the
        engine runs it (:meth:`target_read`: 16-bit, or its packed bytes dequantized into the scratch, with the
        launches counted on that path)."""
        g = self.geometry
        launches = self.kernels.per_expert
        if bytes_ratio is None:
            bytes_ratio, kernel = self.target_read()
            launches = self.kernels.target_expert or launches
        return self._lowbit(g.layer_scale * 2 * n_tokens * g.expert_params, g.layer_scale * g.expert_params,
                            bytes_ratio, kernel, 0.0, self._launches(launches), g.dtype_bytes)

    def target_layer(self) -> Op:
        """What a layer of packed target experts launches once, whatever its experts (the routing's host read,
        the combine): nothing else is read."""
        return Op(0.0, 0.0, self._launches(self.kernels.target_layer))

    def experts_fused(self, tokens_per_expert: Sequence[int], bytes_ratio: float = 1.0,
                      kernel: LowBitKernel | None = None) -> Op:
        """A draft layer's routed experts (e.g. a W4A16 draft): every expert's weights read once, each unpacked by
        ``kernel``; the launches the draft's expert path issues (one grouping read plus each expert's, as it runs
        them today)."""
        g = self.geometry
        launches = self.kernels.per_expert_layer + self.kernels.per_expert * len(tokens_per_expert)
        return self._lowbit(g.layer_scale * 2 * sum(tokens_per_expert) * g.expert_params,
                            g.layer_scale * g.expert_params * len(tokens_per_expert), bytes_ratio, kernel, 0.0,
                            self._launches(launches), g.dtype_bytes)

    def experts_grouped(self, tokens_per_expert: Sequence[int], bytes_ratio: float | None = None,
                        kernel: LowBitKernel | None = None) -> Op:
        """A layer's device experts as one grouped op over the slot pool (every expert's weights read once at the
        target's stored precision unless ``bytes_ratio`` says otherwise, the grouped op's launches whatever the
        experts and tokens)."""
        g = self.geometry
        launches = self.kernels.grouped_experts
        if bytes_ratio is None:
            bytes_ratio, kernel = self.target_read()
            if self.kernels.target_expert:  # packed: one expert at a time (no grouped kernel reads packed formats)
                launches = self.kernels.target_layer + self.kernels.target_expert * len(tokens_per_expert)
        return self._lowbit(g.layer_scale * 2 * sum(tokens_per_expert) * g.expert_params,
                            g.layer_scale * g.expert_params * len(tokens_per_expert), bytes_ratio, kernel, 0.0,
                            self._launches(launches), g.dtype_bytes)

    def sample(self, rows: int) -> Op:
        """The on-device Gumbel-max sampler over ``rows`` rows of logits: hash, noise, argmax (fp32)."""
        v = self.geometry.vocab
        return Op(30 * rows * v, 4 * 6 * rows * v, self.kernels.sample)

    def head(self, rows: int, bytes_ratio: float = 1.0, kernel: LowBitKernel | None = None) -> Op:
        g = self.geometry
        return self._lowbit(2 * rows * g.vocab * g.hidden, g.vocab * g.hidden, bytes_ratio, kernel, 0.0,
                            self.kernels.forward, g.dtype_bytes)

    def router(self, n_tokens: int) -> Op:
        g = self.geometry
        return Op(g.layer_scale * 2 * n_tokens * g.hidden * g.num_experts,
                  g.layer_scale * g.hidden * g.num_experts * g.dtype_bytes, 1)

    def host_expert(self, n_tokens: int) -> HostOp:
        g = self.geometry
        return HostOp(g.layer_scale * 2 * n_tokens * g.expert_params, g.layer_scale * g.expert_bytes,
                      2 * n_tokens * g.hidden * g.dtype_bytes)

    @property
    def expert_copy_bytes(self) -> int:
        """Bytes one expert copy is priced at (the geometry's expert, per modeled layer)."""
        return int(self.geometry.expert_bytes * self.geometry.layer_scale)

    # ---- what it costs (seconds) --------------------------------------------------------------------
    def op_seconds(self, flops: float, nbytes: float, launches: int = 1, alu_ops: float = 0.0,
                   efficiency: float = 1.0, graph_nodes: int = 0) -> float:
        """``launches · launch_us + graph_nodes · graph_node_us + max(flops / flops_per_s, bytes / (mem_bytes_per_s ·
        efficiency), alu_ops / alu_ops_per_s)``: tensor cores, the memory stream and a low-bit kernel's unpacking
        overlap; the slowest decides. Kernels replayed from a captured CUDA graph cost ``graph_node_us`` each; the
        replay itself is one of ``launches``."""
        p = self.profile
        t = max(flops / p.flops_per_s, nbytes / (p.mem_bytes_per_s * efficiency))
        if alu_ops:
            t = max(t, alu_ops / self.alu_ops_per_s)
        return launches * p.launch_us * 1e-6 + graph_nodes * p.graph_node_us * 1e-6 + t

    @property
    def alu_ops_per_s(self) -> float:
        """The profile's CUDA-core instruction rate (not stated: ``flops_per_s / 16``, the A100's ratio)."""
        return self.profile.alu_ops_per_s or self.profile.flops_per_s / 16

    def copy_seconds(self, nbytes: int) -> float:
        return self.profile.link_latency_us * 1e-6 + nbytes / self.profile.link_bytes_per_s

    def pageable_copy_seconds(self, nbytes: int) -> float:
        """A synchronous copy from pageable host memory (``tensor.to(device)`` from unpinned memory): latency plus
        bytes at the profile's ``pageable_link_bytes_per_s`` (a one-line UsageError when the profile lacks it).
        The compute stream waits for the whole of it (:meth:`~specterbench.engine.clocks.Clock.copy_sync`)."""
        return self.profile.link_latency_us * 1e-6 + nbytes / self.profile.pageable_bytes_per_s()

    def d2h_copy_seconds(self, nbytes: int) -> float:
        """A copy device→host into pinned host memory (``lru.swap=true``: the evicted expert written back, as
        Mixtral-Offloading's ``ExpertCache._swap`` does): latency plus bytes at the profile's ``link_bytes_per_s``. A
        profile states the pinned host→device rate only; pinned device→host measures the same on the hosts the
        profiles cite (CUDA samples bandwidthTest, pinned: a DGX A100 on PCIe4 25.7 GB/s host→device, 25.8
        device→host at 32 MB, github.com/gengwg/gpu ``nvda_gpu_benchmark.md``; a Quadro RTX 6000 on PCIe3 11.0 and
        12.0 GB/s at 1 MiB, github.com/npho/cse554 ``assignment1/host_GPU/README.md``), so the price errs by at most
        that 9%, on the slow side. PCIe is full duplex: this copy does not hold the host→device link; it holds the
        stream it is issued on (:meth:`~specterbench.engine.clocks.Clock.copy_on_compute`)."""
        return self.profile.link_latency_us * 1e-6 + nbytes / self.profile.link_bytes_per_s

    def hop_seconds(self, act_bytes: float) -> float:
        """Activations of a host expert crossing the link one way (small, full duplex: they do not queue)."""
        return self.profile.link_latency_us * 1e-6 + act_bytes / self.profile.link_bytes_per_s

    def host_seconds(self, op: HostOp, threads: int) -> float:
        """The host's own work on ``op`` with ``threads`` of its threads on an idle link (the hops not included)."""
        h = self._host()
        idle, _ = self.host_dram_share()
        return h.launch_us * 1e-6 + max(self.host_compute_seconds(op, threads), op.weight_bytes / idle)

    def _host(self) -> HostProfile:
        if self.host is None:
            raise ValueError("this cost model has no host profile; give the run a --host-profile")
        return self.host

    def host_kernel(self) -> KernelRate:
        """The host's expert kernel at the geometry's expert precision (a one-line UsageError when the host
        profile does not state it)."""
        return self._host().kernel_rate(kernel_precision(self.geometry.expert_bits_per_weight))

    def host_compute_seconds(self, op: HostOp, threads: int) -> float:
        """The arithmetic of ``op`` on ``threads`` of the host's threads at the expert kernel's FLOP/s (its floor
        when DRAM keeps up)."""
        h = self._host()
        return op.flops / (self.host_kernel().flops_per_s * min(threads, h.threads) / h.threads)

    def host_dram_share(self) -> tuple[float, float]:
        """Host DRAM bytes/s left for host expert compute: ``(link idle, link copying)``.

        The sharing rule: host memory is one resource of ``host.mem_bytes_per_s`` (sustained, all channels). A copy
        on the link is a DMA read of host memory at the link's rate, and the link is the narrower pipe, so the
        memory controller serves it at that rate; the host's cores get the rest while a copy runs, all of it
        otherwise. The memory controller arbitrates between the cores and the DMA engine, so the cores keep at least
        half of it: where the link would take more (a host barely faster than its link, a measured CPU-only
        profile), the link is the one held back, which is not modeled (copies keep the profile's rate). The
        activation hops of host experts are a few KB: not counted.

        A host expert kernel slower than DRAM (``host_kernel_bytes_per_s``, set by
        :meth:`~specterbench.engine.engine.Engine.use_torch_bf16_host`: PyTorch's bf16 GEMVs on a CPU without
        AVX512_BF16, Fiddler's CPU path), or the host's expert kernel at the experts' precision
        (:meth:`host_kernel`), streams at its own rate whenever that is below the share."""
        h = self._host()
        b = h.mem_bytes_per_s
        idle, shared = b, max(b - self.profile.link_bytes_per_s, b / 2)
        for cap in (self.host_kernel().bytes_per_s, self.host_kernel_bytes_per_s):
            if cap is not None:
                idle, shared = min(idle, cap), min(shared, cap)
        return idle, shared

    def host_dram_finish(self, start: float, compute_s: float, weight_bytes: float,
                         busy: Sequence[tuple[float, float]]) -> tuple[float, float]:
        """When a host expert started at ``start`` finishes, its weights streamed at :meth:`host_dram_share`'s
        rate through the link's busy intervals ``busy`` ((start, end), in time order, disjoint); never before its
        launch plus ``compute_s``. Returns (finish, seconds it streamed while a copy ran)."""
        idle, shared = self.host_dram_share()
        t = start + self._host().launch_us * 1e-6
        floor, left, overlap = t + compute_s, float(weight_bytes), 0.0
        for a, b in busy:
            if b <= t or left <= 0:
                continue
            if a > t:  # the link is idle until a
                if (a - t) * idle >= left:
                    break
                left -= (a - t) * idle
                t = a
            if (b - t) * shared >= left:
                overlap += left / shared
                t += left / shared
                left = 0.0
                break
            left -= (b - t) * shared
            overlap += b - t
            t = b
        end = t + left / idle
        return max(end, floor), overlap

    def host_seconds_shared(self, op: HostOp, threads: int, link_busy_s: float) -> float:
        """The host's own work on ``op`` when the link copies for the first ``link_busy_s`` seconds of it."""
        end, _ = self.host_dram_finish(0.0, self.host_compute_seconds(op, threads), op.weight_bytes,
                                       [(0.0, link_busy_s)] if link_busy_s > 0 else [])
        return end

    def host_expert_seconds(self, n_tokens: int, threads: int) -> float:
        """One expert on an idle host, from activations leaving the device to the result back on it."""
        op = self.host_expert(n_tokens)
        return 2 * self.hop_seconds(op.act_bytes) + self.host_seconds(op, threads)
