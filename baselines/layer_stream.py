from specterbench.strategy import DEMAND_PRIORITY, PrefetchResult, Strategy


class LayerStream(Strategy):
    """The throughput systems' layer-streamed pipeline (MoE-Lightning, Klotski): the KV cache and attention stay on
    the device, and each MoE layer's experts — all of them, whatever the routing — are streamed in once per step for
    the whole batch, the next layer's copies queued while this layer computes.

    The cache is a stream buffer of two layers' experts (the one computing and the next); every whole layer the rest
    of the budget holds beyond it is kept resident (the first layers, as MoE-Lightning's policy keeps what fits).
    A streamed layer computes only once every one of its experts has landed (so a step moves the same bytes at any
    batch), and its experts are dropped once it has run (the layer is used again only a step later, the furthest
    future of anything cached) and the next streamed layers are queued nearest first, each copy only into free
    bytes, never ahead of what the running layer still has to fetch. A batch large enough to touch every expert of a
    layer makes whole-layer streaming no more than the union a demand cache fetches, with the copies overlapped;
    at batch 1 it moves every expert for top-k's worth of use.
    """

    name = "layer-stream"
    version = "2"
    description = ("MoE-Lightning / Klotski: every expert of each layer streamed once per step for the whole batch, "
                   "the next layer's copies overlapped with this one's compute; whole layers that fit stay resident")

    @classmethod
    def min_budget(cls, engine, options: dict) -> int:
        """One whole layer's experts: a layer computes only once every one of them has landed."""
        return engine.num_experts * engine.expert_bytes

    def attach(self, engine):
        super().attach(engine)
        self.layer_bytes = engine.num_experts * engine.expert_bytes
        spare = engine.cache.capacity_bytes - 2 * self.layer_bytes
        self.resident_layers = min(engine.num_layers, max(0, spare // self.layer_bytes))
        self.streamed = [layer for layer in range(engine.num_layers) if layer >= self.resident_layers]

    def prepare(self, engine, calibration=None):
        for layer in range(self.resident_layers):
            for e in range(engine.num_experts):
                engine.prefetch((layer, e))

    def _ahead(self, layer: int, current: int) -> int:
        """How many MoE layers after ``current`` ``layer`` runs (the next step's, after the last layer)."""
        return (layer - current) % self.engine.num_layers

    def _queue(self, current: int, reserve: int) -> None:
        """Queue the streamed layers after ``current``'s experts, nearest first, into free bytes beyond
        ``reserve`` (what the running layer still has to fetch)."""
        engine, cache = self.engine, self.engine.cache
        for layer in sorted((x for x in self.streamed if x != current), key=lambda x: self._ahead(x, current)):
            for e in range(engine.num_experts):
                if cache.free_bytes - reserve < engine.expert_bytes:
                    return
                if (layer, e) not in cache:
                    engine.prefetch((layer, e), -self._ahead(layer, current))

    def before_layer(self, layer, experts, tokens_per_expert):
        engine = self.engine
        if layer >= self.resident_layers:  # the whole layer, routed or not, lands before the layer computes
            whole = [(layer, e) for e in range(engine.num_experts)]
            for key in whole:
                if key not in engine.cache and engine.prefetch(key, DEMAND_PRIORITY) is PrefetchResult.NO_ROOM:
                    engine.make_room(engine.expert_bytes, protect=set(whole), needed=key, force=True)
                    engine.prefetch(key, DEMAND_PRIORITY)
            engine.wait_for(whole)
        self._queue(layer, 0)

    def after_layer(self, layer, experts):
        if layer < self.resident_layers:
            return
        engine = self.engine
        for key in list(engine.cache.layer_keys(layer)):  # every copy of the layer landed before it computed
            engine.evict(key)
        self._queue(layer, 0)

    def choose_victim(self, candidates, needed):
        current = needed[0] if needed is not None else 0
        streamed = [k for k in candidates if k[0] >= self.resident_layers]
        if streamed:  # the copy used furthest in the future
            return max(streamed, key=lambda k: self._ahead(k[0], current))
        return candidates[0] if candidates else None

    def on_warmup_end(self):
        pass  # its one metric is a size, not a counter

    def metrics(self):
        """What a decode step streams: every expert of every streamed layer (bytes)."""
        return {"streamed_layer_bytes": len(self.streamed) * self.layer_bytes}
