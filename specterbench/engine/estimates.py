"""``engine.costs``: the estimates a strategy decides with, each the cost model's own price
(:class:`~specterbench.engine.costs.CostModel`) at the engine's geometry and its clock's present state, so an estimate
equals what the modeled clock will charge for the same operation on an idle resource.

``engine.costs`` — estimates for strategies (all return seconds unless said otherwise)

=====================================  ===========================================================================
call                                   meaning
=====================================  ===========================================================================
``copy_s()``                           one expert copy host→device on an idle link (latency + bytes / bandwidth)
``pageable_copy_s()``                  one synchronous expert copy from pageable host memory (latency + bytes /
                                       the profile's ``pageable_link_bytes_per_s``); the compute stream waits
``expert_s(n_tokens, bytes_ratio=1)``  one expert over ``n_tokens`` on the device, alone (``bytes_ratio`` < 1:
                                       quantized, run by ``kernel=`` (:mod:`~specterbench.engine.lowbit`), else the
                                       uniform kernel of that many bits per weight)
``expert_in_layer_s(n_tokens)``        what one more expert adds to its layer's grouped op (its FLOPs and bytes, no
                                       launches: the grouped op's launches do not depend on how many experts run)
``experts_fused_s(tokens, ratio)``     one fused kernel over several experts, ``tokens`` = tokens per expert
                                       (e.g. a 4-bit draft layer: ``experts_fused_s(counts, 0.258)``)
``experts_grouped_s(tokens)``          a layer's device experts as the engine runs them: one grouped op
``layer_s(n_tokens, moe=True)``        the non-routed part of one layer (attention, router, shared expert) at the
                                       target's precision; ``bytes_ratio=`` prices a draft's low-bit copy
``head_s(rows=1)``                     the output head over ``rows`` positions (``bytes_ratio=`` as above)
``router_s(n_tokens)``                 applying one router (gate) to ``n_tokens`` hidden states
``host_expert_s(n_tokens)``            one expert on the host CPU started now, activations down and back included,
                                       its weights read from host DRAM shared with the link's queued copies
``link_backlog_s(priority=None)``      until a copy issued now would *start*: the copy on the link plus every
                                       queued copy that outranks it (None: every queued copy)
``copy_arrival_s(priority=None)``      ``link_backlog_s(priority) + copy_s()``: until a copy issued now *lands*
``host_backlog_s()``                   until the host finishes the experts it has been given (the misses of the
                                       layer being placed included)
``host_or_fetch(n_tokens)``            the hybrid rule: ``ON_HOST`` when the host, behind its queue, hands the expert
                                       back before a demand copy issued now lands and computes, else ``FETCH``;
                                       both times beside it (``host_queue_s=``, ``priority=`` vary the two queues)
``prefill_policy(layer, experts, n, hybrid=False)``  the per-layer prefill policy by the MoE-aware threshold
                                       (:func:`specterbench.engine.prefill.layer_policy`: HOST, STREAM or DEVICE
                                       and the modeled host and copy finish times beside it)
``until_layer_s(layer)``               until the experts of MoE ``layer`` of the current forward are needed,
                                       assuming every expert in between hits (the layer itself included when it
                                       is the current one: 0.0); a ``layer`` already passed means the next forward
``now_s()``                            the clock's time
``link_bytes_per_s()``                 link bandwidth: measured from finished copies, else the profile's (bytes/s)
``host_threads_available``             host threads the clock models or the machine has (int)
=====================================  ===========================================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

from specterbench.engine.cache import FETCH, ON_HOST
from specterbench.engine.costs import CostModel
from specterbench.engine.lowbit import LowBitKernel
from specterbench.engine.prefill import LayerPolicy, layer_policy
from specterbench.engine.scheduler import DEMAND_PRIORITY

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine


class HostOrFetch(NamedTuple):
    """:meth:`CostEstimates.host_or_fetch`'s answer: the placement that finishes first, and both finish times (s)."""

    place: str  # ON_HOST or FETCH
    host_s: float
    fetch_s: float


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

    def pageable_copy_s(self) -> float:
        return self.model.pageable_copy_seconds(self.model.expert_copy_bytes)

    def expert_s(self, n_tokens: int, bytes_ratio: float | None = None, kernel: LowBitKernel | None = None) -> float:
        return self.model.op_seconds(*self.model.expert(n_tokens, bytes_ratio, kernel))

    def experts_fused_s(self, tokens_per_expert: Sequence[int], bytes_ratio: float = 1.0,
                        kernel: LowBitKernel | None = None) -> float:
        return self.model.op_seconds(*self.model.experts_fused(tokens_per_expert, bytes_ratio, kernel))

    def layer_s(self, n_tokens: int, moe: bool = True, bytes_ratio: float | None = None,
                kernel: LowBitKernel | None = None, requests: int = 1) -> float:
        """One decoder layer's dense part over ``n_tokens`` (of ``requests`` requests of a batched step, each
        attending to its own KV at the present context)."""
        ratio, kernel = self._dense(bytes_ratio, kernel)
        return self.model.op_seconds(*self.model.dense_layer(n_tokens, self._engine.context_len, moe, ratio, kernel,
                                                             requests=requests))

    def head_s(self, rows: int = 1, bytes_ratio: float | None = None, kernel: LowBitKernel | None = None) -> float:
        ratio, kernel = self._dense(bytes_ratio, kernel)
        return self.model.op_seconds(*self.model.head(rows, ratio, kernel))

    def _dense(self, bytes_ratio, kernel):
        """No ratio given: the target's own dense weights, at its precision (``--dense-bits``) and kernel."""
        if bytes_ratio is None:
            precision = self._engine.precision
            return precision.dense_ratio, precision.dense_kernel if kernel is None else kernel
        return bytes_ratio, kernel

    def expert_in_layer_s(self, n_tokens: int) -> float:
        return self.model.op_seconds(*self.model.expert(n_tokens)._replace(launches=0))

    def experts_grouped_s(self, tokens_per_expert: Sequence[int]) -> float:
        return self.model.op_seconds(*self.model.experts_grouped(tokens_per_expert))

    def router_s(self, n_tokens: int) -> float:
        return self.model.op_seconds(*self.model.router(n_tokens))

    def host_expert_s(self, n_tokens: int) -> float:
        """One expert on the host started now behind the host's queue, activations down and back included, its
        weights streamed from DRAM shared with the copies the link has started or queued by then."""
        m, e = self.model, self._engine
        op = m.host_expert(n_tokens)
        hop = m.hop_seconds(op.act_bytes)
        busy = max(0.0, e.clock.link_backlog_s() - self.host_backlog_s() - hop)
        return 2 * hop + m.host_seconds_shared(op, e.host_threads, busy)

    def host_or_fetch(self, n_tokens: int, host_queue_s: float | None = None,
                      priority: float | None = DEMAND_PRIORITY) -> HostOrFetch:
        """Where a missing expert over ``n_tokens`` is done first: on the host, behind ``host_queue_s`` (default:
        the host's backlog now), or copied in by a copy issued now at ``priority`` (``None``: behind every queued
        copy) and computed in its layer's op. The one rule every hybrid strategy places and drops copies by."""
        queue = self.host_backlog_s() if host_queue_s is None else host_queue_s
        host = queue + self.host_expert_s(n_tokens)
        fetch = self.copy_arrival_s(priority) + self.expert_in_layer_s(n_tokens)
        return HostOrFetch(ON_HOST if host < fetch else FETCH, host, fetch)

    def prefill_policy(self, layer: int, experts: Sequence[int], tokens_per_expert: Sequence[int],
                       hybrid: bool = False) -> LayerPolicy:
        """The default prefill policy of MoE ``layer`` for the running forward (see :mod:`~.prefill`); ``hybrid``:
        DEVICE's misses are placed by the hybrid rule (priced as host and link side by side)."""
        return layer_policy(self._engine, layer, experts, tokens_per_expert, hybrid)

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
