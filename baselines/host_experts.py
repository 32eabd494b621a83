"""What the host-computing baselines share: a fixed set of device experts, every other expert computed on the host
CPU where its weights already are, and a prefill policy that may stream a host expert through the device instead.

Prefill: llama.cpp copies host weights to the device for a batch of at least 32 tokens (its op-offload threshold;
MoE-aware forks such as ik_llama.cpp scale it to ``experts / top-k x 32`` tokens, since each expert sees about
``top-k / experts`` of a batch), otherwise it computes them on the host; KTransformers switches by a token threshold
too. ``prefill=auto`` does that with the MoE-aware threshold, ``stream`` always streams, ``host`` never does;
``priced`` decides per layer by the engine's prefill rule (``engine.costs.prefill_policy``: the layer's host experts
on the host against their copies, each at the profile's rates) and streams the layers where copying is sooner. A
streamed layer's experts are copied into a buffer of one layer's experts (charged to the budget, as llama.cpp's
compute buffer holds a layer's expert tensor) and dropped after the prefill, so that decode never finds them:
nothing is copied during decode. Without room for that buffer, ``auto`` computes the prefill on the host.
"""

from __future__ import annotations

import math

from specterbench.errors import UsageError
from specterbench.strategy import DEVICE, FETCH, HOST, ON_HOST, Strategy

PREFILL = ("auto", "stream", "host", "priced")
OP_OFFLOAD_TOKENS = 32  # llama.cpp's minimum batch for copying host weights to the device


def stream_threshold(num_experts: int, top_k: int) -> int:
    """Tokens of a forward from which a host expert streams through the device (``prefill=auto``)."""
    return max(OP_OFFLOAD_TOKENS, OP_OFFLOAD_TOKENS * num_experts // max(1, top_k))


def check_threads(name: str, value) -> int:
    try:
        threads = int(value)
    except (TypeError, ValueError):
        threads = 0
    if threads < 1:
        raise UsageError(f"{name} option threads={value!r} is invalid: use a positive integer")
    return threads


class HostExperts(Strategy):
    """Pinned device experts (``self.pinned``, chosen by a subclass in :meth:`prepare`), the others on the host."""

    uses_calibration = True

    @classmethod
    def option_names(cls):
        return ("prefill", "threads")

    @classmethod
    def validate_options(cls, options: dict) -> None:
        if str(options.get("prefill", "auto")) not in PREFILL:
            raise UsageError(f"{cls.name} option prefill={options.get('prefill')!r} is invalid: use one of "
                             f"{', '.join(PREFILL)}")
        if "threads" in options:
            check_threads(cls.name, options["threads"])

    def __init__(self, **options):
        super().__init__(**options)
        self.validate_options(options)
        self.prefill = str(options.get("prefill", "auto"))

    @classmethod
    def min_budget(cls, engine, options: dict) -> int:
        """Nothing on the device is needed: every expert can run on the host (a streamed prefill only where it
        fits)."""
        if str(options.get("prefill", "auto")) != "stream":
            return 0
        per_real_layer = math.ceil(engine.num_experts / max(1.0, engine.geometry.layer_scale))
        return max(engine.top_k, per_real_layer) * engine.expert_bytes

    def stream_slots_bytes(self, engine) -> int:
        """Device bytes kept for streaming host experts in a prefill (none with ``prefill=host``): one priced layer's
        experts — under a projection a stand-in layer stands for ``layer_scale`` real ones, so a real layer's share
        of it, and the engine streams a stand-in layer through that room an expert at a time."""
        if self.prefill == "host":
            return 0
        per_real_layer = math.ceil(engine.num_experts / max(1.0, engine.geometry.layer_scale))
        return max(engine.top_k, per_real_layer) * engine.expert_bytes

    def attach(self, engine):
        super().attach(engine)
        self.pinned: set = set()
        self.forward_tokens = 0
        self.streams = self.host_calls = self.decode_copies = 0
        available = engine.clock.host_threads_available
        self.threads = min(int(self.options.get("threads", available)), available)
        engine.host_threads = self.threads
        self.streaming_room = engine.cache.capacity_bytes - len(self.planned_pins(engine)) * engine.expert_bytes \
            >= self.stream_slots_bytes(engine) > 0

    def planned_pins(self, engine) -> set:
        """The experts this strategy pins (known before :meth:`prepare` copies them)."""
        return set()

    def on_step_start(self, n_tokens: int) -> None:
        self.forward_tokens = n_tokens
        self.layer_streams = False

    def prefill_layer(self, layer, experts, tokens_per_expert):
        """``prefill=priced``: whether this layer's host experts stream, by the engine's rule (they stream through
        this strategy's own buffer, so the engine's answer is only read as host or not)."""
        if self.prefill == "priced" and self.streaming_room:
            routed = [(e, n) for e, n in zip(experts, tokens_per_expert) if (layer, e) not in self.pinned]
            policy = self.engine.costs.prefill_policy(layer, [e for e, _ in routed], [n for _, n in routed])
            self.layer_streams = policy.policy != HOST
        return DEVICE

    layer_streams = False

    def streams_now(self) -> bool:
        if self.prefill == "host" or not self.streaming_room:
            return False
        if self.prefill == "priced":
            return self.layer_streams
        engine = self.engine
        return self.prefill == "stream" or self.forward_tokens >= stream_threshold(engine.num_experts, engine.top_k)

    def place_miss(self, key, n_tokens):
        if key in self.pinned:
            return FETCH  # a pinned expert whose copy has not landed yet
        if self.forward_tokens > 1 and self.streams_now():
            self.streams += 1
            return FETCH
        self.host_calls += 1
        return ON_HOST

    def choose_victim(self, candidates, needed):
        return next((k for k in candidates if k not in self.pinned), None)

    def on_step_end(self, new_tokens) -> None:
        if self.forward_tokens > 1:  # the streamed experts go with the prefill: decode finds none
            for key in [k for k in self.engine.cache.keys() if k not in self.pinned]:
                self.engine.evict(key)

    def on_warmup_end(self):
        self.streams = self.host_calls = 0

    def metrics(self):
        if not self.streaming_room and self.prefill in ("auto", "priced"):
            prefill = f"{self.prefill}: on the host (no room to stream)"
        elif self.prefill == "auto":
            prefill = f"auto: streamed from {stream_threshold(self.engine.num_experts, self.engine.top_k)} tokens"
        elif self.prefill == "priced":
            prefill = "priced: per layer by the engine's prefill rule"
        else:
            prefill = self.prefill
        return {"prefill": prefill, "host_calls": self.host_calls, "streamed_experts": self.streams,
                "host_threads": self.threads, "pinned_experts": len(self.pinned)}
