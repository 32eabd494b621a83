from specterbench.engine.draft import QuantSpec, quantized_bytes, shared_quantized
from specterbench.engine.precision import check_draft_below
from specterbench.strategy import SUBSTITUTE

from .lru import LRU


class MixedPrecision(LRU):
    """HOBBIT-style (lossy): a miss computes with the expert's 4-bit copy, resident on the device and charged
    to the budget, instead of waiting for the 16-bit weights; with ``fetch_on_miss`` (default) the 16-bit
    expert is also fetched in the background for later tokens. Per-layer LRU for the 16-bit cache."""

    name = "mixed-precision"
    version = "1"
    description = "LOSSY (HOBBIT): on a miss compute with the resident 4-bit copy; fetch 16-bit for later"
    lossless = False

    @classmethod
    def option_names(cls):
        return (*QuantSpec.OPTIONS, "fetch_on_miss")

    def __init__(self, **options):
        super().__init__(**options)
        self.spec = QuantSpec.from_options(options)
        self.fetch_on_miss = bool(options.get("fetch_on_miss", True))

    @classmethod
    def check_budget(cls, engine, budget_bytes, options):
        check_draft_below(engine.precision, QuantSpec.from_options(options), cls.name)

    def device_bytes(self, engine):
        return quantized_bytes(engine, self.spec)

    def attach(self, engine):
        check_draft_below(engine.precision, self.spec, self.name)  # a low-bit copy must be below the target
        super().attach(engine)
        self.low = shared_quantized(engine, self.spec)
        self.current = set()

    def before_layer(self, layer, experts, tokens_per_expert):
        self.current = {(layer, e) for e in experts}

    def place_miss(self, key, n_tokens):
        engine = self.engine
        if self.fetch_on_miss and engine.make_room(engine.expert_bytes, protect=self.current, needed=key):
            engine.prefetch(key, priority=0.0)  # in the background, for the next tokens
        return SUBSTITUTE

    def substitute(self, key):
        return self.low.weights(key), self.low.bytes_ratio, self.low.kernel
