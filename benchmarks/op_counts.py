"""Kernel-launching ops per decode token at real routing geometries, counted (docs/clock.md, Ops per token).

Random-init models at the routing geometry of Mixtral, Qwen1.5-MoE and DeepSeek-V2-Lite (hidden 64) run through
the engine on the modeled clock; a :class:`~specterbench.engine.kernels.LaunchCounter` counts every kernel-launching
aten op of a decode step (forward and sampling), with every expert resident and with lru at 50% of expert bytes,
and per token Specter emits (K = 4). ``python benchmarks/op_counts.py [geometry ...]`` prints the table.
"""

from __future__ import annotations

import statistics
import sys

import torch

PROMPT = tuple(range(3, 19))
STEPS = 6


def build(geometry: str):
    from specterbench.catalog.tiny import routing_geometry_random
    from specterbench.engine.engine import Engine

    return Engine(routing_geometry_random(geometry), name=f"random-{geometry}")


def configure(engine, strategy, budget_bytes: int) -> None:
    from specterbench.engine.modeled_clock import ModeledClock
    from specterbench.engine.profiles import default_host_profile, default_profile

    engine.configure(strategy, budget_bytes, ModeledClock(default_profile(), engine.geometry,
                                                          default_host_profile()))


def resident(engine):
    from specterbench import Strategy

    class Resident(Strategy):
        name = "resident-all"
        version = "1"

        def min_cache_bytes(self, engine):
            return engine.total_expert_bytes

        def prepare(self, engine, calibration=None):
            for key in engine.store.weights:
                engine.prefetch(key)

    strategy = Resident()
    configure(engine, strategy, engine.total_expert_bytes)
    strategy.prepare(engine)
    return strategy


def ops_per_decode_token(engine, steps: int = STEPS) -> float:
    """Median ops of one decode step (target forward + sampling) after a prefill."""
    from specterbench.engine.kernels import LaunchCounter
    from specterbench.engine.sampling import DecodeSetting

    sampler = DecodeSetting.sample(temperature=1.0).sampler("p0")
    kv = engine.new_kv_cache()
    logits = engine.forward(torch.tensor([PROMPT]), kv)
    token, counts = sampler.pick(logits[-1], len(PROMPT)), []
    for i in range(steps):
        with LaunchCounter() as c:
            logits = engine.forward(torch.tensor([[token]]), kv)
            token = sampler.pick(logits[-1], len(PROMPT) + 1 + i)
        counts.append(c.total)
    return statistics.median(counts)


def ops_per_specter_token(engine, k: int = 4) -> float:
    """Ops per token Specter emits (draft steps, verification, sampling), one request of 16 tokens."""
    from specterbench.engine.kernels import LaunchCounter
    from specterbench.plugins.host import get_host
    from specterbench.strategy import Request

    strategy = get_host().strategies().get("specter")(k=k, bits=3)  # the int3 draft, dequantized together (no kernel)
    configure(engine, strategy, engine.total_expert_bytes // 2)
    strategy.prepare(engine, None)
    request = Request("p0", PROMPT, 16)
    engine.begin_request(request)
    with LaunchCounter() as c:
        tokens = strategy.generate(engine, request)
    return c.total / len(tokens)


def row(geometry: str) -> list[str]:
    from specterbench.baselines import LRU

    engine = build(geometry)
    resident(engine)
    all_resident = ops_per_decode_token(engine)
    configure(engine, LRU(), engine.total_expert_bytes // 2)
    lru = ops_per_decode_token(engine)
    specter = ops_per_specter_token(engine)
    return [f"{all_resident:.0f}", f"{lru:.0f} ({lru / all_resident - 1:+.0%})", f"{specter:.0f}"]


def main(argv: list[str]) -> int:
    from specterbench.catalog.tiny import ROUTING_GEOMETRIES

    torch.set_num_threads(1)
    print("kernel-launching ops per decode token (random-init, hidden 64; forward + sampling; counted)")
    print("| geometry (experts × MoE layers, top-k) | all resident | lru 50% | specter per emitted token (K=4) |")
    print("|---|---|---|---|")
    for geometry in argv or list(ROUTING_GEOMETRIES):
        e, layers, k, _ = ROUTING_GEOMETRIES[geometry]
        print(f"| {geometry} ({e} × {layers}, top-{k}) | " + " | ".join(row(geometry)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
