"""The speculative baselines and the artifact's reproduction.

- ``spec-decode``: self-draft speculative decoding over a per-layer LRU cache, no prefetch plan (an ablation).
- ``specmoeoff``: the artifact's second baseline (SpecMoEOff): a same-family 4-bit draft, K = 3, and after the
  draft the top-M experts of each layer by the draft's routing frequency are prefetched; per-layer LRU.
- ``specter-artifact``: the Specter artifact as published — its planner (:class:`~.planner.ArtifactPlanner`),
  per-layer slot groups (LRU inside a layer), K profiled over {2, 4, 6, 8, 12, 16, 20, 24, 32} on calibration
  prompts, a GPTQ-INT4-g128-sized draft (4 bits, fp16 scale and 4-bit zero per 128 weights ≈ 4.16 bits) whose
  routed experts run as one fused 4-bit kernel per layer.
"""

from __future__ import annotations

from specterbench.baselines.lru import LRU

from .decoding import SpeculativeDecoding, parse_k
from .planner import ArtifactPlanner, by_layer, issue_layer_plan, top_m

ARTIFACT_K = (2, 4, 6, 8, 12, 16, 20, 24, 32)
INT4_G128 = {"bits": 4, "blocksize": 128, "quantizer": "int"}


class PerLayerLRU(SpeculativeDecoding):
    """Speculative decoding over per-layer LRU slot groups (mixtral-offloading's cache)."""

    def attach(self, engine):
        super().attach(engine)
        self._lru = LRU()
        self._lru.attach(engine)
        self.slots_per_layer = max(1, min(self._lru.quota))

    def choose_victim(self, candidates, needed):
        return self._lru.choose_victim(candidates, needed)


class SpecDecode(PerLayerLRU):
    name = "spec-decode"
    description = "self-draft speculative decoding (4-bit draft) over a per-layer LRU cache, no prefetch plan"


class SpecMoEOff(PerLayerLRU):
    name = "specmoeoff"
    version = "1"
    description = ("SpecMoEOff: same-family 4-bit draft, K=3, route-frequency top-M prefetch per layer after the "
                   "draft, per-layer LRU")
    draft_defaults = INT4_G128

    planned: frozenset = frozenset()

    def __init__(self, **options):
        options.setdefault("k", 3)
        super().__init__(**options)

    def begin_window(self, k):
        super().begin_window(k)
        self.planned = set()

    def before_verify(self):
        super().before_verify()
        engine = self.engine
        plans = top_m(self.window_draft, self.slots_per_layer)
        protect = {(l, e) for l, es in plans.items() for e in es}
        for layer, experts in plans.items():
            self.planned.update(issue_layer_plan(engine, layer, experts, protect)[0])

    def predicted(self):
        return by_layer(self.planned)


class SpecterArtifact(PerLayerLRU):
    name = "specter-artifact"
    version = "1"
    description = ("the Specter artifact reproduced: INT4-g128 self-draft, bandwidth-aware top-M planner with a "
                   "0.2K cold start, per-layer slot groups, K profiled over 2..32")
    draft_defaults = INT4_G128
    k_candidates = ARTIFACT_K
    profile_tokens = 32

    @classmethod
    def parse_depth(cls, value):
        return parse_k(value, ARTIFACT_K)

    def __init__(self, **options):
        super().__init__(**options)
        if self.k_option == "auto":
            self.k = 16  # the artifact's default for DeepSeek, until the profiler picks

    planner = None

    def attach(self, engine):
        super().attach(engine)
        self.planner = ArtifactPlanner(engine, self.slots_per_layer)

    def begin_window(self, k):
        super().begin_window(k)
        if self.planner is not None:
            self.planner.begin(k)

    def after_draft_step(self, step, routing, step_s):
        super().after_draft_step(step, routing, step_s)
        self.planner.after_step(step, routing, step_s)

    def before_verify(self):
        super().before_verify()
        self.planner.barrier()

    def predicted(self):
        return by_layer(self.planner.planned)

    def metrics(self):
        m = super().metrics()
        m["planner_bandwidth_gbps"] = self.planner.bw_bytes_per_s / 1e9
        m["planner_draft_step_ms"] = self.planner.draft_step_s * 1e3
        return m
