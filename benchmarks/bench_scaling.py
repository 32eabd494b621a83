"""Host time per decode token at real routing geometries (see ``scaling.py``): lru, specter, oracle and
activation-aware on random-init models with the experts × layers × top-k of Mixtral, DeepSeek-V2-Lite,
Qwen3-30B-A3B and DeepSeek-V3. Each round decodes one request on the modeled clock; ``extra_info`` keeps the
median over the rounds of the mean host CPU ms per decode token (prefill excluded) and the stock model's for
comparison."""

from __future__ import annotations

import pytest
import torch
from scaling import GEOMETRIES, STRATEGIES, World, stock_ms_per_token

_WORLDS: dict = {}


def _world(geometry: str) -> World:
    if geometry not in _WORLDS:
        torch.set_num_threads(1)
        _WORLDS.clear()  # one geometry's engine in memory at a time
        _WORLDS[geometry] = World.build(geometry)
    return _WORLDS[geometry]


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_host_time_per_decode_token(benchmark, geometry, name):
    w = _world(geometry)
    strategy = w.strategy(name)
    w.host_ms_per_token(strategy)  # warm-up
    samples = []

    def decode():
        ms, tokens = w.host_ms_per_token(strategy)
        samples.append(ms)
        return tokens

    tokens = benchmark.pedantic(decode, rounds=3, iterations=1)
    if strategy.lossless:
        assert tuple(tokens) == w.reference_tokens
    benchmark.extra_info.update(geometry=geometry, strategy=name, host_cpu_ms_per_token=sorted(samples)[1],
                                stock_cpu_ms_per_token=stock_ms_per_token(geometry).mean_ms if name == "lru" else None)
