from specterbench.strategy import Strategy

from .options import flag, prefill_option


class LRU(Strategy):
    """Per-layer least-recently-used caches (mixtral-offloading's; provenance in docs/strategies.md).

    The cache's slots are split evenly across MoE layers (the remainder going to the first layers); a miss in a
    layer that is at its quota evicts from that layer, so no layer's experts crowd out another's. While the cache is
    filling, a layer may use free slots. Subclasses change only :meth:`pick`, the order in which a layer's experts
    are given up. Choosing a victim reads the cache's per-layer view, so it costs O(1) (O(quota) with a subclass's
    ``pick``), not O(cache).

    ``swap=true``: every miss copies the evicted expert device→host back into its store tensors, then the needed one
    host→device into the freed slot, both on the compute stream and serial with compute
    (:meth:`~specterbench.engine.engine.Engine.use_swap_copies`) — the copy path of mixtral-offloading's released
    code, which published rows of that system ran.
    """

    name = "lru"
    # 3: a prompt's misses fetched again by default, as mixtral-offloading does (prefill=priced: the engine's rule);
    # 2: the engine's per-layer prefill rule
    version = "3"
    description = "per-layer LRU expert cache (mixtral-offloading; swap=true: its released code's swap copies)"

    @classmethod
    def option_names(cls):
        return ("swap", "prefill") if cls is LRU else ()

    @classmethod
    def validate_options(cls, options: dict) -> None:
        flag(cls.name, "swap", options.get("swap", False))
        prefill_option(cls.name, options)

    def __init__(self, **options):
        super().__init__(**options)
        self.swap = flag(self.name, "swap", options.get("swap", False))
        # prefill=fetch (default): every miss of a prompt copied, as the system it stands for; priced: each layer
        # placed by the engine's prefill rule (engine.costs.prefill_policy), host computes included
        self.prefill_default = "fetch" if prefill_option(self.name, options) == "priced" else None

    def attach(self, engine):
        super().attach(engine)
        if self.swap:
            engine.use_swap_copies()
        slots = engine.cache.capacity_bytes // engine.expert_bytes
        base, extra = divmod(slots, engine.num_layers)
        self.quota = [base + (1 if layer < extra else 0) for layer in range(engine.num_layers)]
        self._plain = type(self).pick is LRU.pick

    def pick(self, keys):
        """The victim among ``keys`` (least recently used first)."""
        return keys[0]

    def _pick(self, keys):
        if self._plain:  # keys[0] without building the list
            return next(iter(keys), None)
        keys = list(keys)
        return self.pick(keys) if keys else None

    def choose_victim(self, candidates, needed):
        cache, quota = self.engine.cache, self.quota
        if needed is not None and cache.layer_count(needed[0]) >= quota[needed[0]]:
            # at quota with nothing of its own to give up yet: wait for this layer's computed experts
            return self._pick(candidates.in_layer(needed[0]))
        over = self._pick(k for k in candidates if cache.layer_count(k[0]) > quota[k[0]])
        return over if over is not None else self._pick(candidates)
