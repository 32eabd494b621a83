"""What many tests of the engine, the contract and the baselines build the same way: a tiny random model's engine, a
modeled clock for it, a cell configured at some slots of budget, and one MoE layer run with hand-picked routing."""

import torch
import torch.nn.functional as F

from specterbench.catalog.tiny import tiny_random
from specterbench.engine.engine import Engine
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile


def tiny_engine(family: str = "mixtral") -> Engine:
    """The tiny random model of ``family`` in an engine (mixtral: 2 MoE layers, 8 experts, top-2)."""
    model, tok = tiny_random(family)
    return Engine(model, name=f"tiny-random-{family}", tokenizer=tok)


def modeled_clock(engine: Engine, host: bool = False) -> ModeledClock:
    """The default profile's modeled clock at the engine's geometry (``host``: with the default host profile, so
    host-executing strategies can price their host path)."""
    return ModeledClock(default_profile(), engine.geometry, default_host_profile() if host else None)


def configure(engine: Engine, strategy, slots: int = 4, host: bool = False) -> ModeledClock:
    """A cell of ``slots`` experts' bytes for ``strategy`` on a fresh modeled clock; the clock."""
    clock = modeled_clock(engine, host)
    engine.configure(strategy, slots * engine.expert_bytes, clock)
    return clock


def route(engine: Engine, layer: int, tokens, hidden: int | None = None):
    """Run MoE ``layer`` with hand-picked routing: ``tokens`` lists each token's experts, weighted equally."""
    idx = torch.tensor(tokens)  # [T, k]
    states = torch.randn(len(tokens), hidden or engine.own_geometry.hidden)  # [T, H]
    return engine.run_moe_layer(layer, F.silu, states, idx, torch.full(idx.shape, 1.0 / idx.shape[1]))


def bf16_kernels(mem_bytes_per_s: float, flops_per_s: float) -> dict:
    """A host profile's ``expert_kernels`` with one bf16 kernel at these rates (a test host's only precision)."""
    return {"avx512": {"bf16": {"flops_per_s": flops_per_s, "bytes_per_s": mem_bytes_per_s, "source": "test"}}}
