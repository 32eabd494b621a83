"""The offload strategy contract.

A strategy is a plain object the engine calls directly on the hot path (never through pluggy). It sees routing
decisions and may reshape the device cache through the engine's public API (times in seconds, sizes in bytes):

Model and cache
- ``engine.num_layers``, ``engine.num_experts``, ``engine.top_k``  MoE layers, routed experts per layer, experts
                                   per token; ``engine.expert_bytes`` one expert's bytes in the cache (the budget's
                                   unit); ``engine.priced_expert_bytes`` the bytes one copy is priced at
- ``engine.cache``                 one byte pool shared by every layer (not fixed per-layer slots):
                                   ``keys()`` least recently used first, ``layer_keys(layer)`` /
                                   ``layer_count(layer)`` the per-layer view, ``free_bytes``, ``capacity_bytes``
- ``engine.warming_up``            True during the runner's warm-up request (metrics restart after it)

Router signals (while a MoE layer runs: prefill, decode and multi-token verification alike)
- ``engine.routing``               :class:`~specterbench.engine.routing.LayerRouting`: ``top_k_index`` [T, k],
                                   ``top_k_weights`` [T, k] (the token→expert assignment), ``logits`` / ``probs``
                                   [T, E] (computed only when read), ``hidden`` [T, H], ``experts``
- ``engine.router_guess(layer, hidden=None)``  apply another layer's router (e.g. the next one's) to this layer's
                                   MoE input; charged as one router op; returns a ``RouterGuess``

Copies and eviction
- ``engine.prefetch(key, prio)``   queue a copy into *free* bytes; returns a :class:`PrefetchResult`
                                   (``QUEUED`` — truthy —, ``CACHED``, ``IN_FLIGHT``, ``NO_ROOM``); it never evicts
- ``engine.cancel(key)``           drop a queued copy that has not started (True) and free its bytes
- ``engine.evict(key)``            drop a cached expert (cancelling its copy if it has not started)
- ``engine.make_room(nbytes, protect, needed)``  evict by :meth:`Strategy.choose_victim` until ``nbytes`` fit
- ``engine.candidates(protect)``   what may be evicted now (a live view); ``engine.landed(key)``,
                                   ``engine.expected_arrival(key)`` (clock time, None if not cached),
                                   ``engine.wait_for(keys)`` (a barrier before, e.g., a verification pass)

Priorities: the link carries one copy at a time, highest ``priority`` first among copies already issued, ties in
issue order; a copy on the link is never pre-empted. A miss fetches at ``DEMAND_PRIORITY`` (+inf), ahead of every
prefetch, and a queued prefetch whose expert is needed becomes a demand fetch. Prefetch priorities are any finite
floats (e.g. ``-layer`` to serve earlier layers first). :meth:`Strategy.on_copy_landed` tells when a copy lands.

Cost estimates: ``engine.costs`` (:mod:`specterbench.engine.costs`) — copy, expert, layer and host-expert seconds,
link and host backlog, time until a layer runs: what the modeled clock will charge.

Driving decoding (speculative strategies override :meth:`generate`): ``engine.forward(ids, kv, experts=...)``
(a target pass, or a draft pass with ``experts`` standing in for the cache), ``engine.rollback(kv, keep)``,
``engine.emit(n_tokens)``, ``request.sampler()``.

Decision points, in the order the engine calls them:
``attach`` (once per benchmark cell) → ``prepare`` → (warm-up request, then ``on_warmup_end``) → per request
``on_request_start`` → per forward ``on_step_start`` → per MoE layer ``before_layer`` → ``prefill_layer`` in a
prefill → ``on_miss`` for each expert not cached → ``place_miss`` → ``choose_victim`` when room is needed →
``prefill_ahead`` in a prefill → ``after_layer`` → ``on_step_end``; ``on_copy_landed`` at the next layer boundary
after a copy lands.

Batched steps (``--batch B``): B requests of one prompt length decode together, one forward per step
(:mod:`specterbench.engine.batch`). ``engine.batch`` is B during such a step (``engine.cell_batch``: the cell's B, set
before ``prepare``); ``on_request_start`` is called for each request of the batch when it starts; ``on_step_start``
receives the step's B·T tokens; each MoE layer runs once over all of them, so ``before_layer`` sees the union of the
requests' experts with each expert's token count over the whole batch, ``place_miss`` places an expert once for all the
tokens routed to it, and ``engine.routing`` holds B·T rows, request-major (row ``b·T + t``); ``on_step_end`` receives
the step's new tokens of every request, in batch order. A strategy that drives decoding itself overrides
:meth:`Strategy.generate_batch` (a speculative one verifies a window per request in one batched forward) and, where
requests receive different numbers of tokens in a step, emits them with ``engine.emit(n, per_request=counts)``; one that
cannot batch (it follows one request's recorded routing: an oracle) declares ``max_batch`` (and ``max_batch_reason``); a
cell past it is a row that says so.

Default eviction: ``choose_victim`` evicts the least recently used expert of the whole pool (any layer); the
``lru`` baseline instead keeps per-layer quotas (mixtral-offloading).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

from specterbench.engine.batch import decode_batch
from specterbench.engine.cache import FETCH, ON_HOST, SUBSTITUTE, ExpertKey, PrefetchResult
from specterbench.engine.numerics import NumericsGuide
from specterbench.engine.prefill import DEVICE, HOST, STREAM
from specterbench.engine.sampling import GREEDY, DecodeSetting, TokenSampler
from specterbench.engine.scheduler import DEMAND_PRIORITY
from specterbench.errors import BudgetError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from specterbench.engine.engine import Engine
    from specterbench.engine.profiles import HardwareProfile, HostProfile


@dataclass(frozen=True, slots=True)
class Request:
    """One prompt to decode. ``reference_*`` come from the recorded resident run (for oracles and checks).

    ``decode`` says how tokens are chosen (greedy, or Gumbel-max sampling tied to (seed, ``id``, absolute
    position)); choose tokens with ``request.sampler().pick(logits, position)`` so that every strategy and
    every draft picks exactly the token the reference would from the same logits.
    """

    id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    reference_tokens: tuple[int, ...] | None = None
    reference_trace: tuple[tuple[int, tuple[int, ...]], ...] | None = None  # (moe_layer, experts) per layer call
    decode: DecodeSetting = GREEDY
    #: the reference's tokens and margins for a lossless check within numerics (set by the runner; None: none)
    numerics: NumericsGuide | None = None
    #: leading positions of ``prompt_ids`` that are context (``--depth``): a KV cache's first forward prefills them
    #: apart, outside the request's timing, then processes the rest of the prompt (the engine does this)
    context_tokens: int = 0

    def sampler(self, record_margins: bool = False) -> TokenSampler:
        """The token chooser of this request (position 0 is the first prompt token); ``record_margins`` keeps the
        top-2 score gap of every chosen token in ``sampler.margins`` (the reference pass uses it). Where the
        reference's own choice was a near-tie (:mod:`specterbench.engine.numerics`), the sampler takes the
        reference's token, so one rounding difference does not make the rest of the decode incomparable."""
        return self.decode.sampler(self.id, record_margins, self.numerics)


@dataclass(frozen=True, slots=True)
class RoutingCalibration:
    """What profiling strategies learn from the calibration workload (never the benchmark prompts).

    ``counts``: [moe_layers, experts] routed-token counts; ``prompts``: token ids of the calibration prompts;
    ``decode``: the run's decode setting — a strategy that decodes calibration prompts to profile itself (a depth
    profiler, a governor's seed) decodes them as the benchmark will (greedy continuations of a small model repeat
    themselves and route to a handful of experts).
    """

    counts: "torch.Tensor"
    prompts: tuple[tuple[int, ...], ...]
    sequences: tuple["torch.Tensor", ...] = ()  # per calibration prompt: its own [layers, experts] counts
    decode: DecodeSetting = GREEDY


class Strategy:
    """Base class: subclasses set ``name`` and ``version`` and override the decision points they need.

    The defaults are a complete, valid strategy: fetch on miss, evict the least recently used expert.
    """

    name: ClassVar[str] = ""
    version: ClassVar[str] = "0"
    description: ClassVar[str] = ""
    lossless: ClassVar[bool] = True  # False: the runner reports token agreement instead of failing the row
    fixed_budget_fraction: ClassVar[float | None] = None  # e.g. resident: reported once at 1.0
    uses_calibration: ClassVar[bool] = False  # receives a :class:`RoutingCalibration` in :meth:`prepare`
    uses_reference_trace: ClassVar[bool] = False  # needs Request.reference_trace (oracles)
    #: the most requests it decodes together (None: any batch); a cell at a larger ``--batch`` is a row of status
    #: ``unsupported`` that says so, with ``max_batch_reason``
    max_batch: ClassVar[int | None] = None
    max_batch_reason: ClassVar[str] = ""
    #: set for each subclass: whether it overrides :meth:`on_copy_landed` (the engine calls it only then)
    wants_copy_landed: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.wants_copy_landed = cls.on_copy_landed is not Strategy.on_copy_landed

    def __init__(self, **options):
        unknown = set(options) - set(self.option_names())
        if unknown:
            raise UsageError(
                f"strategy {self.name!r} has no option(s) {', '.join(sorted(unknown))}; "
                f"it accepts: {', '.join(self.option_names()) or 'none'}")
        self.options = options
        self.engine: Engine | None = None

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return ()

    @classmethod
    def validate_options(cls, options: dict) -> None:
        """Refuse bad option values before anything is loaded: raise :class:`UsageError` with one line naming the
        option and what it accepts. The default accepts every value of a known option."""

    @classmethod
    def check_budget(cls, engine: "Engine", budget_bytes: int, options: dict) -> None:
        """Refuse a budget this strategy cannot run at before the run starts: raise
        :class:`~specterbench.errors.BudgetError` with one line naming the smallest budget that works. The default
        accepts every budget (``configure`` still refuses one below :meth:`min_cache_bytes`)."""

    @classmethod
    def min_budget(cls, engine: "Engine", options: dict) -> int:
        """The least budget this strategy can run at, known before a cell starts (checked for every budget of a
        run). The default: one forward's experts, ``engine.min_budget_bytes()``; a strategy that computes every
        expert on the host may return 0."""
        return engine.min_budget_bytes()

    @classmethod
    def check_profile(cls, profile: "HardwareProfile", options: dict) -> None:
        """Refuse a hardware profile the modeled clock cannot price this strategy on (with these options) before
        the run starts: raise :class:`UsageError` with one line naming the missing figure. The default accepts
        every profile."""

    @classmethod
    def check_host_profile(cls, host_profile: "HostProfile", options: dict) -> None:
        """The same for the host CPU's profile (``--host-profile``): refuse one the modeled clock cannot price this
        strategy's host experts on (with these options), in one line naming the missing figure. The default accepts
        every host profile."""

    # ---- setup -------------------------------------------------------------------------------------
    def fit_budget(self, engine: "Engine", budget_bytes: int) -> None:
        """Called by ``engine.configure`` before :meth:`device_bytes`, with the cell's budget: a strategy that keeps
        something of a size it can choose on the device (a draft's precision) chooses it here. The default keeps
        what the options say."""

    def device_bytes(self, engine: "Engine") -> int:
        """Bytes the strategy keeps on the device outside the expert cache (a draft, buffers). Charged to the
        budget: the cache gets ``budget - device_bytes``."""
        return 0

    def min_cache_bytes(self, engine: "Engine") -> int:
        """The smallest expert cache this strategy can work with; below it the run is refused."""
        return engine.min_budget_bytes()

    def prepare(self, engine: "Engine", calibration: RoutingCalibration | None = None) -> None:
        """Once per cell, after :meth:`attach`, before the warm-up request. ``calibration`` is given when
        ``uses_calibration`` is set. A strategy may pre-load experts here (through ``engine.prefetch``)."""

    def attach(self, engine: "Engine") -> None:
        self.engine = engine

    # ---- per request / step / layer (hot path) -----------------------------------------------------
    def on_request_start(self, request: Request) -> None:
        pass

    def on_step_start(self, n_tokens: int) -> None:
        pass

    def before_layer(self, layer: int, experts: Sequence[int], tokens_per_expert: Sequence[int]) -> None:
        pass

    def on_miss(self, key: ExpertKey) -> None:
        pass

    #: set: :meth:`prefill_layer` takes the engine's default policy (the MoE-aware threshold) in a prefill —
    #: ``"fetch"`` for a strategy whose ``place_miss`` fetches, ``"hybrid"`` for one that places misses by
    #: ``engine.costs.host_or_fetch`` (then DEVICE is priced as host and link side by side)
    prefill_default: ClassVar[str | None] = None

    def prefill_layer(self, layer: int, experts: Sequence[int], tokens_per_expert: Sequence[int]) -> str:
        """A request's prefill (its first target forward, more than one token): where this MoE layer's missing
        experts run — :data:`DEVICE` (each miss placed by :meth:`place_miss`; the default), :data:`STREAM` (copied
        through the cache's free bytes, never evicting, dropped after the layer) or :data:`HOST`
        (:mod:`specterbench.engine.prefill`). With ``prefill_default`` set, the engine's MoE-aware threshold
        (``engine.costs.prefill_policy``) decides."""
        if self.prefill_default:
            return self.engine.costs.prefill_policy(layer, experts, tokens_per_expert,
                                                    hybrid=self.prefill_default == "hybrid").policy
        return DEVICE

    def prefill_ahead(self, layer: int) -> bool:
        """In a prefill, once MoE ``layer``'s device experts have run: whether the engine issues layer ``layer + 1``'s
        copies now, before joining this layer's host experts (:func:`specterbench.engine.prefill.stage_next`: the
        next layer's routing guessed by its router, each guessed miss the hybrid rule would fetch copied, so the
        link runs beside the host across layers). Default: no."""
        return False

    def place_miss(self, key: ExpertKey, n_tokens: int) -> str:
        """Where an expert that is not cached runs for the ``n_tokens`` routed to it: :data:`FETCH` (default),
        :data:`ON_HOST` or :data:`SUBSTITUTE` (then :meth:`substitute` supplies the weights)."""
        return FETCH

    def substitute(self, key: ExpertKey):
        """Weights to compute a missed expert with instead of fetching it: ``((gate_up, down), bytes_ratio)`` or
        ``((gate_up, down), bytes_ratio, kernel)``: ``bytes_ratio`` is the substitute's bytes over the full expert's
        and ``kernel`` the :class:`~specterbench.engine.lowbit.LowBitKernel` it runs with (for the modeled clock;
        without one, the uniform kernel of that many bits per weight)."""
        raise NotImplementedError(f"strategy {self.name!r} returned SUBSTITUTE without a substitute()")

    def choose_victim(self, candidates: Sequence[ExpertKey], needed: ExpertKey | None) -> ExpertKey | None:
        """Pick one of ``candidates`` (least recently used first) to evict to make room for ``needed``, or
        return None to decline: the engine then fetches ``needed`` later in the layer, when experts it has
        computed become candidates (it forces the least recently used one only if nothing else can work)."""
        return candidates[0]

    def after_layer(self, layer: int, experts: Sequence[int]) -> None:
        pass

    def on_copy_landed(self, key: ExpertKey) -> None:
        """Optional: ``key``'s copy has landed (called at the next layer boundary or token; a strategy that does
        not override it costs nothing)."""

    def on_warmup_end(self) -> None:
        """The warm-up request is over: restart the counters :meth:`metrics` reports (the engine's restart too)."""

    def on_step_end(self, new_tokens: Sequence[int]) -> None:
        pass

    def generate(self, engine: "Engine", request: Request) -> list[int]:
        """One token per forward under ``request.decode``. Speculative strategies override this."""
        return engine.decode(request)

    def generate_batch(self, engine: "Engine", requests: Sequence[Request]) -> list[list[int]]:
        """The requests of a batch decoded together, one batched forward per step (see "Batched steps" above);
        each request's tokens, in batch order. Only called with ``len(requests) <= max_batch``."""
        return decode_batch(engine, requests)

    def metrics(self) -> dict[str, float]:
        """Strategy-specific metrics for the finished cell (added to the row's ``extra``)."""
        return {}


__all__ = [
    "DEMAND_PRIORITY", "DEVICE", "FETCH", "HOST", "STREAM", "ON_HOST", "SUBSTITUTE", "BudgetError",
    "DecodeSetting", "ExpertKey",
    "PrefetchResult", "Request", "RoutingCalibration", "Strategy", "TokenSampler", "UsageError",
]
