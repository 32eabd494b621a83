from .lru import LRU


class LFRU(LRU):
    """Frequency and recency together (LRFU, Lee et al. 2001): each expert keeps a combined recency-frequency
    score ``crf = sum over its past uses of 2 ** (-decay * age)``, age counted in layer visits; the lowest score
    goes first. ``decay`` → ∞ is LRU, ``decay`` = 0 is LFU. Per-layer quotas as in :class:`LRU`."""

    name = "lfru"
    version = "3"  # 3: a prompt's misses fetched again, as lru (2: the engine's per-layer prefill rule)
    description = "per-layer LRFU: evict the lowest combined recency-frequency score"

    @classmethod
    def option_names(cls):
        return ("decay",)

    def attach(self, engine):
        super().attach(engine)
        self.decay = float(self.options.get("decay", 0.05))
        self.crf: dict = {}  # key -> (score at last use, time of last use)
        self.t = 0

    def before_layer(self, layer, experts, tokens_per_expert):
        self.t += 1
        for e in experts:
            score, last = self.crf.get((layer, e), (0.0, self.t))
            self.crf[(layer, e)] = (1.0 + score * 2.0 ** (-self.decay * (self.t - last)), self.t)

    def score(self, key):
        score, last = self.crf.get(key, (0.0, self.t))
        return score * 2.0 ** (-self.decay * (self.t - last))

    def pick(self, keys):
        return min(keys, key=self.score)  # min is stable: ties go to the least recently used
