"""The engine: one offloaded MoE forward pass and everything it is made of.

engine.py (Engine: the decode loop and the per-layer expert path), cache.py (the byte-budgeted device
cache), seam.py (the transformers seam: host expert store, stand-in experts module), clocks.py (the clock
interface and its modeled, CUDA and host implementations), geometry.py and profiles.py (what a modeled
clock prices: real-model sizes and hardware figures), draft.py (the quantized self-draft), models.py
(embedded models and real checkpoints by name), sampling.py (greedy and Gumbel-max coupled sampling).
"""

from __future__ import annotations


def __getattr__(name):  # the pre-layout module's names (`from specterbench.engine import ...`) keep working
    import importlib
    import pkgutil

    if name.startswith("__") or name in {m.name for m in pkgutil.iter_modules(__path__)}:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module("specterbench.engine.engine")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
