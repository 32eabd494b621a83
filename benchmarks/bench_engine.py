"""One decode step through the offloaded engine, per strategy; one short request for every strategy."""

from __future__ import annotations

import pytest
import torch

from specterbench import Strategy
from specterbench.plugins.host import get_host

STRATEGIES = get_host().strategies().names()


def _greedy(name: str) -> bool:
    return get_host().strategies().get(name).generate is Strategy.generate


@pytest.mark.parametrize("name", [s for s in STRATEGIES if _greedy(s)])
def test_decode_step(benchmark, world, name):
    """The first decode token after the prefill: router → cache → clock → expert compute, every MoE layer."""
    engine, strategy, request = world.engine, world.strategy(name), world.request()

    sampler, position = request.sampler(), len(request.prompt_ids)  # tokens chosen as the reference chose them

    def setup():  # a fresh request and its prefill, not timed
        engine.begin_request(request)
        kv = engine.new_kv_cache()
        token = sampler.pick(engine.forward(torch.tensor([request.prompt_ids]), kv)[-1], position)
        engine.emit(1)
        strategy.on_step_end([token])
        return (token, kv), {}

    def step(token, kv):
        nxt = sampler.pick(engine.forward(torch.tensor([[token]]), kv)[-1], position + 1)
        engine.emit(1)
        strategy.on_step_end([nxt])
        return nxt

    nxt = benchmark.pedantic(step, setup=setup, rounds=40, warmup_rounds=5)
    if strategy.lossless:
        assert nxt == request.reference_tokens[1]  # the step decoded the reference's token
    benchmark.extra_info.update(strategy=name, model=engine.name, clock="host wall (harness overhead)")


@pytest.mark.parametrize("name", STRATEGIES)
def test_request(benchmark, world, name):
    """Prefill plus a few new tokens through ``strategy.generate`` (speculative strategies: draft + verify)."""
    engine, strategy, request = world.engine, world.strategy(name), world.request()
    tokens = benchmark.pedantic(strategy.generate, args=(engine, request), setup=lambda: engine.begin_request(request),
                                rounds=8, warmup_rounds=1)
    if strategy.lossless:
        assert tuple(tokens) == request.reference_tokens
    benchmark.extra_info.update(strategy=name, model=engine.name, new_tokens=request.max_new_tokens)
