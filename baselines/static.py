import torch

from specterbench import Strategy


class StaticPlacement(Strategy):
    """Pin the most popular experts (by routed tokens on the calibration set) within the budget.

    A demand buffer of ``top_k`` expert slots, charged to the same budget, takes the misses and is recycled
    least-recently-used first; pinned experts are never evicted.
    """

    name = "static"
    version = "1"
    description = "pin the calibration set's most popular experts; misses use a small LRU demand buffer"
    uses_calibration = True

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

    def choose_victim(self, candidates, needed):
        unpinned = [k for k in candidates if k not in self.pinned]
        return (unpinned or candidates)[0]
