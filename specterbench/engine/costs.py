"""The one cost model: what every operation costs, and the estimates strategies decide with.

Every time the modeled clock charges comes from :class:`CostModel`; the engine prices each operation through it
and a strategy asks :class:`CostEstimates` (``engine.costs``) the same questions, so an estimate equals what the
modeled clock will charge for the same operation on an idle resource. All times are **seconds** (float), all
sizes **bytes**; "now" is the clock's ``now()`` (modeled: seconds since the cell's clock started; measured:
``time.perf_counter()``). On a measured clock the prices come from the profile the run was given (or one measured
with ``specterbench calibrate``) and the link bandwidth from the copies timed so far.

``engine.costs`` — estimates for strategies (all return seconds unless said otherwise)

=====================================  ===========================================================================
call                                   meaning
=====================================  ===========================================================================
``copy_s()``                           one expert copy host→device on an idle link (latency + bytes / bandwidth)
``expert_s(n_tokens, bytes_ratio=1)``  one expert over ``n_tokens`` on the device, alone (``bytes_ratio`` < 1: low-bit)
``expert_in_layer_s(n_tokens)``        what one more expert adds to its layer's grouped op (its FLOPs and bytes, no
                                       launches: the grouped op's launches do not depend on how many experts run)
``experts_fused_s(tokens, ratio)``     one fused kernel over several experts, ``tokens`` = tokens per expert
                                       (e.g. a 4-bit draft layer: ``experts_fused_s(counts, 0.258)``)
``experts_grouped_s(tokens)``          a layer's device experts as the engine runs them: one grouped op
``layer_s(n_tokens, moe=True)``        the non-routed part of one layer (attention, router, shared expert);
                                       ``bytes_ratio=`` < 1 prices a draft's low-bit copy of its weights
``head_s(rows=1)``                     the output head over ``rows`` positions (``bytes_ratio=`` as above)
``router_s(n_tokens)``                 applying one router (gate) to ``n_tokens`` hidden states
``host_expert_s(n_tokens)``            one expert on the host CPU, activations down and back included, host idle
``link_backlog_s(priority=None)``      until a copy issued now would *start*: the copy on the link plus every
                                       queued copy that outranks it (None: every queued copy)
``copy_arrival_s(priority=None)``      ``link_backlog_s(priority) + copy_s()``: until a copy issued now *lands*
``host_backlog_s()``                   until the host finishes the experts it has been given (the misses of the
                                       layer being placed included)
``until_layer_s(layer)``               until the experts of MoE ``layer`` of the current forward are needed,
                                       assuming every expert in between hits (the layer itself included when it
                                       is the current one: 0.0); a ``layer`` already passed means the next forward
``now_s()``                            the clock's time
``link_bytes_per_s()``                 link bandwidth: measured from finished copies, else the profile's (bytes/s)
``host_threads_available``             host threads the clock models or the machine has (int)
=====================================  ===========================================================================

Launches: every op's launch count comes from the engine's description of the kernels it launches
(:class:`~specterbench.engine.kernels.KernelCounts`, ``CostModel.kernels``; the engine counts its model's own).

Prices (the profile's fields, see :mod:`specterbench.engine.profiles`): a device op costs ``launches · launch_us +
max(flops / flops_per_s, bytes / mem_bytes_per_s)``; a copy ``link_latency_us + bytes / link_bytes_per_s``; a host
expert ``host.launch_us + max(flops / (host.flops_per_s · threads / host.threads), weight bytes /
host.mem_bytes_per_s)`` plus one activation hop each way (``link_latency_us + activation bytes /
link_bytes_per_s``). Bytes and FLOPs come from the geometry, each multiplied by ``layer_scale``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

from specterbench.engine.geometry import Geometry
from specterbench.engine.kernels import DEFAULT_KERNELS, KernelCounts
from specterbench.engine.profiles import HardwareProfile, HostProfile

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine


class Op(NamedTuple):
    """One device operation as the clock charges it: ``clock.compute(*op)``."""

    flops: float
    nbytes: float
    launches: int = 1


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

    def _launches(self, per_layer: int) -> int:
        return round(per_layer * self.geometry.layer_scale)

    # ---- what an operation is (FLOPs, bytes, launches) ----------------------------------------------
    def dense_layer(self, n_tokens: int, context: int, moe: bool, bytes_ratio: float = 1.0) -> Op:
        """The non-routed part of one decoder layer over ``n_tokens`` new tokens at ``context`` positions
        (``bytes_ratio`` < 1: a draft's low-bit copy of its weights; the router and the KV cache stay 16-bit)."""
        g = self.geometry
        params = g.layer_dense_params(moe)
        router = g.hidden * g.num_experts if moe else 0
        kv_bytes = 2 * context * g.kv_heads * g.head_dim * g.dtype_bytes
        weight_bytes = ((params - router) * bytes_ratio + router) * g.dtype_bytes
        return Op(g.layer_scale * (2 * n_tokens * params + 4 * n_tokens * context * g.heads * g.head_dim),
                  g.layer_scale * (weight_bytes + kv_bytes),
                  self._launches(self.kernels.moe_layer_dense if moe else self.kernels.dense_layer))

    def expert(self, n_tokens: int, bytes_ratio: float = 1.0) -> Op:
        """One routed expert over ``n_tokens`` (``bytes_ratio``: its weight bytes over a 16-bit expert's)."""
        g = self.geometry
        return Op(g.layer_scale * 2 * n_tokens * g.expert_params, g.layer_scale * g.expert_bytes * bytes_ratio,
                  self._launches(self.kernels.per_expert))

    def experts_fused(self, tokens_per_expert: Sequence[int], bytes_ratio: float = 1.0) -> Op:
        """A draft layer's routed experts (e.g. a W4A16 draft): every expert's weights read once; the launches the
        draft's expert path issues (one grouping read plus each expert's, as it runs them today)."""
        g = self.geometry
        launches = self.kernels.per_expert_layer + self.kernels.per_expert * len(tokens_per_expert)
        return Op(g.layer_scale * 2 * sum(tokens_per_expert) * g.expert_params,
                  g.layer_scale * g.expert_bytes * bytes_ratio * len(tokens_per_expert), self._launches(launches))

    def experts_grouped(self, tokens_per_expert: Sequence[int], bytes_ratio: float = 1.0) -> Op:
        """A layer's device experts as one grouped op over the slot pool (every expert's weights read once, the
        grouped op's launches whatever the experts and tokens)."""
        g = self.geometry
        return Op(g.layer_scale * 2 * sum(tokens_per_expert) * g.expert_params,
                  g.layer_scale * g.expert_bytes * bytes_ratio * len(tokens_per_expert),
                  self._launches(self.kernels.grouped_experts))

    def sample(self, rows: int) -> Op:
        """The on-device Gumbel-max sampler over ``rows`` rows of logits: hash, noise, argmax (fp32)."""
        v = self.geometry.vocab
        return Op(30 * rows * v, 4 * 6 * rows * v, self.kernels.sample)

    def head(self, rows: int, bytes_ratio: float = 1.0) -> Op:
        g = self.geometry
        return Op(2 * rows * g.vocab * g.hidden, g.vocab * g.hidden * g.dtype_bytes * bytes_ratio,
                  self.kernels.forward)

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
    def op_seconds(self, flops: float, nbytes: float, launches: int = 1) -> float:
        p = self.profile
        return launches * p.launch_us * 1e-6 + max(flops / p.flops_per_s, nbytes / p.mem_bytes_per_s)

    def copy_seconds(self, nbytes: int) -> float:
        return self.profile.link_latency_us * 1e-6 + nbytes / self.profile.link_bytes_per_s

    def hop_seconds(self, act_bytes: float) -> float:
        """Activations of a host expert crossing the link one way (small, full duplex: they do not queue)."""
        return self.profile.link_latency_us * 1e-6 + act_bytes / self.profile.link_bytes_per_s

    def host_seconds(self, op: HostOp, threads: int) -> float:
        """The host's own work on ``op`` with ``threads`` of its threads (the hops not included)."""
        h = self.host
        if h is None:
            raise ValueError("this cost model has no host profile; give the run a --host-profile")
        used = min(threads, h.threads) / h.threads
        return h.launch_us * 1e-6 + max(op.flops / (h.flops_per_s * used), op.weight_bytes / h.mem_bytes_per_s)

    def host_expert_seconds(self, n_tokens: int, threads: int) -> float:
        """One expert on an idle host, from activations leaving the device to the result back on it."""
        op = self.host_expert(n_tokens)
        return 2 * self.hop_seconds(op.act_bytes) + self.host_seconds(op, threads)


class CostEstimates:
    """``engine.costs``: the cost model's answers at the engine's geometry and its clock's present state."""

    def __init__(self, engine: "Engine"):
        self._engine = engine

    @property
    def model(self) -> CostModel:
        return self._engine.clock.costs

    @property
    def host_threads_available(self) -> int:
        return self._engine.clock.host_threads_available

    def copy_s(self) -> float:
        return self.model.copy_seconds(self.model.expert_copy_bytes)

    def expert_s(self, n_tokens: int, bytes_ratio: float = 1.0) -> float:
        return self.model.op_seconds(*self.model.expert(n_tokens, bytes_ratio))

    def experts_fused_s(self, tokens_per_expert: Sequence[int], bytes_ratio: float = 1.0) -> float:
        return self.model.op_seconds(*self.model.experts_fused(tokens_per_expert, bytes_ratio))

    def layer_s(self, n_tokens: int, moe: bool = True, bytes_ratio: float = 1.0) -> float:
        return self.model.op_seconds(*self.model.dense_layer(n_tokens, self._engine.context_len, moe, bytes_ratio))

    def expert_in_layer_s(self, n_tokens: int) -> float:
        flops, nbytes, _ = self.model.expert(n_tokens)
        return self.model.op_seconds(flops, nbytes, 0)

    def experts_grouped_s(self, tokens_per_expert: Sequence[int]) -> float:
        return self.model.op_seconds(*self.model.experts_grouped(tokens_per_expert))

    def head_s(self, rows: int = 1, bytes_ratio: float = 1.0) -> float:
        return self.model.op_seconds(*self.model.head(rows, bytes_ratio))

    def router_s(self, n_tokens: int) -> float:
        return self.model.op_seconds(*self.model.router(n_tokens))

    def host_expert_s(self, n_tokens: int) -> float:
        return self.model.host_expert_seconds(n_tokens, self._engine.host_threads)

    def link_backlog_s(self, priority: float | None = None) -> float:
        return self._engine.clock.link_backlog_s(priority)

    def copy_arrival_s(self, priority: float | None = None) -> float:
        return self.link_backlog_s(priority) + self.copy_s()

    def host_backlog_s(self) -> float:
        return self._engine.clock.host_backlog_s() + self._engine.host_placed_s

    def now_s(self) -> float:
        return self._engine.clock.now()

    def link_bytes_per_s(self) -> float:
        return self._engine.clock.link_bytes_per_s()

    def until_layer_s(self, layer: int) -> float:
        e = self._engine
        current, T, g = e.current_layer, e.forward_tokens, e.geometry
        per_layer = self.layer_s(T) + self._experts_of_a_layer_s(T)
        if current is None:  # between forwards: the next one starts with its dense layers
            return (g.layers - g.moe_layers) * self.layer_s(T, moe=False) + layer * per_layer + self.layer_s(T)
        if layer == current:
            return 0.0
        if layer > current:
            return self._experts_of_a_layer_s(T) + (layer - current - 1) * per_layer + self.layer_s(T)
        rest = (e.num_layers - current - 1) * per_layer + self._experts_of_a_layer_s(T) + self.head_s(1)
        return rest + (g.layers - g.moe_layers) * self.layer_s(1, moe=False) + layer * (
            self.layer_s(1) + self._experts_of_a_layer_s(1)) + self.layer_s(1)

    def _experts_of_a_layer_s(self, n_tokens: int) -> float:
        k, E = self._engine.top_k, self._engine.num_experts
        active = min(E, n_tokens * k)
        return self.experts_grouped_s([max(1, round(n_tokens * k / active))] * active)
