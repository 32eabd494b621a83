from specterbench.errors import UsageError
from specterbench.strategy import ON_HOST

from .options import flag
from .static import StaticPlacement

RULES = ("balanced", "fiddler")


class CpuExperts(StaticPlacement):
    """Fiddler / llama.cpp ``--n-cpu-moe`` / KTransformers (provenance in docs/strategies.md): the calibration set's
    most popular experts stay on the device; an expert that is not there runs on the host CPU, where its weights
    already are, and only the activations cross the link — at decode sizes fewer bytes than the expert's weights.
    Per expert and forward a latency rule picks host or fetch, priced by the cost model (``engine.costs``); host time
    grows with the tokens the expert serves (a prefill, a K-token verification), a fetch does not.

    - ``rule=balanced`` (default): both sides queue-aware — the host's own backlog plus the expert on the host,
      against the copy behind the demand copies ahead of it plus the device compute;
    - ``rule=fiddler`` (Fiddler's rule): an idle host against the copy behind everything the link carries.

    ``torch_bf16=true``: price the host's experts as eager PyTorch computes a bf16 expert on a CPU (Fiddler's
    released code does), at the host profile's ``torch_bf16_bytes_per_s`` where that is below the DRAM share
    (:meth:`~specterbench.engine.engine.Engine.use_torch_bf16_host`). Decisions read the same price. A host profile
    without that field refuses in one line.
    """

    name = "cpu-experts"
    version = "2"
    description = ("Fiddler: pinned popular experts on device; each other expert on the host CPU or fetched, "
                   "whichever is sooner")

    @classmethod
    def option_names(cls):
        return ("threads", "rule", "torch_bf16")

    @classmethod
    def validate_options(cls, options: dict) -> None:
        if str(options.get("rule", "balanced")) not in RULES:
            raise UsageError(f"cpu-experts option rule={options.get('rule')!r} is invalid: use one of "
                             f"{', '.join(RULES)}")
        try:
            threads = int(options.get("threads", 1))
        except (TypeError, ValueError):
            threads = 0
        if threads < 1:
            raise UsageError(f"cpu-experts option threads={options.get('threads')!r} is invalid: use a positive "
                             f"integer")
        flag(cls.name, "torch_bf16", options.get("torch_bf16", False))

    @classmethod
    def check_host_profile(cls, host_profile, options: dict) -> None:
        if flag(cls.name, "torch_bf16", options.get("torch_bf16", False)):
            host_profile.torch_bf16_rate()

    def __init__(self, **options):
        super().__init__(**options)
        self.validate_options(options)
        self.rule = str(options.get("rule", "balanced"))
        self.torch_bf16 = flag(self.name, "torch_bf16", options.get("torch_bf16", False))

    def attach(self, engine):
        super().attach(engine)
        if self.torch_bf16:
            engine.use_torch_bf16_host()
        available = engine.clock.host_threads_available
        wanted = int(self.options.get("threads", available))
        self.warning = None
        if wanted > available:
            self.warning = f"threads={wanted} clamped to the {available} the host has"
            wanted = available
        self.threads = wanted
        engine.host_threads = wanted
        self.host_calls = self.fetch_calls = 0

    def place_miss(self, key, n_tokens):
        if self.engine.clock.costs.host is None:
            place = ON_HOST  # measured without a host profile: the host really computes; always use it
        elif self.rule == "balanced":
            place = self.engine.costs.host_or_fetch(n_tokens).place
        else:  # Fiddler's: an idle host against the copy behind everything the link carries
            place = self.engine.costs.host_or_fetch(n_tokens, host_queue_s=0.0, priority=None).place
        if place == ON_HOST:
            self.host_calls += 1
        else:
            self.fetch_calls += 1
        return place

    def on_warmup_end(self):
        self.host_calls = self.fetch_calls = 0

    def metrics(self):
        m = {"host_threads": self.threads, "host_rule": self.rule, "host_calls": self.host_calls,
             "fetch_calls": self.fetch_calls}
        if self.torch_bf16:
            m["host_torch_bf16"] = True
        if self.warning:
            m["warning"] = self.warning
        return m
