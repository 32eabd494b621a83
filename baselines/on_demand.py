from specterbench.strategy import Strategy

from .options import flag


def _flag(value) -> bool:
    return flag("on-demand", "pageable", value)


class OnDemand(Strategy):
    """Fetch every routed expert when its layer runs and keep nothing once the layer is done.

    ``pageable=true``: copy the way HF Transformers / accelerate offloading does — each expert from pageable
    (unpinned) host memory, synchronously on the compute stream (``tensor.to(device)``), priced at the profile's
    ``pageable_link_bytes_per_s`` — instead of queued copies from pinned memory on the copy stream.
    """

    name = "on-demand"
    version = "1"
    description = "fetch each needed expert on demand, keep nothing (pageable=true: accelerate's synchronous copies)"

    @classmethod
    def option_names(cls):
        return ("pageable",)

    @classmethod
    def validate_options(cls, options: dict) -> None:
        _flag(options.get("pageable", False))

    @classmethod
    def check_profile(cls, profile, options: dict) -> None:
        if _flag(options.get("pageable", False)):
            profile.pageable_bytes_per_s()

    def __init__(self, **options):
        super().__init__(**options)
        self.pageable = _flag(options.get("pageable", False))

    def attach(self, engine):
        super().attach(engine)
        if self.pageable:
            engine.use_pageable_copies()

    def after_layer(self, layer, experts):
        engine = self.engine
        for key in engine.evictable():
            engine.evict(key)
