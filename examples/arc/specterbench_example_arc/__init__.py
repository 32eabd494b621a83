"""ARC for the expert cache: Megiddo & Modha's Adaptive Replacement Cache (FAST 2003) as a specterbench strategy.

Experts seen once live in a recency list T1, experts seen again in a frequency list T2; each has a ghost list (B1,
B2) of keys it evicted lately. A routed expert found in a ghost list says which list evicted too early, and moves
the target size ``p`` of T1 towards it. Eviction takes T1's least recently used expert while T1 is over ``p``,
else T2's. Each ghost list keeps at most ``c`` keys (``c``: experts the cache holds), a simplification of the
paper's ``|T1| + |B1| <= c``. A walk-through is in docs/plugins.md ("An ARC cache").
"""

from collections import OrderedDict

from specterbench import Strategy, hookimpl

__version__ = "0.1.0"


class ARC(Strategy):
    name = "example-arc"  # the example's own name: an ARC package of your own can be called "arc" beside it
    version = "1"
    description = "adaptive replacement cache: recency and frequency lists; ghost hits shift the balance"

    def attach(self, engine):
        super().attach(engine)
        self.c = max(1, engine.cache.capacity_bytes // engine.expert_bytes)  # experts the one byte pool holds
        self.p = 0.0  # target length of T1
        self.t1, self.t2, self.b1, self.b2 = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()

    def before_layer(self, layer, experts, tokens_per_expert):  # every routed expert is one access
        for key in ((layer, e) for e in experts):
            if key in self.t1 or key in self.t2:  # seen before and still cached: frequent now
                self.t1.pop(key, None)
            elif key in self.b1:  # T1 evicted it too early: give recency more room
                self.p = min(self.c, self.p + max(len(self.b2) / len(self.b1), 1.0))
                del self.b1[key]
            elif key in self.b2:  # T2 evicted it too early: give frequency more room
                self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
                del self.b2[key]
            else:  # first sight
                self.t1[key] = None
                continue
            self.t2.pop(key, None)
            self.t2[key] = None  # most recently used end

    def choose_victim(self, candidates, needed):  # candidates: evictable now, least recently used first
        lists = [(self.t1, self.b1), (self.t2, self.b2)]
        if len(self.t1) <= self.p:
            lists.reverse()
        for live, ghost in lists:
            victim = next((key for key in live if key in candidates), None)
            if victim is not None:
                del live[victim]
                ghost[victim] = None
                if len(ghost) > self.c:
                    ghost.popitem(last=False)
                return victim
        return candidates[0]  # tracked by neither list (e.g. forced out and fetched again): plain LRU

    def metrics(self):
        return {"arc_target_t1": self.p, "arc_t1": len(self.t1), "arc_t2": len(self.t2)}


@hookimpl
def specterbench_register_strategies(register):
    register(ARC)
