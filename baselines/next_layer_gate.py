from .lru import LRU


class NextLayerGate(LRU):
    """Pre-gated prefetch (mixtral-offloading's speculative loading; Pre-gated MoE): apply layer L+1's router to
    layer L's MoE input and prefetch its top-k while layer L computes. Caching and eviction as in :class:`LRU`."""

    name = "next-layer-gate"
    version = "1"
    description = "per-layer LRU + prefetch of next layer's experts guessed by its gate one layer early"

    def before_layer(self, layer, experts, tokens_per_expert):
        engine = self.engine
        nxt = layer + 1
        if nxt >= engine.num_layers:
            return
        hidden = engine.current_hidden  # [T, H]
        g = engine.geometry
        engine.clock.compute(g.layer_scale * 2 * hidden.shape[0] * g.hidden * g.num_experts,
                             g.layer_scale * g.hidden * g.num_experts * g.dtype_bytes, 1)
        _, _, guess = engine.gates[nxt](hidden)  # [T, k]
        protect = {(layer, e) for e in experts} | {(nxt, int(e)) for e in guess.unique()}
        for e in guess.unique().tolist():
            key = (nxt, e)
            if key in engine.cache:
                continue
            if not engine.make_room(engine.expert_bytes, protect=protect, needed=key):
                return
            engine.prefetch(key, priority=1.0)
