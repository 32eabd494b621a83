from specterbench import Strategy


class OnDemand(Strategy):
    """Fetch every routed expert when its layer runs and keep nothing once the layer is done."""

    name = "on-demand"
    version = "1"
    description = "fetch each needed expert on demand, keep nothing"

    def after_layer(self, layer, experts):
        engine = self.engine
        for key in engine.evictable():
            engine.evict(key)
