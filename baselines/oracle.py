from bisect import bisect_right
from collections import defaultdict

from specterbench import Strategy
from specterbench.errors import EngineViolation


class Oracle(Strategy):
    """Belady eviction with perfect prefetch, from the routing trace recorded by the reference run.

    At the start of a request it replays the whole future access sequence through Belady's algorithm (evict
    the expert used farthest in the future) from the cache's current contents: that is the fewest copies any
    strategy can make with this cache. It then issues each of those copies at the earliest safe moment — right
    after the last use of the expert it replaces — in order of need. The bound on hits and bytes at this budget;
    on time a strong reference, not a proof of optimality (copy order and link contention are not optimised).
    """

    name = "oracle"
    version = "2"
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
        self.schedule = self._belady_schedule()  # [(issue_pos, need_pos, key, victim or None)]
        self.next_event = 0

    def next_use(self, key, after=None):
        """First position ≥ ``after`` (default: the current one) where ``key`` is used; inf if never."""
        uses = self.uses.get(key, ())
        i = bisect_right(uses, (self.pos if after is None else after) - 1)
        return uses[i] if i < len(uses) else float("inf")

    def _belady_schedule(self):
        engine = self.engine
        slots = engine.cache.capacity_bytes // engine.expert_bytes
        cache = set(engine.cache.keys())
        last_use = {k: -1 for k in cache}
        events = []
        for pos, (layer, experts) in enumerate(self.trace):
            now = {(layer, e) for e in experts}
            for key in sorted(now):
                if key not in cache:
                    victim = None
                    if len(cache) >= slots:
                        others = [k for k in cache if k not in now] or list(cache)
                        victim = max(others, key=lambda k: self.next_use(k, after=pos + 1))
                        cache.remove(victim)
                    cache.add(key)
                    if victim in now:  # a layer wider than the cache: the engine's demand path swaps these
                        continue
                    # safe to copy once the replaced expert has had its last use before this need
                    issue = (last_use.get(victim, -1) + 1) if victim is not None else 0
                    events.append((min(issue, pos), pos, key, victim))
                last_use[key] = pos
        events.sort(key=lambda ev: (ev[0], ev[1]))
        return events

    def before_layer(self, layer, experts, tokens_per_expert):
        if self.pos >= len(self.trace) or self.trace[self.pos] != (layer, tuple(experts)):
            raise EngineViolation(f"oracle: routing at access {self.pos} (layer {layer}) differs from the "
                                  f"reference trace; the run is not the reference's")
        engine = self.engine
        while self.next_event < len(self.schedule) and self.schedule[self.next_event][0] <= self.pos:
            _, need, key, victim = self.schedule[self.next_event]
            self.next_event += 1
            if key in engine.cache:
                continue
            if victim is not None and victim in engine.cache and victim in engine.evictable():
                engine.evict(victim)
            engine.prefetch(key, priority=-need)  # no room: the demand path will fetch it (Belady victims)

    def choose_victim(self, candidates, needed):
        return max(candidates, key=self.next_use)

    def after_layer(self, layer, experts):
        self.pos += 1
