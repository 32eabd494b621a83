"""Specter at full strength: speculative offloading with a window governor and hybrid verification.

The self-draft (the target with its routed experts quantized and resident, see :mod:`.decoding`) runs K tokens
ahead; its routing over the window is the prefetch plan (:class:`~.planner.LookaheadPlanner`: every expert it
routed to, earliest layer first, in chunks the link moves during one draft step); the target verifies the K
tokens in one pass. On top of the artifact:

- **a governor** (:mod:`.governor`) picks K ∈ {0, 2, …, 32} before each window from the cost model's prices,
  the cache, the plan's reach and the acceptance observed so far; K = 0 is one plain target step over the same
  cache (so a budget where speculation does not pay falls back to plain offloaded decoding);
- **hybrid verification**: an expert the verification misses is computed on the host CPU when that is
  predicted to finish first, counting the host's own queue against the link's;
- **a low-bit draft**: routed experts at 4 bits, group 128, on torch's int4 kernel, by default; at 3 bits where the
  budget cannot hold the 4-bit one (``--set specter.bits=3`` etc. fixes it);
- **residents and an eviction order** that keep the calibration's popular experts and the window's predictions
  (:mod:`.eviction`), and **a floor**: the draft is dropped when plain decoding over the cache its bytes would add to
  is cheaper (:mod:`.floor`).

Tokens are the target's own under greedy and sampled decoding.
"""

from __future__ import annotations

import heapq
import statistics

from specterbench.engine.quant_spec import QuantSpec
from specterbench.errors import UsageError
from specterbench.strategy import DEVICE, FETCH, ON_HOST

from .batch_seed import GovernedBatches
from .decoding import MAX_K, SpeculativeDecoding
from .eviction import CacheOrder
from .floor import DraftFloor
from .governor import K_CHOICES, Governor, Shape
from .planner import LookaheadPlanner, by_layer
from .window_costs import WindowCosts

HOST_CHOICES = ("auto", "off")
OVERLAP_CHOICES = ("off", "on")  # prefill_overlap: engine.prefill.stage_next in a prompt's forward
# the prefetch plan: lookahead = the draft's routing, earliest layer first, as far as the cache allows; aimed = the
# same, and a verification layer drops the planned copies still queued that the host would finish sooner; rolling =
# aimed, and each verified layer's slots go to the plan of the layers ahead; off: no plan and no draft-guided
# eviction (the ablation spec-host)
PLAN_CHOICES = ("lookahead", "aimed", "rolling", "off")
EXPLORE_K = (0, 4, 8, 16, 32, 2, 24, 12, 32, 16, 0, 6)  # depths tried on calibration prompts to seed the governor


def parse_specter_k(value):
    """``k``: 'auto' (the governor) or a fixed depth 0..MAX_K (0: plain decoding over the same cache)."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except (TypeError, ValueError):
        k = None
    if k is None or not 0 <= k <= MAX_K:
        raise UsageError(f"option k={value!r} is out of range: use 'auto' or an integer from 0 to {MAX_K}")
    return k


class Specter(GovernedBatches, CacheOrder, DraftFloor, SpeculativeDecoding):
    name = "specter"
    prefill_default = "hybrid"  # a prompt's layers placed by the engine's per-layer prefill policy
    # 6: per-layer prefill policy; 5: no plan at a cache of ≤ top-k slots; 4: int4 draft default, noise-aware
    # release, transients only
    version = "6"
    description = ("speculative offloading: low-bit self-draft runs K ahead (K chosen per window by a cost "
                   "governor, 0..32), its routing plans the prefetch, misses run on the host when faster")
    # the draft's routed experts at 4 bits, group 128, on torch's int4 kernel; where the budget cannot hold that
    # draft (or the target's experts are not above 4 bits) at 3 bits, dequantized per step (no kernel)
    draft_defaults = {"quantizer": "int", "bits": 4, "blocksize": 128}
    draft_fallback_bits = (3,)
    dense_bits_default = 8  # the draft's attention, shared experts and head as int8 per channel, run by torch's int8
    # weight-only matmul (int4 costs acceptance here; ``dense_quantizer=int``: the earlier int8/g64, dequantized)

    @classmethod
    def option_names(cls):
        return ("k", "host", "plan", "prefill_overlap", "dense_bits", "dense_quantizer", "dense_blocksize",
                "head_error_scale", "draft_noise", *QuantSpec.OPTIONS)

    parse_depth = staticmethod(parse_specter_k)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        super().validate_options(options)
        if str(options.get("host", "auto")) not in HOST_CHOICES:
            raise UsageError(f"option host={options.get('host')!r} is invalid: use one of "
                             f"{', '.join(HOST_CHOICES)}")
        if str(options.get("prefill_overlap", "off")) not in OVERLAP_CHOICES:
            raise UsageError(f"option prefill_overlap={options.get('prefill_overlap')!r} is invalid: use on or off")
        if str(options.get("plan", cls.plan_default)) not in PLAN_CHOICES:
            raise UsageError(f"option plan={options.get('plan')!r} is invalid: use one of "
                             f"{', '.join(PLAN_CHOICES)}")

    def __init__(self, **options):
        super().__init__(**options)
        self.host_option = str(options.get("host", "auto"))
        self.plan = str(options.get("plan", self.plan_default))
        self.plan_on = self.plan != "off"
        self.prefill_overlap = str(options.get("prefill_overlap", "off")) == "on"
        self.explore: list[int] = []

    planner = None
    governor = None
    plan_default = "lookahead"

    def attach(self, engine):
        super().attach(engine)
        # no room for a plan: a cache of at most one layer's top-k slots holds no resident, and every copy the plan
        # makes evicts what the layer being verified has just fetched through the same link (measured: see
        # docs/measurements/2026-12-03-specter-vs-goal-int4-default.md)
        self.plan_on = self.plan != "off" and self.slots > engine.top_k
        self.planner = LookaheadPlanner(engine)
        self.governor = Governor(Shape(engine.num_layers, engine.num_experts, engine.top_k, self.slots),
                                 plan=self.plan_on)
        self.host_path = self.host_option == "auto" and engine.clock.costs.host is not None
        self.host_calls = self.fetch_calls = 0
        self.forecast = None
        self.predictions: list[tuple[int, float, float]] = []
        self.transients: dict = {}  # cached experts that are not residents (as far as seen) -> their heap stamp
        self.transient_heap: list = []  # (recency stamp, key), least recent first

    calibration = None

    def prepare(self, engine, calibration=None):
        self.calibration = calibration
        self.cell_batch = max(1, int(getattr(engine, "cell_batch", 1)))
        self.load_residents(engine, calibration)
        if self.k_option == "auto" and calibration is not None and calibration.prompts:
            self.explore = list(EXPLORE_K)
            self.seeding, self.seed_windows = True, []
            for i in range(2):  # until every listed depth has had its window
                if not self.explore:
                    break
                self.seed(engine, calibration, i, sum(EXPLORE_K) // 2 + 8)
            self.explore, self.seeding = [], False
            self.governor.batch = self.cell_batch  # the floor decides at the batch the cell decodes
            try:
                self.maybe_release_draft(engine, calibration)
            finally:
                self.governor.batch = 1
        self.reset_metrics()
        self.predictions = []
        self.host_calls = self.fetch_calls = 0

    def on_warmup_end(self):
        """The warm-up is over: the governor keeps what it learned; window, host and fetch counters restart."""
        super().on_warmup_end()
        self.predictions = []
        self.host_calls = self.fetch_calls = 0

    residents_read = 0  # of the residents cached as the window started, those its verification routed to
    window_residents: frozenset = frozenset()
    # ---- the governor ------------------------------------------------------------------------------
    def window_costs(self, remaining: int) -> WindowCosts:
        return WindowCosts(self.engine, self.draft, remaining, self.host_path, self.dense_ratio,
                           self.dense.kernel if self.dense is not None else self.engine.precision.dense_kernel)

    window_in_tail = False

    def choose_k(self, remaining: int) -> int:
        self.window_misses0 = self.engine.stats.misses
        cache = self.engine.cache
        # cached as the window starts: one intersection in C, not a Python check per resident (thousands of them at
        # a real model's geometry, every window)
        self.window_residents = cache.cached(self.residents)
        self.residents_cached, self.residents_read = len(self.window_residents), 0
        self.governor.plan_slots = self.slots - self.residents_cached
        self.window_in_tail = remaining <= max(self.governor.choices) + 1
        costs = self.window_costs(remaining)
        if self.k_option != "auto":  # a fixed depth: still forecast, so the row shows how good forecasts are
            self.governor.prior_miss_s = costs.prior_miss_s()
            self.forecast = self.governor.forecast(min(self.k, remaining), costs)
            return self.forecast.k
        best, forecasts = self.governor.choose(remaining, costs)
        if self.explore:  # seeding on a calibration prompt: take the listed depth, still forecast it
            k = min(self.explore.pop(0), remaining)
            best = next((f for f in forecasts if f.k == k), None) or self.governor.forecast(k, costs)
        elif self.calibration_counts and remaining > 1 and self.governor.batch == self.cell_batch:
            # the floor: drop a draft that loses to plain decoding at the batch the cell decodes (not in a batch-1
            # warm-up of a batched cell)
            if self.governor.batch > 1:  # whether the draft pays at this batch, not in this window's tail or width
                g, now = self.governor, (self.governor.width, self.governor.leads, self.governor.remaining)
                g.width, g.leads, g.remaining = 1, None, None
                forecasts = [g.forecast(d, self.window_costs(10**6)) for d in g.choices]
                g.width, g.leads, g.remaining = now
            spec = min((f.per_token_s for f in forecasts if f.k), default=float("inf"))
            self.spec_forecast_ms = spec * 1e3
            self.release_votes = (self.release_votes + 1 if self.draft_loses(spec, costs)
                                  else max(0, self.release_votes - 1))
            if self.release_votes >= self.RELEASE_VOTES:
                self.release_draft()
                best = self.governor.forecast(0, costs)
        self.forecast = best
        return best.k

    def begin_window(self, k):
        super().begin_window(k)
        if self.planner is not None:
            self.planner.begin()
        for item in self.parked:  # a new window predicts afresh
            heapq.heappush(self.transient_heap, item)
        self.parked = []

    def on_step_start(self, n_tokens):
        self.step_tokens = n_tokens

    def end_window(self, k, emitted, window_s):
        if k and self.residents_cached:
            self.resident_use.append(self.residents_read / self.residents_cached)
        super().end_window(k, emitted, window_s)
        batch = self.governor.batch
        if batch > 1:  # the window's tokens over the batch, as the governor forecasts them
            emitted = self.batch_window_tokens
        if k:
            for proposed, accepted in self.last_window:  # every request of a batched window
                self.governor.observe_acceptance(proposed, accepted)
            if not self.explore and not self.seeding and not self.window_in_tail:  # a request's tail: K cut short
                if batch != self.recent_batch:  # per-token times of another batch size do not compare
                    self.recent_windows, self.recent_batch = [], batch
                self.recent_windows = (self.recent_windows + [(window_s, emitted)])[-self.RECENT:]
            elif self.seeding:
                self.seed_windows.append((k, window_s, emitted))
        elif self.seeding and batch > 1 and self.governor.width == 1:  # a plain batched step over this cache
            self.observe_plain_step(window_s, self.window_costs(10**6))
        if self.forecast is not None:
            misses = self.engine.stats.misses - self.window_misses0
            self.governor.observe_window(self.forecast, window_s, misses)
            self.predictions.append((k, self.forecast.window_s, window_s))
            if batch > 1 and not self.seeding:  # the lock step's tokens, forecast and realised
                self.batch_tokens.append((self.forecast.tokens, emitted))

    # ---- the plan ----------------------------------------------------------------------------------
    def after_draft_step(self, step, routing, step_s):
        super().after_draft_step(step, routing, step_s)
        self.governor.observe_draft_step(step_s)
        if self.plan_on:
            self.planning = True
            try:
                self.planner.after_step(routing, step_s)
            finally:
                self.planning = False

    def before_verify(self):
        super().before_verify()
        if self.plan_on:
            self.planning = True
            try:
                self.planner.issue(None)
            finally:
                self.planning = False

    def before_layer(self, layer, experts, tokens_per_expert):
        super().before_layer(layer, experts, tokens_per_expert)
        if self.verifying:
            self.verify_layer = layer
            if self.plan in ("aimed", "rolling") and self.host_path:
                self.drop_late_copies(layer, experts, tokens_per_expert)
        plain = self.window_k == 0 and getattr(self, "step_tokens", 0) == 1
        if self.verifying or plain:
            cache, issued = self.engine.cache, self.planner.issued
            keys = [(layer, e) for e in experts]
            if self.verifying:
                self.residents_read += sum(1 for k in keys if k in self.window_residents)
            before = sum(1 for k in keys if k in cache and k not in issued)
            predicted = sum(1 for k in keys if k in issued)
            n = self.window_k + 1 if self.engine.batch == 1 else self.step_tokens  # a batched window: B·T
            self.governor.observe_layer(n, len(keys), before, predicted)

    def drop_late_copies(self, layer, experts, tokens_per_expert) -> None:
        """Aim the plan at what the host cannot do in time: a planned copy of this layer still queued (not on the
        link) is dropped when the host, its queue counted, would finish the expert before the copy would land as a
        demand fetch; the expert is then a miss the hybrid rule places."""
        e, c = self.engine, self.engine.costs
        host_s = c.host_backlog_s()
        for expert, n in zip(experts, tokens_per_expert):
            key = (layer, expert)
            if key not in self.planner.issued or e.landed(key):
                continue
            choice = c.host_or_fetch(n, host_queue_s=host_s)
            if choice.place == ON_HOST and e.cancel(key):
                self.planner.issued.discard(key)
                self.dropped_copies += 1
                host_s = choice.host_s

    dropped_copies = 0

    def after_layer(self, layer, experts):
        super().after_layer(layer, experts)
        if self.verifying and self.plan == "rolling" and layer + 1 < self.engine.num_layers:
            self.planner.issue(None, from_layer=layer + 1)  # the passed layers' slots serve the layers ahead

    def prefill_layer(self, layer, experts, tokens_per_expert):
        """The engine's per-layer prefill policy, DEVICE priced as the hybrid rule's split; with the host path off
        (``host=off`` or no host profile) every miss is fetched as before."""
        if not self.host_path:
            return DEVICE
        return super().prefill_layer(layer, experts, tokens_per_expert)

    def prefill_ahead(self, layer):
        """``prefill_overlap=on``: the next layer's copies overlapped with this layer's host experts (where the hybrid
        rule runs); off by default, as the cost model finds it does not pay at the budgets measured."""
        return self.host_path and self.prefill_overlap

    def place_miss(self, key, n_tokens):
        """Hybrid verification: the host when it is predicted to finish first, its own queue counted."""
        if not self.host_path:
            return FETCH
        if self.engine.costs.host_or_fetch(n_tokens).place == ON_HOST:
            self.host_calls += 1
            return ON_HOST
        self.fetch_calls += 1
        return FETCH

    def predicted(self):
        return by_layer(self.planner.planned)

    residents_cached = 0
    recent_batch = 1  # the batch size of the windows in ``recent_windows``

    def reset_metrics(self):
        super().reset_metrics()
        self.resident_use: list[float] = []
        self.batch_tokens: list[tuple[float, int]] = []  # batched windows: (forecast tokens, tokens emitted)

    def metrics(self):
        m = super().metrics()
        g = self.governor
        # what a slot holding a calibration resident is worth to a window, beside expert_precision (what a slot
        # holding one of the plan's copies is worth): the lookahead can add hits only where the second is higher
        m["resident_use"] = round(statistics.mean(self.resident_use), 4) if self.resident_use else None
        stats = self.engine.stats
        m.update({"prefill_overlap": "on" if self.prefill_overlap else "off", "staged_experts": stats.staged_experts,
                  "staged_unused": stats.staged_unused})
        m.update({"draft_released": self.draft_released, "plain_forecast_ms_per_token": self.plain_forecast_ms,
                  "speculative_forecast_ms_per_token": self.spec_forecast_ms,
                  "speculative_realised_ms_per_token": self.spec_realised_ms})
        plan = self.plan if self.plan_on or self.plan == "off" else f"off (no room: {self.slots} slots ≤ top-k)"
        g.batch = self.cell_batch  # the fit of the batch the cell decoded
        m.update({"k": self.k_option, "plan": plan, "plan_copies_dropped": self.dropped_copies,
                  "host_calls": self.host_calls, "fetch_calls": self.fetch_calls,
                  "governor_acceptance": round(g.acceptance, 4), "governor_gamma": round(g.gamma, 4),
                  "governor_miss_ms": round(g.miss_s() * 1e3, 4)})
        g.batch = 1
        if self.batch_tokens:  # batched windows outside a batch's tail
            m["batch_window_tokens_forecast_vs_realised"] = [round(sum(f for f, _ in self.batch_tokens), 2),
                                                             sum(n for _, n in self.batch_tokens)]
        if self.predictions:
            pred = sum(p for _, p, _ in self.predictions)
            real = sum(r for _, _, r in self.predictions)
            m["predicted_window_ms_total"] = round(pred * 1e3, 3)
            m["realised_window_ms_total"] = round(real * 1e3, 3)
            m["window_prediction_error_mean"] = round(statistics.mean(
                abs(p - r) / r for _, p, r in self.predictions if r > 0), 4)
            m["windows_predicted_vs_realised_ms"] = [(k, round(p * 1e3, 3), round(r * 1e3, 3))
                                                     for k, p, r in self.predictions[:64]]
        return m


class SpecHost(Specter):
    """The speculative ablation: Specter's draft, governor, residents and host execution of misses, without the
    lookahead — no prefetch plan from the draft's routing and no draft-guided eviction. What Specter gains over it
    is what its lookahead adds; what it gains over the non-speculative strategies is speculation itself."""

    name = "spec-host"
    version = "1"
    description = ("speculative ablation: Specter's draft, governor, residents and host path for misses, without "
                   "the lookahead prefetch plan")
    plan_default = "off"

    @classmethod
    def option_names(cls):
        return tuple(n for n in super().option_names() if n != "plan")


__all__ = ["Specter", "SpecHost", "K_CHOICES", "parse_specter_k"]
