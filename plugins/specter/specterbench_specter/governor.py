"""The window governor (the paper's "Amortization Roofline"): before each window, the time per emitted token of
every depth K, predicted, and the cheapest taken.

For a window of depth K (K = 0: one plain target step over the same cache) with n = K + 1 verified tokens:

    window_s(K) = K · draft_step_s                         the draft (measured moving average, prior from costs)
                + verify_compute_s(n)                      dense layers, the union of routed experts, the head
                + misses(K) · miss_s                       what the cache and the plan do not cover
    tokens(K)   = 1 + Σ_j P(first j proposals accepted)    from the accepted run lengths observed so far

Per MoE layer the verification routes to ``union(n) = min(E, k · n^γ)`` experts (γ fitted to the unions
observed); a share ``hit`` of them is in the cache when the window starts (observed); the plan can bring in at
most the draft's recall of the rest, what the link moves while the draft runs, and what the layer's share of
the cache can hold. ``miss_s`` — what one uncovered expert adds to the window — is fitted to the realised
windows (least squares through the origin on the residual after draft and compute), starting from the cheaper
of a copy and a host computation; what remains is corrected per depth by the realised/modelled ratio there
(recent windows weigh most; between depths taken, interpolated), and the calibration prompts, decoded as the
benchmark will be, take every depth once before the benchmark starts. All times are seconds; every forecast and
the realised time of the window taken are recorded.

Several requests verified together (``batch`` B > 1, :mod:`.batched`): the window's draft runs K batched steps of B
tokens, its verification computes B·(K + 1) positions (dense layers and head over all of them; per MoE layer the
union of the experts routed by all B·(K + 1) tokens, so ``union(B·(K + 1))``, and the misses are priced on that
union), and the cache advances in lock step at the batch's shortest progress. Per request the window emits
``tokens(K, B) / B`` = :meth:`Governor.lockstep_tokens`, the stationary advance of the shared cache:

    1 + E[min over the B requests' runs]  ≤  tokens(K, B) / B  ≤  1 + E[run]  (= tokens(K) at batch 1)

The lower bound is the lock step where every request starts level; a request's tokens accepted past the shortest
run are kept (pending, verified again in its next window, which gives it that many fewer proposals), so the
requests ahead start the next window ahead and the advance is simulated from the observed run-length distribution
rather than taken at the bound. The B requests' runs are taken as independent draws of that one distribution (the
same draft over different texts; runs that move together would make the shortest longer, so the forecast errs
towards plain decoding). What is fitted to realised windows (the draft step's seconds, the union's growth γ, the hit
share, the plan's recall, the seconds per miss and the realised/modelled ratio per depth) is kept per batch size:
a batch of B is forecast only from windows of B requests (its seed included) and the priors; the run-length
distribution is shared, since it is each request's own.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field

K_CHOICES = tuple(range(0, 33, 2))  # 0, 2, …, 32
HAZARD_PRIOR = 8.0  # windows' worth of the geometric hazard in each depth's pooled hazard (a few lucky deep windows
# in the seed must not promise long runs: alone, they can nearly double the forecast tokens per window)
LOCKSTEP_RUNS, LOCKSTEP_WINDOWS, LOCKSTEP_SEED = 8, 64, 0  # the lock step's simulation (see lockstep_tokens)
RATIO_MEMORY = 0.85  # weight of a depth's earlier windows in its realised/modelled ratio at each new one


@dataclass(frozen=True, slots=True)
class WindowForecast:
    k: int
    window_s: float
    tokens: float
    misses: float

    @property
    def per_token_s(self) -> float:
        return self.window_s / self.tokens


@dataclass(frozen=True, slots=True)
class Shape:
    """What the forecast needs of the model and the cache."""

    moe_layers: int
    experts: int  # routed experts per layer (E)
    top_k: int
    slots: int  # expert slots of the whole cache


@dataclass(slots=True)
class BatchFit:
    """What the governor fits to the windows of one batch size (see the module)."""

    gamma_sum: float
    gamma_n: float = 1.0
    hit_sum: float = 0.5  # share of a layer's needed experts cached at the window start
    hit_n: float = 1.0
    recall_sum: float = 0.8  # share of the uncached needed experts the plan predicted
    recall_n: float = 1.0
    draft_step_s: float | None = None
    miss_xy: float = 0.0  # least squares of residual seconds on misses
    miss_xx: float = 0.0
    ratio: dict = field(default_factory=dict)  # K -> (Σ realised s, Σ model s): the model's bias at K


class Governor:
    """Online statistics and the forecast; :meth:`choose` is the argmin over the allowed depths."""

    def __init__(self, shape: Shape, choices=K_CHOICES, prior_acceptance: float = 0.8, prior_gamma: float = 0.5,
                 plan: bool = True):
        self.shape = shape
        self.plan = plan  # False: no prefetch plan covers any of the window's misses (spec-host)
        self.choices = tuple(choices)
        self.accepted, self.rejected = 8.0 * prior_acceptance, 8.0 * (1 - prior_acceptance)  # worth eight trials
        # accepted run lengths (Kaplan-Meier): draft tokens reaching position j, and rejected at j (j = 1..32)
        self.at_risk = [0.0] * (max(self.choices) + 2)
        self.failed = [0.0] * (max(self.choices) + 2)
        self.prior_gamma = prior_gamma
        self.batch = 1  # requests verified together in the windows forecast and observed now (set by the strategy)
        self.width = 1  # a batched window's least width: its requests' most pending tokens (set by the strategy)
        self.leads: list[int] | None = None  # a batch's requests' tokens past its shortest (None: level)
        self.remaining: list[int] | None = None  # a batch's requests' tokens still to decode (None: unbounded)
        self.fits: dict[int, BatchFit] = {}  # batch size -> what its windows fitted
        self.prior_miss_s = 0.0
        self.plan_slots: int | None = None  # slots the plan may copy into (its transients' room); None: the cache
        self.log: list[tuple[int, float, float]] = []  # (K, predicted s, realised s) per window taken

    @property
    def fit(self) -> BatchFit:
        """The fit of the present batch size (the priors until its first window)."""
        fit = self.fits.get(self.batch)
        if fit is None:
            fit = self.fits[self.batch] = BatchFit(self.prior_gamma)
        return fit

    @property
    def draft_step_s(self) -> float | None:
        return self.fit.draft_step_s

    @property
    def ratio(self) -> dict:
        return self.fit.ratio

    # ---- observations ------------------------------------------------------------------------------
    @property
    def acceptance(self) -> float:
        """Per-token acceptance, the geometric model's estimate: accepted tokens over accepted plus rejections
        (a window that accepts all K ends without a rejection)."""
        return min(self.accepted / (self.accepted + self.rejected), 0.995)

    @property
    def gamma(self) -> float:
        return self.fit.gamma_sum / self.fit.gamma_n

    def observe_acceptance(self, proposed: int, accepted: int) -> None:
        self.accepted += accepted
        self.rejected += 1 if accepted < proposed else 0
        for j in range(1, min(accepted + 1, proposed) + 1):
            self.at_risk[j] += 1
        if accepted < proposed:
            self.failed[accepted + 1] += 1

    def survival(self, k: int) -> list[float]:
        """P(the first j proposals are accepted) for j = 1..k: each position's rejection hazard from the run lengths
        observed (Kaplan-Meier), shrunk towards the geometric estimate where few windows reached it. Speculative
        acceptance is bursty: the geometric model alone undervalues deep windows."""
        weight, deepest = 2.0, max((j for j, n in enumerate(self.at_risk) if n > 0), default=0)
        survive, out = 1.0, []
        for j in range(1, k + 1):
            lo = min(j, deepest)  # beyond what was seen: the hazard pooled over the deepest positions seen
            risk, fail = sum(self.at_risk[lo:deepest + 1]), sum(self.failed[lo:deepest + 1])
            geometric = 1 - self.acceptance  # where few windows went this deep, the geometric hazard weighs most
            prior_hazard = (fail + HAZARD_PRIOR * geometric) / (risk + HAZARD_PRIOR) if deepest else geometric
            hazard = (self.failed[j] + weight * prior_hazard) / (self.at_risk[j] + weight)
            survive *= 1 - hazard
            out.append(survive)
        return out

    def expected_tokens(self, k: int) -> float:
        """Tokens a window of depth ``k`` emits at batch 1: 1 + Σ_j P(the first j proposals are accepted)."""
        tokens = 1.0
        for survive in self.survival(k):
            tokens += survive
        return tokens

    def shortest_run_tokens(self, k: int, batch: int) -> float:
        """1 + E[min of ``batch`` runs] = 1 + Σ_j P(run ≥ j)^B, the runs independent draws of the observed
        distribution: what the cache advances by in a window where every request starts level (its run alone)."""
        return 1.0 + sum(survive ** batch for survive in self.survival(k))

    def lockstep_tokens(self, k: int, batch: int, leads=None, remaining=None) -> float:
        """Tokens each request gains per window when ``batch`` requests decode the rest of their tokens in windows of
        depth ``k`` in lock step (:mod:`.batched`): each window request b proposes ``T − p_b`` tokens (``p_b`` its
        pending tokens: 1 plus ``leads[b]``, what it accepted past the last window's shortest — kept, verified
        again), accepts a run ``a_b`` of them and emits ``a_b + 1``; the cache advances by the shortest progress
        ``min_b(p_b + a_b)``. Simulated from the present ``leads`` until every request has its ``remaining`` tokens
        (at most ``LOCKSTEP_WINDOWS`` windows; default: level, unbounded), so a short decode's first window — every
        request level, the cache advancing by the shortest run — and its last, cut short, count as they will. Between
        :meth:`shortest_run_tokens` and :meth:`expected_tokens` (batch 1). The B runs are independent draws of the
        observed run-length distribution (different texts, one draft), with fixed random numbers (a forecast
        repeats), ``LOCKSTEP_RUNS`` times."""
        start = list(leads) if leads else [0] * batch
        if k == 0:  # no proposals: each request still short of its tokens gains one a window, the others none
            if not remaining or max(remaining) <= 0:
                return 1.0
            return sum(max(0, n) for n in remaining) / max(remaining) / batch
        deepest = min(len(self.at_risk) - 2, max(k, *start))  # no window of the simulation is wider
        surv = [-s for s in self.survival(deepest)]  # ascending, for bisect: run ≥ j  ⇔  u < S(j)
        need = list(remaining) if remaining else [1 << 30] * batch
        rng = random.Random(LOCKSTEP_SEED)
        emitted = windows = 0
        for _ in range(LOCKSTEP_RUNS):
            lead, left = start[:], need[:]
            for _ in range(LOCKSTEP_WINDOWS):
                if max(left) <= 0:
                    break
                width = max(k + 1, max(lead) + 1)
                runs = [min(bisect.bisect_left(surv, -rng.random()), width - 1 - d) for d in lead]
                progress = [1 + d + a for d, a in zip(lead, runs)]
                step = min(progress)
                lead = [p - step for p in progress]
                for i, a in enumerate(runs):
                    emitted += max(0, min(a + 1, left[i]))
                    left[i] -= a + 1
                windows += 1
        return emitted / max(1, windows) / batch

    def observe_draft_step(self, seconds: float) -> None:
        fit = self.fit
        d = fit.draft_step_s
        fit.draft_step_s = seconds if d is None else 0.8 * d + 0.2 * seconds

    def observe_layer(self, n_tokens: int, needed: int, cached_before: int, predicted_uncached: int) -> None:
        """One MoE layer of a verification (or plain step) over ``n_tokens``: how many experts it needed, how
        many were cached before this window's plan, and how many of the others the plan had predicted. In a
        batched window ``n_tokens`` counts every request's positions (B·T)."""
        k, fit = self.shape.top_k, self.fit
        if n_tokens > 1 and needed > k:
            fit.gamma_sum += math.log(needed / k) / math.log(n_tokens)
            fit.gamma_n += 1
        elif n_tokens > 1:
            fit.gamma_n += 1  # the tokens shared every expert: γ ≈ 0
        if needed:
            fit.hit_sum += cached_before / needed
            fit.hit_n += 1
            if needed > cached_before and n_tokens > 1:  # a verification: the plan had its say
                fit.recall_sum += predicted_uncached / (needed - cached_before)
                fit.recall_n += 1

    def observe_window(self, forecast: WindowForecast, realised_s: float, misses: int) -> None:
        """The realised time of a window taken; fits ``miss_s`` on what draft and compute do not explain."""
        fit = self.fit
        model_s = forecast.window_s / self.bias(forecast.k)
        explained = model_s - forecast.misses * self.miss_s()
        fit.miss_xy += misses * (realised_s - explained)
        fit.miss_xx += misses * misses
        real, pred = fit.ratio.get(forecast.k, (0.0, 0.0))
        keep = RATIO_MEMORY  # older windows fade: the first forecasts were made before miss_s was fitted
        fit.ratio[forecast.k] = (keep * real + realised_s, keep * pred + model_s)
        self.log.append((forecast.k, forecast.window_s, realised_s))

    def _ratio_at(self, d: int) -> float:
        real, pred = self.ratio[d]
        return real / pred if pred > 0 else 1.0

    def bias(self, k: int) -> float:
        """Realised over modelled window time at depth ``k`` (1.0 before any window): the ratio at ``k`` if it was
        taken, else interpolated between the nearest depths taken on either side (the nearest one beyond them) —
        what the model misses at a depth, e.g. host misses queueing behind each other in short windows."""
        if not self.ratio:
            return 1.0
        if k in self.ratio:
            return self._ratio_at(k)
        below = max((d for d in self.ratio if d < k), default=None)
        above = min((d for d in self.ratio if d > k), default=None)
        if below is None or above is None:
            return self._ratio_at(above if below is None else below)
        w = (k - below) / (above - below)
        return (1 - w) * self._ratio_at(below) + w * self._ratio_at(above)

    def miss_s(self) -> float:
        fit = self.fit
        if fit.miss_xx < 4.0:  # too few misses seen to trust the fit
            return self.prior_miss_s
        return max(0.0, fit.miss_xy / fit.miss_xx)

    # ---- the forecast ------------------------------------------------------------------------------
    def union(self, n_tokens: int) -> float:
        s = self.shape
        return min(float(s.experts), s.top_k * n_tokens ** self.gamma)

    def forecast(self, k: int, costs) -> WindowForecast:
        """``costs``: a :class:`~.window_costs.WindowCosts` (prices at the present context). At ``batch`` B > 1:
        B·T verified positions (T = K + 1, or ``width`` where a request's pending tokens make the window wider),
        T − 1 draft steps of B tokens (none at K = 0), B · :meth:`lockstep_tokens` tokens (see the module)."""
        s, b, fit = self.shape, self.batch, self.fit
        t = k + 1 if b == 1 else max(k + 1, self.width)
        n = b * t
        u = self.union(n)
        hit = fit.hit_sum / fit.hit_n
        uncached = u * (1 - hit)
        if fit.draft_step_s is not None:
            step_s = fit.draft_step_s
        else:  # the prior: one draft forward over B tokens, its experts the union of theirs
            step_s = costs.draft_step_s(b, self.union(b))
        draft_s = (t - 1 if k else 0) * step_s
        planned = 0.0
        if k and self.plan:
            if self.plan_slots is None:
                per_layer_room = max(0.0, s.slots / s.moe_layers - u * hit)
            else:  # the plan copies into transients' room only: the residents' slots are not its to fill
                per_layer_room = self.plan_slots / s.moe_layers
            link_per_layer = draft_s / costs.copy_s() / s.moe_layers if costs.copy_s() > 0 else float("inf")
            planned = min(uncached * fit.recall_sum / fit.recall_n, per_layer_room, link_per_layer)
        misses = s.moe_layers * max(0.0, uncached - planned)
        compute = costs.verify_s(n, u, requests=b)
        tokens = (min(self.expected_tokens(k), costs.remaining) if b == 1
                  else min(self.lockstep_tokens(k, b, self.leads, self.remaining), costs.remaining) * b)
        return WindowForecast(k, (draft_s + compute + misses * self.miss_s()) * self.bias(k), tokens, misses)

    def plain_step_s(self, costs, uncovered: float, union: float | None = None) -> float:
        """Seconds per token of plain decoding (one token per forward, no draft) over a cache that misses a share
        ``uncovered`` of the routed experts — what dropping the draft would give. Priced by the cost model, not by
        the windows' fitted miss cost (a window's misses queue behind each other; a plain step's few do not): per
        layer, ``j`` of the ``top_k`` experts miss with binomial probability; the device computes the ``k - j``
        cached ones while the ``j`` misses are split between the host and the link (a fetched one then computed on
        the device), and the layer takes as long as the slowest of the three.

        At ``batch`` B > 1: one step of B tokens gives B tokens; each layer needs ``union`` experts (default:
        ``union(B)``), each over its share of the B·top_k routings, ``uncovered`` the share of those missing."""
        b, s = self.batch, self.shape
        m = max(1, min(s.experts, round(self.union(b) if union is None else union)))
        t = max(1, round(b * s.top_k / m))  # tokens per needed expert (batch 1: top-k experts, one token each)
        q = min(1.0, max(0.0, uncovered))
        host, fetch, device = costs.host_miss_s(t), costs.fetch_miss_s(t), costs.device_expert_s(t)
        expected = 0.0
        for j in range(m + 1):
            split = min(max(p * fetch, (j - p) * host, (m - j) * device) for p in range(j + 1))
            expected += math.comb(m, j) * q ** j * (1 - q) ** (m - j) * split
        return (costs.verify_s(b, 0.0, requests=b) + s.moe_layers * expected) / b

    def choose(self, remaining: int, costs) -> tuple[WindowForecast, list[WindowForecast]]:
        """The cheapest forecast per emitted token among depths that do not overshoot ``remaining`` tokens (K=0
        always allowed), and every forecast made."""
        self.prior_miss_s = costs.prior_miss_s()
        allowed = [k for k in self.choices if k == 0 or k < remaining + 1] or [0]
        forecasts = [self.forecast(k, costs) for k in allowed]
        return min(forecasts, key=lambda f: (f.per_token_s, f.k)), forecasts
