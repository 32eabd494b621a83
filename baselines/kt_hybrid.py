from collections import Counter, deque

import torch

from specterbench.errors import UsageError

from .host_experts import HostExperts

PLACEMENTS = ("frequency", "uniform", "front-loading")


class KtHybrid(HostExperts):
    """KTransformers' CPU/GPU hybrid (kt-kernel, as an SGLang backend): attention, routers, shared experts and the KV
    cache on the device; a per-layer set of GPU experts (``--kt-num-gpu-experts``) pinned by ``placement``; every
    other routed expert computed by the host's expert kernels, beside the device's work on the same layer.

    - ``placement=frequency`` (default): each layer's most used experts on the calibration set;
    - ``uniform``: the same number in every layer, the lowest expert ids (placement by position only);
    - ``front-loading``: whole layers from the first one on (the reverse of llama.cpp's split).

    ``rebalance=N`` re-pins each layer's hottest experts from the last ``N`` tokens' routing every ``N`` decode tokens
    (KTransformers' dynamic expert update); each copy in is priced on the link like any other. ``gpu_experts``: GPU
    experts per layer (default: as many as the budget holds, less the slots a streamed prefill needs).
    """

    name = "kt-hybrid"
    version = "2"  # 2: the stream buffer is one real layer's experts under a projection, not a stand-in layer's
    description = "KTransformers: per-layer GPU experts by placement, the rest on the host's expert kernels"

    @classmethod
    def option_names(cls):
        return ("placement", "rebalance", "gpu_experts", *super().option_names())

    @classmethod
    def validate_options(cls, options: dict) -> None:
        super().validate_options(options)
        if str(options.get("placement", "frequency")) not in PLACEMENTS:
            raise UsageError(f"kt-hybrid option placement={options.get('placement')!r} is unknown: use one of "
                             f"{', '.join(PLACEMENTS)}")
        for option in ("rebalance", "gpu_experts"):
            if option in options:
                try:
                    ok = int(options[option]) > 0
                except (TypeError, ValueError):
                    ok = False
                if not ok:
                    unit = "decode tokens" if option == "rebalance" else "experts per layer"
                    raise UsageError(f"kt-hybrid option {option}={options[option]!r} is invalid: give a positive "
                                     f"number of {unit}")

    def __init__(self, **options):
        super().__init__(**options)
        self.placement = str(options.get("placement", "frequency"))
        self.rebalance = int(options.get("rebalance", 0))

    def fit_budget(self, engine, budget_bytes: int) -> None:
        slots = max(0, budget_bytes - self.stream_slots_bytes(engine)) // engine.expert_bytes
        self.per_layer = min(engine.num_experts, int(self.options.get("gpu_experts", slots // engine.num_layers)))
        self.total_pins = min(slots, engine.num_experts * engine.num_layers) if self.placement == "front-loading" \
            else self.per_layer * engine.num_layers

    def min_cache_bytes(self, engine):
        return self.total_pins * engine.expert_bytes + (self.stream_slots_bytes(engine)
                                                        if self.prefill == "stream" else 0)

    def planned_pins(self, engine) -> set:
        return set(range(self.total_pins))  # their count is what the room check reads; the keys come in prepare

    def prepare(self, engine, calibration=None):
        E, L = engine.num_experts, engine.num_layers
        if self.placement == "front-loading":
            self.pinned = {divmod(i, E) for i in range(self.total_pins)}
        elif self.placement == "uniform":
            self.pinned = {(layer, e) for layer in range(L) for e in range(self.per_layer)}
        else:
            counts = calibration.counts if calibration is not None else torch.zeros(L, E)
            self.pinned = {(layer, int(e)) for layer in range(L)
                           for e in torch.argsort(counts[layer].float(), descending=True, stable=True)[:self.per_layer]}
        for key in sorted(self.pinned):
            engine.prefetch(key)
        self.window: deque = deque()  # per decode token: the (layer, expert) keys it routed to
        self.repins = self.decode_tokens = 0

    def after_layer(self, layer, experts):
        if self.rebalance and self.forward_tokens == 1:
            self.step_keys.extend((layer, e) for e in experts)

    def on_step_start(self, n_tokens: int) -> None:
        super().on_step_start(n_tokens)
        self.step_keys = []

    def on_step_end(self, new_tokens) -> None:
        super().on_step_end(new_tokens)
        if not self.rebalance or self.forward_tokens != 1 or self.engine.warming_up:
            return
        self.window.append(self.step_keys)
        if len(self.window) > self.rebalance:
            self.window.popleft()
        self.decode_tokens += 1
        if self.decode_tokens % self.rebalance == 0 and self.placement != "front-loading":
            self._repin()

    def _repin(self) -> None:
        """Each layer's ``per_layer`` hottest experts of the window pinned; those leaving evicted, those coming
        copied in (on the link, as any copy)."""
        engine, counts = self.engine, Counter(k for keys in self.window for k in keys)
        hot = set()
        for layer in range(engine.num_layers):
            ranked = sorted((k for k in counts if k[0] == layer), key=lambda k: (-counts[k], k[1]))
            keep = [k for k in self.pinned if k[0] == layer]
            hot |= set((ranked + sorted(keep, key=lambda k: -counts[k]))[: self.per_layer])
        leaving, coming = self.pinned - hot, hot - self.pinned
        for key in sorted(leaving):
            if key in engine.cache:
                engine.evict(key)
        self.pinned = (self.pinned - leaving) | coming
        for key in sorted(coming):
            engine.prefetch(key)
            self.repins += 1

    def metrics(self):
        m = super().metrics()
        m.update({"placement": self.placement, "gpu_experts_per_layer": self.per_layer,
                  "rebalance": self.rebalance or None, "repinned_copies": getattr(self, "repins", 0)})
        return m
