"""Device memory is checked before the long passes, and the reference pass streams with copies that overlap compute.

The check itself is arithmetic on the free bytes CUDA reports; here the free bytes are given, so it runs on a CPU."""

import pytest

from specterbench.bench.checks import check_device_memory, kv_activation_bytes
from specterbench.catalog.tiny import tiny_random
from specterbench.engine.engine import Engine
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.errors import BudgetError
from specterbench.strategy import Request


def _engine(family="mixtral"):
    model, tok = tiny_random(family)
    return Engine(model, name=family, tokenizer=tok), tok


def test_budgets_that_fit_pass_the_device_memory_check():
    engine, _ = _engine()
    total = engine.total_expert_bytes
    extra = kv_activation_bytes(engine, 64, 32)
    check_device_memory(engine, [("35%", int(0.35 * total)), ("100%", total)], 64, 32, total + extra)


def test_a_budget_larger_than_free_device_memory_is_one_line_naming_the_largest_that_fits():
    engine, _ = _engine()
    total = engine.total_expert_bytes
    extra = kv_activation_bytes(engine, 64, 32)
    free = extra + int(0.605 * total)
    with pytest.raises(BudgetError) as err:
        check_device_memory(engine, [("35%", int(0.35 * total)), ("100%", total)], 64, 32, free)
    text = str(err.value)
    assert "\n" not in text and "budget 100%" in text and "the largest budget that fits is 60.5%" in text
    assert "use --budgets 60% or less" in text


def test_the_kv_estimate_grows_with_the_request():
    engine, _ = _engine()
    assert kv_activation_bytes(engine, 512, 256) > kv_activation_bytes(engine, 16, 16)


def _decode(engine, strategy, budget, prompt, tokens=10):
    engine.configure(strategy, budget, ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    request = Request("p", tuple(prompt), tokens)
    engine.begin_request(request)
    out = engine.decode(request)
    engine.clock.settle()
    return out, engine.clock.totals.stall_s, engine.stats


def test_the_streaming_reference_prefetches_the_next_layer_and_keeps_the_tokens():
    from specterbench.baselines import OnDemand
    from specterbench.bench.resident import ReferenceStrategy, StreamingReference

    engine, tok = _engine()
    prompt = tok.encode("Shall I compare thee to a summer's day?")
    want, _, _ = _decode(engine, ReferenceStrategy(), engine.total_expert_bytes, prompt)
    budget = 2 * engine.min_budget_bytes()
    got, stall, stats = _decode(engine, StreamingReference(), budget, prompt)
    _, plain_stall, _ = _decode(engine, OnDemand(), budget, prompt)
    assert got == want
    assert stats.prefetch_issued > 0 and stats.prefetch_used > 0
    assert stall < plain_stall  # copies of the next layer overlap this layer's compute
