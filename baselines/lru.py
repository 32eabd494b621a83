from collections import Counter

from specterbench import Strategy


class LRU(Strategy):
    """Per-layer least-recently-used caches, as in mixtral-offloading.

    The cache's slots are split evenly across MoE layers (the remainder going to the first layers); a miss in a
    layer that is at its quota evicts from that layer. While the cache is filling, a layer may use free slots.
    Subclasses change only :meth:`pick`, the order in which a layer's experts are given up.
    """

    name = "lru"
    version = "1"
    description = "per-layer LRU expert cache (mixtral-offloading)"

    def attach(self, engine):
        super().attach(engine)
        slots = engine.cache.capacity_bytes // engine.expert_bytes
        base, extra = divmod(slots, engine.num_layers)
        self.quota = [base + (1 if layer < extra else 0) for layer in range(engine.num_layers)]

    def pick(self, keys):
        """The victim among ``keys`` (least recently used first)."""
        return keys[0]

    def choose_victim(self, candidates, needed):
        held = Counter(layer for layer, _ in self.engine.cache.keys())
        if needed is not None and held[needed[0]] >= self.quota[needed[0]]:
            same = [k for k in candidates if k[0] == needed[0]]
            # at quota with nothing of its own to give up yet: wait for this layer's computed experts
            return self.pick(same) if same else None
        over = [k for k in candidates if held[k[0]] > self.quota[k[0]]]
        return self.pick(over or candidates)
