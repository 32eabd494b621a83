"""The per-layer prefill policy: the MoE-aware rule follows its formula, each policy runs what it is priced at
(STREAM copies through free bytes and drops them, HOST computes every miss on the host), tokens stay the
reference's, and only a request's first forward is placed by it."""

import pytest
import torch

from specterbench.catalog.tiny import tiny_random
from specterbench.engine.batch import begin_batch, decode_batch
from specterbench.engine.engine import Engine
from specterbench.engine.geometry import project
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.prefill import layer_policy
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.errors import EngineViolation
from specterbench.strategy import DEVICE, HOST, STREAM, Request, Strategy

PROMPT = tuple(range(3, 43))


class Fixed(Strategy):
    """Every prefill layer under one policy; the layers' policies and the forwards they were asked in recorded."""

    name = "fixed-prefill"
    version = "1"

    def __init__(self, policy, **options):
        super().__init__(**options)
        self.policy, self.asked = policy, []

    def prefill_layer(self, layer, experts, tokens_per_expert):
        self.asked.append(self.engine.forward_tokens)
        return self.policy


class Resident(Strategy):
    name = "resident-prefill"
    version = "1"

    def min_cache_bytes(self, engine):
        return engine.total_expert_bytes


@pytest.fixture(scope="module")
def engine():
    model, _ = tiny_random("mixtral")
    return Engine(model, name="tiny-random-mixtral")


def decode(engine, strategy, budget):
    engine.configure(strategy, budget, ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    if isinstance(strategy, Resident):
        for key in engine.store.weights:
            engine.prefetch(key)
    request = Request("r", PROMPT, 4)
    engine.begin_request(request)
    return engine.decode(request)


def test_stream_copies_through_free_bytes_and_drops_them_host_computes_every_miss(engine):
    reference = decode(engine, Resident(), engine.total_expert_bytes)
    budget = engine.total_expert_bytes // 2
    stream = Fixed(STREAM)
    assert decode(engine, stream, budget) == reference
    streamed = engine.stats.streamed_experts
    assert streamed > 0 and engine.stats.host_experts < streamed
    assert set(stream.asked) == {len(PROMPT)}  # asked in the prefill only, never while decoding
    host = Fixed(HOST)
    assert decode(engine, host, budget) == reference
    assert engine.stats.streamed_experts == 0 and engine.stats.host_experts > 0
    assert engine.stats.prefetch_issued == 0 or engine.stats.demand_bytes > 0  # decode's misses still fetch


def test_a_batch_is_placed_by_the_policy_in_its_prefill_only(engine):
    """Batched decoding forwards B tokens a step: only the batch's first forward (the prompts) is a prefill."""
    strategy = Fixed(HOST)
    engine.configure(strategy, engine.total_expert_bytes // 2,
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    requests = [Request(f"r{i}", PROMPT, 4) for i in range(2)]
    begin_batch(engine, requests)
    decode_batch(engine, requests)
    assert set(strategy.asked) == {2 * len(PROMPT)}  # never asked for a decode step's 2 tokens
    assert engine.stats.host_experts > 0 and engine.stats.demand_bytes > 0  # decode's misses fetch (place_miss)


def test_stream_leaves_no_staged_expert_in_the_cache_after_the_layer(engine):
    strategy = Fixed(STREAM)
    engine.configure(strategy, engine.total_expert_bytes // 2,
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    request = Request("r", PROMPT, 1)
    engine.begin_request(request)
    engine.forward(torch.tensor([PROMPT]), engine.new_kv_cache())
    assert engine.stats.streamed_experts > 0
    assert len(engine.cache.keys()) == 0  # every staged copy dropped: the warmed cache is all that stays
    assert engine.streamed == [] and engine.prefilling is False


def test_an_unknown_policy_is_refused_in_one_line(engine):
    with pytest.raises(EngineViolation, match="prefill policy 'gpu'"):
        decode(engine, Fixed("gpu"), engine.total_expert_bytes // 2)


def test_the_rule_is_host_for_few_tokens_per_expert_and_a_copy_for_many():
    model, _ = tiny_random("mixtral")
    engine = Engine(model, name="tiny-random-mixtral")
    engine.geometry = project(engine.own_geometry, "mixtral")  # priced at Mixtral's sizes
    engine.configure(Fixed(DEVICE), engine.total_expert_bytes // 2,
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    costs, E = engine.costs, engine.num_experts
    few, many = layer_policy(engine, 0, range(E), [1] * E), layer_policy(engine, 0, range(E), [100_000] * E)
    assert few.host_s == pytest.approx(costs.host_backlog_s() + E * costs.host_expert_s(1))
    assert few.stream_s == pytest.approx(costs.link_backlog_s() + E * costs.copy_s()
                                         + costs.experts_grouped_s([1] * E))
    assert few.policy == HOST and few.host_s <= few.stream_s
    assert many.policy in (STREAM, DEVICE) and many.host_s > many.stream_s
    assert many.policy == (STREAM if many.staging_room else DEVICE)
    assert costs.prefill_policy(0, range(E), [1] * E) == few  # the estimate a strategy reads is the rule
    hybrid = costs.prefill_policy(0, range(E), [1] * E, hybrid=True)  # DEVICE priced as host and link side by side
    assert hybrid.device_s <= max(hybrid.host_s, hybrid.stream_s)
    assert hybrid.policy == min([(hybrid.host_s, HOST), (hybrid.device_s, DEVICE)]
                                + ([(hybrid.stream_s, STREAM)] if hybrid.staging_room else []))[1] or (
        hybrid.host_s == hybrid.device_s)
