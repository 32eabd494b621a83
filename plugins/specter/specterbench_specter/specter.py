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
- **a smaller draft**: routed experts at 3 bits, group 128, by default (``--set specter.bits=4`` etc.).

Room is made by evicting experts the draft did not predict (least recently used first), then predicted ones of
layers the verification has passed, then the one needed last. Tokens are the target's own under greedy and
sampled decoding.
"""

from __future__ import annotations

import statistics

import torch

from specterbench.engine.clocks import DEMAND_PRIORITY
from specterbench.engine.draft import QuantSpec
from specterbench.errors import UsageError
from specterbench.plugins.strategy import FETCH, ON_HOST

from .decoding import MAX_K, SpeculativeDecoding
from .governor import K_CHOICES, Governor, Shape, WindowCosts
from .planner import LookaheadPlanner, by_layer

HOST_CHOICES = ("auto", "off")
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
    version = "3"
    description = ("speculative offloading: low-bit self-draft runs K ahead (K chosen per window by a cost "
                   "governor, 0..32), its routing plans the prefetch, misses run on the host when faster")
    draft_defaults = {"quantizer": "int", "bits": 3, "blocksize": 128}
    dense_bits_default = 8  # the draft's attention, shared experts and head as int8/g64 (int4 costs acceptance here)

    @classmethod
    def option_names(cls):
        return ("k", "host", "dense_bits", "head_error_scale", *QuantSpec.OPTIONS)

    parse_depth = staticmethod(parse_specter_k)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        super().validate_options(options)
        if str(options.get("host", "auto")) not in HOST_CHOICES:
            raise UsageError(f"option host={options.get('host')!r} is invalid: use one of "
                             f"{', '.join(HOST_CHOICES)}")

    def __init__(self, **options):
        super().__init__(**options)
        self.host_option = str(options.get("host", "auto"))
        self.explore: list[int] = []

    planner = None
    governor = None

    def attach(self, engine):
        super().attach(engine)
        self.planner = LookaheadPlanner(engine)
        self.governor = Governor(Shape(engine.num_layers, engine.num_experts, engine.top_k, self.slots))
        self.host_path = self.host_option == "auto" and engine.clock.costs.host is not None
        self.host_calls = self.fetch_calls = 0
        self.forecast = None
        self.predictions: list[tuple[int, float, float]] = []

    def prepare(self, engine, calibration=None):
        self.load_residents(engine, calibration)
        if self.k_option == "auto" and calibration is not None and calibration.prompts:
            from specterbench.plugins.strategy import Request

            self.explore = list(EXPLORE_K)
            for i, ids in enumerate(calibration.prompts[:2]):  # until every listed depth has had its window
                if not self.explore:
                    break
                request = Request(f"governor-seed-{i}", ids, sum(EXPLORE_K) // 2 + 8, decode=calibration.decode)
                engine.begin_request(request)
                self.generate(engine, request)
            self.explore = []
            self.maybe_release_draft(engine, calibration)
        self.reset_metrics()
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
        for key in sorted(self.residents):
            if key not in engine.cache and engine.make_room(engine.expert_bytes, protect=self.residents, needed=key):
                engine.prefetch(key)

    residents: frozenset = frozenset()
    draft_released = False
    plain_forecast_ms = spec_forecast_ms = None

    def maybe_release_draft(self, engine, calibration) -> None:
        """After the seed: when plain decoding over the cache the draft's bytes would add to is predicted
        cheaper per token than the best window with the draft, drop the draft and give its bytes to the cache
        (``engine.release_device_bytes``); the cell then decodes with K = 0 only. The bigger cache's misses are
        scaled from the smaller one's by the calibration counts' coverage of the popular experts it holds."""
        costs = WindowCosts(engine, self.draft.bytes_ratio, 10**6, self.host_path, self.dense_ratio)
        g = self.governor
        g.prior_miss_s = costs.prior_miss_s()
        spec = min((g.forecast(k, costs) for k in g.choices if k), key=lambda f: f.per_token_s)
        plain = g.forecast(0, costs)
        counts = sorted(calibration.counts.flatten().tolist(), reverse=True)
        total = sum(counts) or 1
        extra = self.draft.nbytes // engine.expert_bytes
        small = max(0, self.slots - engine.top_k)

        def uncovered(n):
            return max(1e-9, 1 - sum(counts[:n]) / total)

        miss_part = plain.misses * g.miss_s() * g.bias(0)
        plain_big = plain.window_s - miss_part * (1 - uncovered(small + extra) / uncovered(small))
        self.plain_forecast_ms, self.spec_forecast_ms = plain_big * 1e3, spec.per_token_s * 1e3
        if plain_big >= spec.per_token_s:
            return
        engine.release_device_bytes(self.draft_bytes(engine))
        self.draft_released = True
        self.k_option, self.k = 0, 0
        self.slots = engine.cache.capacity_bytes // engine.expert_bytes
        self.load_residents(engine, calibration)

    # ---- the governor ------------------------------------------------------------------------------
    def choose_k(self, remaining: int) -> int:
        self.window_misses0 = self.engine.stats.misses
        costs = WindowCosts(self.engine, self.draft.bytes_ratio, remaining, self.host_path,
                            self.dense_ratio)
        if self.k_option != "auto":  # a fixed depth: still forecast, so the row shows how good forecasts are
            self.governor.prior_miss_s = costs.prior_miss_s()
            self.forecast = self.governor.forecast(min(self.k, remaining), costs)
            return self.forecast.k
        best, forecasts = self.governor.choose(remaining, costs)
        if self.explore:  # seeding on a calibration prompt: take the listed depth, still forecast it
            k = min(self.explore.pop(0), remaining)
            best = next((f for f in forecasts if f.k == k), None) or self.governor.forecast(k, costs)
        self.forecast = best
        return best.k

    def begin_window(self, k):
        super().begin_window(k)
        if self.planner is not None:
            self.planner.begin()

    def on_step_start(self, n_tokens):
        self.step_tokens = n_tokens

    def end_window(self, k, emitted, window_s):
        super().end_window(k, emitted, window_s)
        if k:
            self.governor.observe_acceptance(k, self.accepted_lengths[-1])
        if self.forecast is not None:
            misses = self.engine.stats.misses - self.window_misses0
            self.governor.observe_window(self.forecast, window_s, misses)
            self.predictions.append((k, self.forecast.window_s, window_s))

    # ---- the plan ----------------------------------------------------------------------------------
    def after_draft_step(self, step, routing, step_s):
        super().after_draft_step(step, routing, step_s)
        self.governor.observe_draft_step(step_s)
        self.planner.after_step(routing, step_s)

    def before_verify(self):
        super().before_verify()
        self.planner.issue(None)

    def before_layer(self, layer, experts, tokens_per_expert):
        super().before_layer(layer, experts, tokens_per_expert)
        if self.verifying:
            self.verify_layer = layer
        plain = self.window_k == 0 and getattr(self, "step_tokens", 0) == 1
        if self.verifying or plain:
            cache, issued = self.engine.cache, self.planner.issued
            keys = [(layer, e) for e in experts]
            before = sum(1 for k in keys if k in cache and k not in issued)
            predicted = sum(1 for k in keys if k in issued)
            n = self.window_k + 1
            self.governor.observe_layer(n, len(keys), before, predicted)

    def place_miss(self, key, n_tokens):
        """Hybrid verification: the host when it is predicted to finish first, its own queue counted."""
        if not self.host_path:
            return FETCH
        c = self.engine.costs
        host = c.host_backlog_s() + c.host_expert_s(n_tokens)
        fetch = c.link_backlog_s(DEMAND_PRIORITY) + c.copy_s() + c.expert_s(n_tokens)
        if host < fetch:
            self.host_calls += 1
            return ON_HOST
        self.fetch_calls += 1
        return FETCH

    verify_layer = -1

    def choose_victim(self, candidates, needed):
        predicted = self.window_draft
        unpredicted = [k for k in candidates if k[1] not in predicted.get(k[0], ())]
        transient = [k for k in unpredicted if k not in self.residents]
        if transient:  # least recently used first
            return transient[0]
        if unpredicted:  # residents the window does not need: least popular first
            return max(unpredicted, key=lambda k: self.popularity.get(k, 0))
        done = [k for k in candidates if k[0] < self.verify_layer]  # layers the verification has passed
        if done:
            return done[0]
        # all predicted and still ahead: give up the one needed last (latest layer, fewest draft tokens)
        return max(candidates, key=lambda k: (k[0], -predicted[k[0]][k[1]]))

    def predicted(self):
        return by_layer(self.planner.planned)

    def metrics(self):
        m = super().metrics()
        g = self.governor
        m.update({"draft_released": self.draft_released, "plain_forecast_ms_per_token": self.plain_forecast_ms,
                  "speculative_forecast_ms_per_token": self.spec_forecast_ms})
        m.update({"k": self.k_option, "host_calls": self.host_calls, "fetch_calls": self.fetch_calls,
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


__all__ = ["Specter", "K_CHOICES", "parse_specter_k"]
