from collections import OrderedDict

import torch

from specterbench.strategy import Strategy


class StaticPlacement(Strategy):
    """Pin the most popular experts (by routed tokens on the calibration set) within the budget.

    A demand buffer of ``top_k`` expert slots, charged to the same budget, takes the misses and is recycled
    least-recently-used first; pinned experts are never evicted. The buffer is tracked apart from the pinned
    experts, so choosing a victim costs O(buffer), not O(cache).
    """

    name = "static"
    version = "1"
    description = "pin the calibration set's most popular experts; misses use a small LRU demand buffer"
    uses_calibration = True

    def attach(self, engine):
        super().attach(engine)
        self.pinned: set = set()
        self.buffer: OrderedDict = OrderedDict()  # unpinned experts the misses brought in, least recent first

    def min_cache_bytes(self, engine):
        return engine.min_budget_bytes()

    def prepare(self, engine, calibration=None):
        slots = engine.cache.capacity_bytes // engine.expert_bytes
        n_pinned = max(0, slots - engine.top_k)
        counts = calibration.counts if calibration is not None else torch.zeros(engine.num_layers, engine.num_experts)
        order = torch.argsort(counts.flatten().float(), descending=True, stable=True)[:n_pinned].tolist()
        self.pinned = {divmod(i, engine.num_experts) for i in order}
        for key in sorted(self.pinned):
            engine.prefetch(key)

    def before_layer(self, layer, experts, tokens_per_expert):
        buffer = self.buffer
        for e in experts:
            key = (layer, e)
            if key not in self.pinned:
                buffer[key] = None
                buffer.move_to_end(key)

    def choose_victim(self, candidates, needed):
        cache, victim = self.engine.cache, None
        for key in list(self.buffer):  # the least recently used unpinned candidate, in O(buffer)
            if key not in cache:
                del self.buffer[key]
            elif key in candidates and (victim is None or cache.recency(key) < cache.recency(victim)):
                victim = key
        if victim is not None:
            return victim
        return next((k for k in candidates if k not in self.pinned), None) or next(iter(candidates), None)
