"""A next-layer router predictor that prefetches only what will land in time.

While MoE layer L runs, layer L+1's router is applied to L's input (``engine.router_guess``): hidden states change
little from one layer to the next, so on a trained model it guesses most of L+1's experts. The guessed experts
are ranked by router probability and copied while L computes — but only those whose copy
(``engine.costs.copy_arrival_s``, the link's backlog included) lands before L+1 needs them
(``engine.costs.until_layer_s``). A copy that would land late only delays the demand fetches queued behind it.
A walk-through is in docs/plugins.md ("A router predictor that prefetches in time").
"""

from specterbench import Strategy, hookimpl
from specterbench.errors import UsageError

__version__ = "0.1.0"


class RouterPrefetch(Strategy):
    name = "router-prefetch"
    version = "1"
    description = "next layer's router applied early; prefetch its likeliest experts that land before it runs"

    @classmethod
    def option_names(cls):
        return ("slack",)

    def __init__(self, **options):
        super().__init__(**options)
        self.slack = float(options.get("slack", 1.0))  # > 1: also copies that land a little late
        if not self.slack > 0:
            raise UsageError(f"router-prefetch.slack must be a positive factor, got {self.slack}")

    def attach(self, engine):
        super().attach(engine)
        self.issued = self.skipped_late = 0

    def on_warmup_end(self):  # metrics count measured requests only
        self.issued = self.skipped_late = 0

    def before_layer(self, layer, experts, tokens_per_expert):
        engine, costs = self.engine, self.engine.costs
        nxt = layer + 1
        if nxt >= engine.num_layers:
            return
        guess = engine.router_guess(nxt)  # logits [T, E] of layer L+1's router on layer L's input
        mass = guess.logits.float().softmax(-1).sum(0)  # [E]: expected tokens per expert
        wanted = mass.topk(min(engine.num_experts, engine.top_k * guess.logits.shape[0])).indices.tolist()
        deadline = costs.until_layer_s(nxt) * self.slack  # seconds until L+1 needs its experts
        protect = {(layer, e) for e in experts} | {(nxt, e) for e in wanted}
        priority = -nxt  # earlier layers first; demand fetches always outrank prefetches
        for e in wanted:  # likeliest first
            key = (nxt, e)
            if key in engine.cache:
                continue
            if costs.copy_arrival_s(priority) > deadline:
                self.skipped_late += 1
                break  # every later copy would queue behind this one: it would land later still
            if not engine.make_room(engine.expert_bytes, protect=protect, needed=key):
                break  # nothing left that may go
            if engine.prefetch(key, priority):  # a PrefetchResult: truthy when a copy was queued
                self.issued += 1

    def metrics(self):
        return {"router_prefetch_issued": self.issued, "router_prefetch_skipped_late": self.skipped_late}


@hookimpl
def specterbench_register_strategies(register):
    register(RouterPrefetch)
