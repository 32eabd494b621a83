import heapq
from bisect import bisect_right
from collections import defaultdict

from specterbench.errors import EngineViolation
from specterbench.strategy import Strategy

INF = float("inf")


class _Farthest:
    """Cached experts keyed by next use, farthest first: a heap with lazy invalidation (O(log n) per update)."""

    def __init__(self):
        self.heap: list = []
        self.next_use: dict = {}

    def update(self, key, next_use) -> None:
        self.next_use[key] = next_use
        heapq.heappush(self.heap, (-next_use, key))

    def farthest(self, allowed, skip=()):
        """The valid entry of largest next use whose key passes ``allowed`` and is not in ``skip``; None if none.
        Valid entries it passes over are kept."""
        heap, kept, found = self.heap, [], None
        while heap:
            neg, key = heap[0]
            if self.next_use.get(key) != -neg or not allowed(key):
                heapq.heappop(heap)  # stale (re-keyed, or no longer cached)
                continue
            if key in skip:
                kept.append(heapq.heappop(heap))
                continue
            found = key
            break
        for entry in kept:
            heapq.heappush(heap, entry)
        return found


class Oracle(Strategy):
    """Belady eviction with perfect prefetch, from the routing trace recorded by the reference run: **the bound for
    per-token, fetch-only decoding** at this budget (one token per forward, every miss fetched). It bounds neither
    host execution of misses (``cpu-experts`` beats it where the link is slow) nor speculation (a verification reads
    each expert once for a whole window): those are bounded by ``oracle-spec``.

    At the start of a request it replays the whole future access sequence through Belady's algorithm (evict
    the expert used farthest in the future) from the cache's current contents: that is the fewest copies any
    strategy can make with this cache. It then issues each of those copies at the earliest safe moment — right
    after the last use of the expert it replaces — in order of need. The bound on hits and bytes at this budget;
    on time a strong reference, not a proof of optimality (copy order and link contention are not optimised).
    Both the replay and eviction at run time keep cached experts in a heap keyed by next use: O(log n) per
    access, never a scan of the cache or the trace per call.
    """

    name = "oracle"
    version = "3"
    description = ("Belady eviction + perfect prefetch from the recorded reference routing: the bound for per-token, "
                   "fetch-only decoding")
    uses_reference_trace = True
    max_batch = 1
    max_batch_reason = "Belady over one request's recorded routing"

    def on_request_start(self, request):
        if request.reference_trace is None:
            raise EngineViolation(f"{self.name} needs the reference routing trace; the runner records it")
        self.start_trace(request.reference_trace)

    def start_trace(self, trace) -> None:
        """Plan the request from ``trace``: the (layer, experts) of every MoE layer call the run will make."""
        self.trace = trace
        self.uses = defaultdict(list)
        for pos, (layer, experts) in enumerate(self.trace):
            for e in experts:
                self.uses[(layer, e)].append(pos)
        self.pos = 0
        self.schedule = self._belady_schedule()  # [(issue_pos, need_pos, key, victim or None)]
        self.next_event = 0
        self.live = _Farthest()  # the engine's cached experts by next use (run time)
        for key in self.engine.cache.keys():
            self.live.update(key, self.next_use(key))

    def next_use(self, key, after=None):
        """First position ≥ ``after`` (default: the current one) where ``key`` is used; inf if never."""
        uses = self.uses.get(key, ())
        i = bisect_right(uses, (self.pos if after is None else after) - 1)
        return uses[i] if i < len(uses) else INF

    def _belady_schedule(self):
        engine = self.engine
        slots = engine.cache.capacity_bytes // engine.expert_bytes
        cache = set(engine.cache.keys())
        farthest = _Farthest()
        for key in cache:
            farthest.update(key, self.next_use(key, after=0))
        last_use = {k: -1 for k in cache}
        events = []
        for pos, (layer, experts) in enumerate(self.trace):
            now = {(layer, e) for e in experts}
            for key in sorted(now):
                if key not in cache:
                    victim = None
                    if len(cache) >= slots:
                        victim = farthest.farthest(cache.__contains__, skip=now)
                        if victim is None:  # a layer wider than the cache: every cached expert is needed now
                            victim = farthest.farthest(cache.__contains__)
                        cache.remove(victim)
                    cache.add(key)
                    farthest.update(key, pos)  # used now; re-keyed by its next use after this position
                    if victim in now:  # a layer wider than the cache: the engine's demand path swaps these
                        continue
                    # safe to copy once the replaced expert has had its last use before this need
                    issue = (last_use.get(victim, -1) + 1) if victim is not None else 0
                    events.append((min(issue, pos), pos, key, victim))
                last_use[key] = pos
            for key in now:
                if key in cache:
                    farthest.update(key, self.next_use(key, after=pos + 1))
        events.sort(key=lambda ev: (ev[0], ev[1]))
        return events

    def before_layer(self, layer, experts, tokens_per_expert):
        if self.pos >= len(self.trace) or self.trace[self.pos] != (layer, tuple(experts)):
            raise EngineViolation(f"oracle: routing at access {self.pos} (layer {layer}) differs from the "
                                  f"reference trace; the run is not the reference's")
        self.issue_due()

    def issue_due(self) -> None:
        """Issue the schedule's copies due at the present access (each replacing its Belady victim)."""
        engine = self.engine
        while self.next_event < len(self.schedule) and self.schedule[self.next_event][0] <= self.pos:
            _, need, key, victim = self.schedule[self.next_event]
            self.next_event += 1
            if key in engine.cache:
                continue
            if victim is not None and victim in engine.candidates():
                engine.evict(victim)
            if engine.prefetch(key, priority=-need):  # no room: the demand path will fetch it (Belady victims)
                self.live.update(key, self.next_use(key))

    def on_miss(self, key):
        self.live.update(key, self.pos)  # fetched now, used at this position

    def choose_victim(self, candidates, needed):
        cache = self.engine.cache
        victim = self.live.farthest(cache.__contains__, skip=_Excluded(candidates))
        return victim if victim is not None else max(candidates, key=self.next_use)

    def after_layer(self, layer, experts):
        for e in experts:
            key = (layer, e)
            if key in self.engine.cache:
                self.live.update(key, self.next_use(key, after=self.pos + 1))
        self.pos += 1


class _Excluded:
    """``key in _Excluded(candidates)``: the key may not be evicted now."""

    __slots__ = ("candidates",)

    def __init__(self, candidates):
        self.candidates = candidates

    def __contains__(self, key) -> bool:
        return key not in self.candidates
