"""LFU with aging: a template third-party offload strategy for specterbench.

When the engine needs room in the device cache it evicts the expert routed to least often; counts halve every
``half_life`` decode steps so that experts popular long ago can leave. Ties go to the least recently used.
"""

from collections import Counter

from specterbench import Strategy, hookimpl
from specterbench.errors import UsageError

__version__ = "0.1.0"


class AgingLFU(Strategy):
    name = "lfu"  # what `--strategies lfu` selects; unique across all installed plugins
    version = "1"  # bump whenever behaviour changes: rows record it, and comparisons check it
    description = "least frequently used expert evicted first; counts halve every half_life steps"

    @classmethod
    def option_names(cls):  # `--set lfu.half_life=8`; the base class refuses any other option
        return ("half_life",)

    def __init__(self, **options):
        super().__init__(**options)  # checks option names and keeps them in self.options
        self.half_life = int(options.get("half_life", 16))
        if self.half_life < 1:  # a named error with the fix, never `assert`
            raise UsageError(f"lfu.half_life must be a positive number of steps, got {self.half_life}")

    def attach(self, engine):
        # Once per benchmark cell, with a fresh empty cache: reset every piece of state here.
        super().attach(engine)  # sets self.engine
        self.counts = Counter()  # (moe_layer, expert) -> aged number of forward passes routed to it
        self.steps = 0

    # The hot path: the engine calls these directly, never through pluggy. Keep them cheap.
    def before_layer(self, layer, experts, tokens_per_expert):
        self.counts.update((layer, e) for e in experts)  # count passes, not tokens: a prefill counts once

    def on_step_end(self, new_tokens):
        self.steps += 1
        if self.steps % self.half_life == 0:  # aging: plain LFU never forgets a once-popular expert
            self.counts = Counter({key: n // 2 for key, n in self.counts.items() if n > 1})

    def choose_victim(self, candidates, needed):
        # `candidates` may be evicted now (not in use, not mid-copy), least recently used first; min() keeps
        # the first of equal counts, so ties go to the least recently used. Never return anything else.
        return min(candidates, key=lambda key: self.counts[key])

    def on_warmup_end(self):
        # The runner's warm-up request is over: restart the counters metrics() reports. The counts are what the
        # strategy learned, so they stay (a strategy without this method gets a warning that its metrics include
        # the warm-up).
        pass

    def metrics(self):  # added to the row's `extra`: whatever helps explain this strategy's numbers
        return {"lfu_tracked_experts": len(self.counts)}


@hookimpl
def specterbench_register_strategies(register):
    """Called once by specterbench's plugin host: hand it every strategy class this package provides."""
    register(AgingLFU)
