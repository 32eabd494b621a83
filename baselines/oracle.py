from bisect import bisect_right
from collections import defaultdict

from specterbench import Strategy
from specterbench.errors import EngineViolation


class Oracle(Strategy):
    """Belady eviction with perfect prefetch, from the routing trace recorded by the reference run.

    It knows every future (layer, experts) access of the request. Before each layer it queues copies of the
    next accesses not cached, in order of need, evicting the cached expert used farthest in the future when
    that one is needed later than the expert it makes room for. The bound for a budget: no strategy that has
    to guess does better on hits; on time it is a strong reference, not a proof of optimality.
    """

    name = "oracle"
    version = "1"
    description = "Belady eviction + perfect prefetch from the recorded reference routing (a bound)"
    uses_reference_trace = True

    def on_request_start(self, request):
        if request.reference_trace is None:
            raise EngineViolation("oracle needs the reference routing trace; the runner records it")
        self.trace = request.reference_trace
        self.uses = defaultdict(list)
        for pos, (layer, experts) in enumerate(self.trace):
            for e in experts:
                self.uses[(layer, e)].append(pos)
        self.pos = 0
        self.slots = self.engine.cache.capacity_bytes // self.engine.expert_bytes

    def next_use(self, key):
        uses = self.uses.get(key, ())
        i = bisect_right(uses, self.pos - 1)
        return uses[i] if i < len(uses) else float("inf")

    def before_layer(self, layer, experts, tokens_per_expert):
        if self.pos >= len(self.trace) or self.trace[self.pos] != (layer, tuple(experts)):
            raise EngineViolation(f"oracle: routing at access {self.pos} (layer {layer}) differs from the "
                                  f"reference trace; the run is not the reference's")
        self._prefetch_ahead()

    def _prefetch_ahead(self):
        engine, cache = self.engine, self.engine.cache
        seen, pos = set(), self.pos
        now = set((self.trace[self.pos][0], e) for e in self.trace[self.pos][1])
        while pos < len(self.trace) and len(seen) < self.slots:
            layer, experts = self.trace[pos]
            for e in experts:
                key = (layer, e)
                if key in seen:
                    continue
                seen.add(key)
                if key in cache:
                    continue
                if cache.free_bytes < engine.expert_bytes:
                    victims = [k for k in engine.evictable() if k not in now]
                    if not victims:
                        return
                    victim = max(victims, key=self.next_use)
                    if self.next_use(victim) <= pos:
                        return
                    engine.evict(victim)
                engine.prefetch(key, priority=-pos)
            pos += 1

    def choose_victim(self, candidates, needed):
        return max(candidates, key=self.next_use)

    def after_layer(self, layer, experts):
        self.pos += 1
