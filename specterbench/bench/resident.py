"""The reference every lossless strategy must reproduce: all experts resident (or streamed through a cache the
device can hold), its tokens, routing trace and top-2 margins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specterbench.plugins.registry import warn
from specterbench.strategy import Strategy

if TYPE_CHECKING:  # pragma: no cover
    from specterbench.engine.engine import Engine


@dataclass(slots=True)
class Reference:
    tokens: dict[str, tuple[int, ...]]
    traces: dict[str, tuple]
    #: per prompt, {absolute position: top-2 score gap of the reference token there} (near-ties: numerics)
    margins: dict[str, dict[int, float]] = field(default_factory=dict)
    #: the warm-up request's (id, prompt ids): a calibration prompt, never a measured one (its tokens and trace are
    #: in ``tokens``/``traces`` under that id, for strategies that read the reference)
    warmup: tuple[str, tuple[int, ...]] | None = None


class ReferenceStrategy(Strategy):
    """All experts resident: the reference tokens and routing trace every lossless strategy must reproduce."""

    name = "reference"

    def min_cache_bytes(self, engine):
        return engine.total_expert_bytes

    def prepare(self, engine, calibration=None):
        for layer in range(engine.num_layers):
            for e in range(engine.num_experts):
                engine.prefetch((layer, e))


class StreamingReference(ReferenceStrategy):
    """The reference on a device that must not hold every expert: a cache of ``budget_bytes`` (no more than the
    run's cells hold), least recently used out; while a layer runs, the next layer's router applied one layer early
    says which experts to copy next, so streamed copies overlap compute (the engine is lossless, so the tokens and
    routing are the resident run's whatever is prefetched)."""

    def min_cache_bytes(self, engine):
        return engine.min_budget_bytes()

    def prepare(self, engine, calibration=None):
        pass

    def before_layer(self, layer, experts, tokens_per_expert):
        engine = self.engine
        now = {(layer, e) for e in experts}
        for key in now:  # this layer's misses first, then the next layer's guess into what room is left
            if key not in engine.cache and engine.make_room(engine.expert_bytes, protect=now, needed=key):
                engine.prefetch(key, priority=1.0)
        if layer + 1 < engine.num_layers:
            for e in engine.router_guess(layer + 1).experts():
                key = (layer + 1, e)
                if key not in engine.cache and engine.make_room(engine.expert_bytes, protect=now, needed=key):
                    engine.prefetch(key, priority=0.0)


def reference_strategy(engine: Engine, budget_bytes: int | None = None) -> tuple[Strategy, int]:
    """The reference pass's strategy and budget: streamed through a cache of ``budget_bytes`` (the run's largest
    cell budget, which the device-memory check found room for; at least two layers' top-k so that the next layer's
    copies overlap this one's compute), so that no pass holds more than a cell — on a CPU too, where the device is
    host memory. Everything resident when that budget is all expert bytes, or on a CPU without one."""
    total = engine.total_expert_bytes
    if budget_bytes is None and engine.device.type != "cuda":
        return ReferenceStrategy(), total
    floor = 2 * engine.min_budget_bytes()
    nbytes = max(floor, min(budget_bytes or floor, total))
    if nbytes >= total:
        return ReferenceStrategy(), total
    return StreamingReference(), nbytes


#: the warm-up prompt when every calibration prompt is a measured one too (Sonnet 18 is public domain)
WARMUP_TEXT = ("Sometime too hot the eye of heaven shines, and often is his gold complexion dimm'd; and every fair "
               "from fair sometime declines, by chance or nature's changing course untrimm'd.")


_WARNED_WARMUP: set[type] = set()


def warns_warmup_metrics(cls: type, plugin: str) -> bool:
    """True (and one warning per class and process) when ``cls`` reports :meth:`Strategy.metrics` but has no
    :meth:`Strategy.on_warmup_end` to restart them: its metrics then include the warm-up request."""
    if cls.metrics is Strategy.metrics or cls.on_warmup_end is not Strategy.on_warmup_end:
        return False
    if cls not in _WARNED_WARMUP:
        _WARNED_WARMUP.add(cls)
        warn(f"strategy {cls.name!r} (plugin {plugin!r}) reports metrics() but has no on_warmup_end(): its metrics "
             f"include the warm-up request; restart its counters in on_warmup_end (or run with --no-warmup)")
    return True
