from .lru import LRU


class NextLayerGate(LRU):
    """Pre-gated prefetch (mixtral-offloading's speculative loading; Pre-gated MoE): apply layer L+1's router to
    layer L's MoE input and prefetch its top-k while layer L computes — hidden states change little from one layer to
    the next, so the guess is mostly right and its copies overlap compute. Caching and eviction as in :class:`LRU`."""

    name = "next-layer-gate"
    version = "3"  # 3: a prompt's misses fetched again, as lru (2: the engine's per-layer prefill rule)
    description = "per-layer LRU + prefetch of next layer's experts guessed by its gate one layer early"

    def before_layer(self, layer, experts, tokens_per_expert):
        engine = self.engine
        nxt = layer + 1
        if nxt >= engine.num_layers:
            return
        guess = engine.router_guess(nxt).experts()  # the next router on this layer's MoE input (charged)
        protect = {(layer, e) for e in experts} | {(nxt, e) for e in guess}
        for e in guess:
            key = (nxt, e)
            if key in engine.cache:
                continue
            if not engine.make_room(engine.expert_bytes, protect=protect, needed=key):
                return
            engine.prefetch(key, priority=1.0)
