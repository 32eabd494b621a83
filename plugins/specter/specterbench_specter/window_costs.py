"""The cost model's prices a window forecast reads (:class:`WindowCosts`): the draft step, the verification, a plain
step's missed expert on the host or the link, at the present context, for one request or a batch."""

from __future__ import annotations


class WindowCosts:
    """The cost model's prices for one forecast (``engine.costs`` at the present context), per window part."""

    def __init__(self, engine, draft, remaining: int, host: bool, dense_ratio: float = 1.0, dense_kernel=None):
        self.engine, self.draft, self.remaining, self.host = engine, draft, remaining, host  # draft: QuantizedExperts
        self.dense_ratio = dense_ratio  # the draft's dense weights over 16-bit (1.0: it reads the target's)
        self.dense_kernel = dense_kernel  # their low-bit kernel (None: by ratio)
        self.costs = engine.costs
        g = engine.geometry
        self.dense_layers = g.layers - g.moe_layers

    def copy_s(self) -> float:
        return self.costs.copy_s()

    def draft_step_s(self, requests: int = 1, union: float | None = None) -> float:
        """One draft forward over one token of each of ``requests``, its low-bit experts the ``union`` of theirs
        per layer (default: top-k, one request's), each over its share of the routings, as charged."""
        c, e = self.costs, self.engine
        d, dk, b = self.dense_ratio, self.dense_kernel, requests
        m = max(1, round(union or e.top_k))
        per_expert = max(1, round(b * e.top_k / m))
        layer = c.layer_s(b, bytes_ratio=d, kernel=dk, requests=b) + self.draft.fused_s([per_expert] * m)
        return (self.dense_layers * c.layer_s(b, moe=False, bytes_ratio=d, kernel=dk, requests=b)
                + e.num_layers * layer + c.head_s(b, d, dk))

    def verify_s(self, n_tokens: int, union: float, requests: int = 1) -> float:
        """One verification over ``n_tokens`` positions (of ``requests`` requests, each attending to its own KV)
        with ``union`` experts per MoE layer in one grouped op."""
        c, e = self.costs, self.engine
        per_expert = max(1, round(n_tokens * e.top_k / max(union, 1.0)))
        layer = c.layer_s(n_tokens, requests=requests) + c.experts_grouped_s([per_expert] * max(1, round(union)))
        return (self.dense_layers * c.layer_s(n_tokens, moe=False, requests=requests) + e.num_layers * layer
                + c.head_s(n_tokens))

    def host_miss_s(self, n_tokens: int = 1) -> float:
        """One missed expert of a plain step on the host over ``n_tokens``, the link idle as it mostly is in plain
        decoding (inf without a host path)."""
        if not self.host:
            return float("inf")
        return self.costs.model.host_expert_seconds(n_tokens, self.engine.host_threads)

    def device_expert_s(self, n_tokens: int = 1) -> float:
        """One cached expert computed on the device for ``n_tokens``."""
        return self.costs.expert_in_layer_s(n_tokens)

    def fetch_miss_s(self, n_tokens: int = 1) -> float:
        """One missed expert of a plain step fetched and computed on the device over ``n_tokens``."""
        return self.costs.copy_s() + self.costs.expert_in_layer_s(n_tokens)

    def prior_miss_s(self) -> float:
        copy = self.costs.copy_s()
        return min(copy, self.costs.host_expert_s(1)) if self.host else copy
