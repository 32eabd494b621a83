import os

from specterbench.plugins.strategy import FETCH, ON_HOST

from .static import StaticPlacement


class CpuExperts(StaticPlacement):
    """Fiddler / llama.cpp ``--n-cpu-moe`` / KTransformers: the calibration set's most popular experts stay on
    the device; an expert that is not there runs on the host CPU, where its weights already are, and only the
    activations cross the link. Per expert and forward, Fiddler's latency model picks host or fetch: host time
    grows with the tokens the expert serves (a prefill, a K-token verification), a fetch does not.
    """

    name = "cpu-experts"
    version = "1"
    description = "Fiddler/llama.cpp: pinned popular experts on device; others computed on the host CPU"

    @classmethod
    def option_names(cls):
        return ("threads",)

    def attach(self, engine):
        super().attach(engine)
        clock = engine.clock
        host = getattr(clock, "host", None)
        available = host.threads if host is not None else (os.cpu_count() or 1)
        wanted = int(self.options.get("threads", available))
        self.warning = None
        if wanted > available:
            self.warning = f"threads={wanted} clamped to the {available} the host has"
            wanted = available
        self.threads = wanted
        if host is not None:
            clock.host_threads = wanted
        self.host_calls = self.fetch_calls = 0

    def host_seconds(self, n_tokens):
        """Modeled time for the host to serve ``n_tokens`` (activations down and back included)."""
        engine, clock = self.engine, self.engine.clock
        g, h, p = engine.geometry, clock.host, clock.profile
        act = 2 * n_tokens * g.hidden * g.dtype_bytes
        hop = 2 * (p.link_latency_us * 1e-6 + act / p.link_bytes_per_s)
        flops = g.layer_scale * 2 * n_tokens * g.expert_params
        weights = g.layer_scale * g.expert_bytes
        return hop + h.launch_us * 1e-6 + max(flops / (h.flops_per_s * self.threads / h.threads),
                                              weights / h.mem_bytes_per_s)

    def fetch_seconds(self, n_tokens):
        """Modeled time to copy the expert in behind what the link already carries, then compute it."""
        engine, clock = self.engine, self.engine.clock
        g = engine.geometry
        backlog = max(0.0, clock.link_free_s - clock.now_s) + sum(
            clock.transfer_seconds(t.nbytes) for t in clock.queued)
        copy = clock.transfer_seconds(int(g.layer_scale * g.expert_bytes))
        compute = clock.op_seconds(g.layer_scale * 2 * n_tokens * g.expert_params, g.layer_scale * g.expert_bytes)
        return backlog + copy + compute

    def place_miss(self, key, n_tokens):
        if getattr(self.engine.clock, "host", None) is None:
            place = ON_HOST  # measured: the host really computes; without a latency model, always use it
        else:
            place = ON_HOST if self.host_seconds(n_tokens) <= self.fetch_seconds(n_tokens) else FETCH
        if place == ON_HOST:
            self.host_calls += 1
        else:
            self.fetch_calls += 1
        return place

    def metrics(self):
        m = {"host_threads": self.threads, "host_calls": self.host_calls, "fetch_calls": self.fetch_calls}
        if self.warning:
            m["warning"] = self.warning
        return m
