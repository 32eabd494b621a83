"""The engine: one offloaded MoE forward pass and everything it is made of.

engine.py (Engine: the decode loop and the MoE seam's entry), moe_layer.py (one MoE layer in its phases, its
device experts as one grouped op), residency.py (what strategies may do to the cache: prefetch, cancel, evict, make
room), cache.py (the byte-budgeted device cache and its per-layer view), pool.py (the cache's expert slots on the
device and the (layer, expert) → slot table), routing.py (the host's one read of a layer's routing, router
signals), kernels.py (what the engine launches: the kernel description the cost model prices, and its counter),
fused.py (fused RMSNorms swapped into the model), seam.py / store.py (the transformers seam: stand-in experts module, host expert store), clocks.py (the
Clock protocol and the modeled clock; host_clock.py and cuda_clock.py the measured ones), scheduler.py (the one
copy scheduler every clock uses), costs.py (the one cost model and ``engine.costs``), geometry.py and
profiles.py (what a modeled clock prices), draft.py (the quantized self-draft), models.py (embedded models and
real checkpoints by name), sampling.py (greedy and Gumbel-max coupled sampling, on the
logits' device).
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
