"""Specter's floor: the draft is dropped, and its bytes given to the cache, when it stops paying for itself.

A draft costs device bytes the expert cache would otherwise hold, so speculation is kept only while its best window
is forecast, and then realised, measurably cheaper per token than plain decoding over the larger cache: plain
decoding is the floor, and Specter is never slower than it by more than the forecasts' error.
"""

from __future__ import annotations

import math

import torch


class DraftFloor:
    """Mixed into :class:`~.specter.Specter`: needs ``engine``, ``governor``, ``calibration``, ``slots``, ``k``,
    ``k_option``, ``window_costs``, ``draft_bytes`` and ``load_residents``."""

    draft_released = False
    plain_forecast_ms = spec_forecast_ms = spec_realised_ms = None
    calibration_counts: list = []
    recent_windows: list = []  # (seconds, tokens emitted) of the last speculative windows outside the seed
    seed_windows: list = []  # (K, seconds, tokens emitted) of the seed's speculative windows
    seeding = False
    release_votes = 0
    RELEASE_VOTES = 3  # net windows that must find the draft losing (a winning window takes one vote back)
    RECENT = 16  # speculative windows whose realised time per token the release decision reads
    # the draft stays only while its best window is forecast at least this much cheaper per token than plain
    # decoding without it: the floor (never more than 3% behind the strongest non-speculative strategy) outweighs
    # the last few percent of a draft near break-even, and the forecasts err by about this much
    RELEASE_MARGIN = 0.05

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

    def plain_without_draft_s(self, costs) -> float:
        """Per token, plain decoding once the draft's bytes are cache: the calibration set's most popular experts
        resident in every slot but one layer's top-k (as :meth:`load_residents` would place them), the rest missed
        and placed on the host or fetched (:meth:`Governor.plain_step_s`)."""
        counts = self.calibration_counts
        total = sum(counts) or 1
        e = self.engine
        slots = (e.cache.capacity_bytes + self.draft_bytes(e)) // e.expert_bytes
        if self.governor.batch > 1:  # read at the realised/modelled ratio of the seed's plain batched steps
            uncovered, union = self.batch_cover(max(0, slots - e.top_k), self.governor.batch)
            real, model = self.plain_seen
            ratio = real / model if model > 0 else 1.0
            self.plain_forecast_ms = self.governor.plain_step_s(costs, uncovered, union) * ratio * 1e3
            return self.plain_forecast_ms / 1e3
        covered = sum(counts[:max(0, slots - e.top_k)])
        self.plain_forecast_ms = self.governor.plain_step_s(costs, 1 - covered / total) * 1e3
        return self.plain_forecast_ms / 1e3

    plain_seen = (0.0, 0.0)  # Σ realised s, Σ modelled s of the seed's plain batched steps

    def observe_plain_step(self, seconds: float, costs) -> None:
        """A plain batched step of the seed (K = 0, one pending token a request) took ``seconds``: against
        :meth:`Governor.plain_step_s` over the present cache (the calibration's residents), it gives the ratio the
        forecast of plain decoding without the draft is read at (what the split of misses between host and link does
        not price, e.g. host reads and copies sharing the host's memory)."""
        e, b = self.engine, self.governor.batch
        uncovered, union = self.batch_cover(max(0, self.slots - e.top_k), b)
        real, model = self.plain_seen
        self.plain_seen = (real + seconds, model + b * self.governor.plain_step_s(costs, uncovered, union))

    def batch_cover(self, residents: int, batch: int) -> tuple[float, float]:
        """A plain step of ``batch`` tokens over the calibration's ``residents`` most popular experts: (share of
        each layer's needed experts not resident, experts a layer needs). An expert routed a share ``π`` of a layer's
        tokens (its count over the layer's routings, times top-k) is needed by ``batch`` independent tokens with
        probability ``1 − (1 − π)^batch``."""
        counts = self.calibration.counts.double()  # [layers, experts]
        top_k = self.engine.top_k
        share = (counts * top_k / counts.sum(1, keepdim=True).clamp(min=1)).clamp(max=1.0)
        needed = 1 - (1 - share) ** batch
        order = torch.argsort(counts.flatten(), descending=True, stable=True)[:residents]
        resident = torch.zeros(counts.numel(), dtype=torch.bool)
        resident[order] = True
        missing = needed.flatten()[~resident].sum()
        return float(missing / needed.sum().clamp(min=1e-12)), float(needed.sum(1).mean())

    def release_draft(self) -> None:
        """Drop the draft (``engine.release_device_bytes``): its bytes become cache, filled with the next most
        popular experts; the cell decodes with K = 0 from here on."""
        engine = self.engine
        engine.release_device_bytes(self.draft_bytes(engine))
        self.draft.release()  # the cache now holds those bytes: the copies must not stay allocated beside it
        if self.dense is not None:
            self.dense.release()
        self.draft_released = True
        self.k_option, self.k = 0, 0
        self.slots = engine.cache.capacity_bytes // engine.expert_bytes
        if self.calibration is not None:
            self.load_residents(engine, self.calibration)
