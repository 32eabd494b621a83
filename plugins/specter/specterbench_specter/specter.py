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
  budget cannot hold the 4-bit one (``--set specter.bits=3`` etc. fixes it).

Room is made by evicting transients the window does not need ahead (least recently used first), then residents it
does not need ahead (least popular first), then predicted ones of layers the verification has passed, then the one
needed last; the plan's own copies take only the room of transients, never a resident's. Tokens are the target's
own under greedy and sampled decoding.
"""

from __future__ import annotations

import heapq
import math
import statistics

import torch

from specterbench.engine.draft import QuantSpec
from specterbench.engine.scheduler import DEMAND_PRIORITY
from specterbench.errors import UsageError
from specterbench.strategy import FETCH, ON_HOST

from .decoding import MAX_K, SpeculativeDecoding
from .governor import K_CHOICES, Governor, Shape, WindowCosts
from .planner import LookaheadPlanner, by_layer

HOST_CHOICES = ("auto", "off")
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


class Specter(SpeculativeDecoding):
    name = "specter"
    version = "5"  # 5: no plan at a cache of ≤ top-k slots; 4: int4 draft default, noise-aware release, transients only
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
        return ("k", "host", "plan", "dense_bits", "dense_quantizer", "dense_blocksize", "head_error_scale",
                "draft_noise", *QuantSpec.OPTIONS)

    parse_depth = staticmethod(parse_specter_k)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        super().validate_options(options)
        if str(options.get("host", "auto")) not in HOST_CHOICES:
            raise UsageError(f"option host={options.get('host')!r} is invalid: use one of "
                             f"{', '.join(HOST_CHOICES)}")
        if str(options.get("plan", cls.plan_default)) not in PLAN_CHOICES:
            raise UsageError(f"option plan={options.get('plan')!r} is invalid: use one of "
                             f"{', '.join(PLAN_CHOICES)}")

    def __init__(self, **options):
        super().__init__(**options)
        self.host_option = str(options.get("host", "auto"))
        self.plan = str(options.get("plan", self.plan_default))
        self.plan_on = self.plan != "off"
        self.explore: list[int] = []

    planner = None
    governor = None
    plan_default = "lookahead"

    def attach(self, engine):
        super().attach(engine)
        # no room for a plan: a cache of at most one layer's top-k slots holds no resident, and every copy the plan
        # makes evicts what the layer being verified has just fetched through the same link (measured at Mixtral
        # A100 35%, 2 slots: 0.934x spec-host with the plan on; section "Measured" of the README)
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
        self.load_residents(engine, calibration)
        if self.k_option == "auto" and calibration is not None and calibration.prompts:
            from specterbench.strategy import Request

            self.explore = list(EXPLORE_K)
            self.seeding, self.seed_windows = True, []
            for i, ids in enumerate(calibration.prompts[:2]):  # until every listed depth has had its window
                if not self.explore:
                    break
                request = Request(f"governor-seed-{i}", ids, sum(EXPLORE_K) // 2 + 8, decode=calibration.decode)
                engine.begin_request(request)
                self.generate(engine, request)
            self.explore, self.seeding = [], False
            self.maybe_release_draft(engine, calibration)
        self.reset_metrics()
        self.predictions = []
        self.host_calls = self.fetch_calls = 0

    def on_warmup_end(self):
        """The warm-up is over: the governor keeps what it learned; window, host and fetch counters restart."""
        super().on_warmup_end()
        self.predictions = []
        self.host_calls = self.fetch_calls = 0

    def load_residents(self, engine, calibration) -> None:
        """Frequency-aware residency: the cache starts with the calibration set's most popular experts (all
        slots but one layer's top-k, as cpu-experts pins them); they are given up least popular first."""
        self.popularity: dict = {}
        if calibration is None:
            return
        counts = calibration.counts.flatten().float()  # [layers * experts]
        order = torch.argsort(counts, descending=True, stable=True).tolist()
        self.popularity = {divmod(i, engine.num_experts): rank for rank, i in enumerate(order)}  # 0: most used
        n = max(0, self.slots - engine.top_k)
        self.residents = {divmod(i, engine.num_experts) for i in order[:n]}
        self.residents_by_unpopularity = [divmod(i, engine.num_experts) for i in reversed(order[:n])]
        for key in sorted(self.residents):
            if key not in engine.cache and engine.make_room(engine.expert_bytes, protect=self.residents, needed=key):
                engine.prefetch(key)

    residents: frozenset = frozenset()
    popularity: dict = {}  # (layer, expert) -> rank in the calibration counts (0: most used); empty: no calibration
    residents_by_unpopularity: tuple = ()
    residents_read = 0  # of the residents cached as the window started, those its verification routed to
    window_residents: frozenset = frozenset()
    parked = ()  # transients' heap entries set aside while the window predicts them
    draft_released = False
    plain_forecast_ms = spec_forecast_ms = None

    def maybe_release_draft(self, engine, calibration) -> None:
        """After the seed: when plain decoding over the cache the draft's bytes would add to is predicted cheaper per
        token than the best window with the draft, drop the draft and give its bytes to the cache."""
        self.calibration_counts = sorted(calibration.counts.flatten().tolist(), reverse=True)
        costs = self.window_costs(10**6)
        self.governor.prior_miss_s = costs.prior_miss_s()
        spec = min((self.governor.forecast(k, costs) for k in self.governor.choices if k), key=lambda f: f.per_token_s)
        self.spec_forecast_ms = spec.per_token_s * 1e3
        # the seed's realised windows: the best depth's time per emitted token (one or two windows a depth, so the
        # minimum errs towards keeping the draft), in place of the forecast when it is worse
        by_k: dict = {}
        for k, seconds, emitted in self.seed_windows:
            t, n = by_k.get(k, (0.0, 0))
            by_k[k] = (t + seconds, n + emitted)
        realised = min((t / n for t, n in by_k.values() if n), default=0.0)
        if self.draft_loses(max(spec.per_token_s, realised), costs):
            self.release_draft()

    calibration_counts: list = []
    recent_windows: list = []  # (seconds, tokens emitted) of the last speculative windows outside the seed
    seed_windows: list = []  # (K, seconds, tokens emitted) of the seed's speculative windows
    seeding = False
    release_votes = 0
    RELEASE_VOTES = 3  # net windows that must find the draft losing (a winning window takes one vote back)
    # the draft stays only while its best window is forecast at least this much cheaper per token than plain
    # decoding without it: the floor (never more than 3% behind the strongest non-speculative strategy) outweighs
    # the last few percent of a draft near break-even, and the forecasts err by about this much
    RELEASE_MARGIN = 0.05

    def draft_loses(self, spec_per_token_s: float, costs) -> bool:
        """Whether speculation, by the realised time per emitted token of the recent windows with the draft (its
        forecast before there are enough), is not ``RELEASE_MARGIN`` cheaper than plain decoding without it. The
        realised figure is read at one standard error below its estimate: accepted runs are bursty (a window of
        K = 28 emits 1 to 29 tokens), so a few short windows in a row must not drop a draft that pays on average —
        one that loses by more than its noise still goes within a few windows."""
        recent = self.recent_windows[-self.RECENT:]
        if len(recent) >= 3:
            seconds, tokens = sum(s for s, _ in recent), sum(n for _, n in recent)
            estimate = seconds / tokens
            m = len(recent)  # the ratio estimator's standard error, from the windows' residuals
            se = math.sqrt(sum((s - estimate * n) ** 2 for s, n in recent) / (m * (m - 1))) / (tokens / m)
            self.spec_realised_ms = estimate * 1e3
            spec_per_token_s = estimate - se
        return spec_per_token_s * (1 + self.RELEASE_MARGIN) > self.plain_without_draft_s(costs)

    RECENT = 16  # speculative windows whose realised time per token the release decision reads
    spec_realised_ms = None

    def plain_without_draft_s(self, costs) -> float:
        """Per token, plain decoding once the draft's bytes are cache: the calibration set's most popular experts
        resident in every slot but one layer's top-k (as :meth:`load_residents` would place them), the rest missed
        and placed on the host or fetched (:meth:`Governor.plain_step_s`)."""
        counts = self.calibration_counts
        total = sum(counts) or 1
        e = self.engine
        slots = (e.cache.capacity_bytes + self.draft_bytes(e)) // e.expert_bytes
        covered = sum(counts[:max(0, slots - e.top_k)])
        self.plain_forecast_ms = self.governor.plain_step_s(costs, 1 - covered / total) * 1e3
        return self.plain_forecast_ms / 1e3

    def release_draft(self) -> None:
        """Drop the draft (``engine.release_device_bytes``): its bytes become cache, filled with the next most
        popular experts; the cell decodes with K = 0 from here on."""
        engine = self.engine
        engine.release_device_bytes(self.draft_bytes(engine))
        self.draft_released = True
        self.k_option, self.k = 0, 0
        self.slots = engine.cache.capacity_bytes // engine.expert_bytes
        if self.calibration is not None:
            self.load_residents(engine, self.calibration)

    # ---- the governor ------------------------------------------------------------------------------
    def window_costs(self, remaining: int) -> WindowCosts:
        return WindowCosts(self.engine, self.draft, remaining, self.host_path, self.dense_ratio,
                           self.dense.kernel if self.dense is not None else self.engine.precision.dense_kernel)

    window_in_tail = False

    def choose_k(self, remaining: int) -> int:
        self.window_misses0 = self.engine.stats.misses
        cache = self.engine.cache
        # cached as the window starts: one intersection in C (a comprehension through the cache's __contains__ took
        # 1.2 ms a window over 14,848 residents, the intersection 0.5 ms)
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
        elif self.calibration_counts and remaining > 1:  # the floor: drop a draft that loses to plain decoding
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
        if k:
            self.governor.observe_acceptance(k, self.accepted_lengths[-1])
            if not self.explore and not self.seeding and not self.window_in_tail:  # a request's tail: K cut short
                self.recent_windows = (self.recent_windows + [(window_s, emitted)])[-self.RECENT:]
            elif self.seeding:
                self.seed_windows.append((k, window_s, emitted))
        if self.forecast is not None:
            misses = self.engine.stats.misses - self.window_misses0
            self.governor.observe_window(self.forecast, window_s, misses)
            self.predictions.append((k, self.forecast.window_s, window_s))

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
            n = self.window_k + 1
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
            host = host_s + c.host_expert_s(n)
            if host < c.copy_arrival_s(DEMAND_PRIORITY) + c.expert_in_layer_s(n) and e.cancel(key):
                self.planner.issued.discard(key)
                self.dropped_copies += 1
                host_s = host

    dropped_copies = 0

    def after_layer(self, layer, experts):
        super().after_layer(layer, experts)
        if self.verifying and self.plan == "rolling" and layer + 1 < self.engine.num_layers:
            self.planner.issue(None, from_layer=layer + 1)  # the passed layers' slots serve the layers ahead

    def place_miss(self, key, n_tokens):
        """Hybrid verification: the host when it is predicted to finish first, its own queue counted."""
        if not self.host_path:
            return FETCH
        c = self.engine.costs
        host = c.host_backlog_s() + c.host_expert_s(n_tokens)
        fetch = c.copy_arrival_s(DEMAND_PRIORITY) + c.expert_in_layer_s(n_tokens)
        if host < fetch:
            self.host_calls += 1
            return ON_HOST
        self.fetch_calls += 1
        return FETCH

    verify_layer = -1

    def choose_victim(self, candidates, needed):
        victim = self._victim(candidates)
        if needed is not None:
            self._track(needed)  # about to be fetched: a transient from now on
        return victim

    def _track(self, key) -> None:
        """Keep ``key`` among the transients (a heap by recency, refreshed lazily as the cache touches them)."""
        if key not in self.residents and key not in self.transients:
            cache = self.engine.cache
            stamp = cache.recency(key) if key in cache else -1
            self.transients[key] = stamp
            heapq.heappush(self.transient_heap, (stamp, key))

    def _victim(self, candidates):
        """Transients not needed ahead least recently used first, then residents not needed ahead least popular
        first, then experts of layers the verification has passed; without scanning the cache: the transients sit
        in a heap by recency (stale entries refreshed or dropped as they surface), the residents are walked in
        popularity order, and each walk stops at the first fit. "Needed ahead": the draft routed to it in this
        window, at a layer the verification has not passed (a predicted expert of a passed layer is just a
        transient). A copy of the plan (``planning``) takes only the room of transients not needed ahead: a
        one-window prediction never displaces the calibration's popular residents, which no later step brings back."""
        predicted = self.window_draft if self.plan_on else {}  # spec-host: no draft-guided eviction
        cache, heap, aside = self.engine.cache, self.transient_heap, []
        passed = self.verify_layer if self.verifying else -1

        def unneeded(k):
            return k[0] < passed or k[1] not in predicted.get(k[0], ())

        best = None
        while heap:
            stamp, k = heap[0]
            if k not in cache or k in self.residents:
                heapq.heappop(heap)
                del self.transients[k]
            elif (now := cache.recency(k)) != stamp:
                heapq.heapreplace(heap, (now, k))
                self.transients[k] = now
            elif not unneeded(k):  # needed ahead: stays so until the window ends
                self.parked.append(heapq.heappop(heap))
            elif k in candidates:
                best = k
                break
            else:  # in use, on the link or protected: may be a candidate at the next call
                aside.append(heapq.heappop(heap))
        for item in aside:
            heapq.heappush(heap, item)
        if best is not None:  # least recently used first
            return best
        if self.planning:
            return None
        # residents the window does not need, least popular first; those evicted since (most of the walk at DeepSeek-V3
        # geometry: ~230 of 2,000 per call) skipped by a C-level dict lookup, not a Python check each
        for k in filter(cache.slots.__contains__, self.residents_by_unpopularity):
            if k in candidates and unneeded(k):
                return k
        untracked = next((k for k in candidates if unneeded(k)), None)  # e.g. landed since the last layer
        if untracked is not None:
            return untracked
        done = next((k for k in candidates if k[0] < self.verify_layer), None)  # layers the verification passed
        if done is not None:
            return done
        # all predicted and still ahead: give up the one needed last (latest layer, fewest draft tokens)
        return max(candidates, key=lambda k: (k[0], -predicted.get(k[0], {}).get(k[1], 0)))

    planning = False  # inside the plan's copies (after a draft step, before the verification)

    def on_copy_landed(self, key):
        super().on_copy_landed(key)
        self._track(key)

    def predicted(self):
        return by_layer(self.planner.planned)

    residents_cached = 0

    def reset_metrics(self):
        super().reset_metrics()
        self.resident_use: list[float] = []

    def metrics(self):
        m = super().metrics()
        g = self.governor
        # what a slot holding a calibration resident is worth to a window, beside expert_precision (what a slot
        # holding one of the plan's copies is worth): the lookahead can add hits only where the second is higher
        m["resident_use"] = round(statistics.mean(self.resident_use), 4) if self.resident_use else None
        m.update({"draft_released": self.draft_released, "plain_forecast_ms_per_token": self.plain_forecast_ms,
                  "speculative_forecast_ms_per_token": self.spec_forecast_ms,
                  "speculative_realised_ms_per_token": self.spec_realised_ms})
        plan = self.plan if self.plan_on or self.plan == "off" else f"off (no room: {self.slots} slots ≤ top-k)"
        m.update({"k": self.k_option, "plan": plan, "plan_copies_dropped": self.dropped_copies,
                  "host_calls": self.host_calls, "fetch_calls": self.fetch_calls,
                  "governor_acceptance": round(g.acceptance, 4), "governor_gamma": round(g.gamma, 4),
                  "governor_miss_ms": round(g.miss_s() * 1e3, 4)})
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
