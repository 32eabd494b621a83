"""The prefill's overlap (engine.prefill.stage_next): the next layer's copies are issued before this layer's host
experts are joined, the overlapped prefill's modeled time is the pipelined recurrence of the cost model's prices,
the cache never holds more than its bytes, tokens stay the reference's, and Specter's option is checked."""

import pytest
import torch

from specterbench.catalog.tiny import tiny_random
from specterbench.engine.engine import Engine
from specterbench.engine.geometry import project
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.errors import UsageError
from specterbench.strategy import DEVICE, ON_HOST, STREAM, Request, Strategy

PROMPT = tuple(range(3, 43))
LONG = tuple(3 + (7 * i) % 200 for i in range(240))


class Overlapped(Strategy):
    """Every prefill layer under one policy, misses placed on the host or fetched, the next layer's copies staged
    when ``ahead``."""

    name = "overlapped-prefill"
    version = "1"

    def __init__(self, policy, ahead=True, place=ON_HOST, **options):
        super().__init__(**options)
        self.policy, self.ahead, self.place = policy, ahead, place

    def prefill_layer(self, layer, experts, tokens_per_expert):
        return self.policy

    def prefill_ahead(self, layer):
        return self.ahead

    def place_miss(self, key, n_tokens):
        return self.place if self.engine.prefilling else "fetch"


class Resident(Strategy):
    name = "resident-overlap"
    version = "1"

    def min_cache_bytes(self, engine):
        return engine.total_expert_bytes


def mixtral_engine():
    model, _ = tiny_random("mixtral")
    engine = Engine(model, name="tiny-random-mixtral")
    engine.geometry = project(engine.own_geometry, "mixtral")  # priced at Mixtral's sizes
    return engine


@pytest.fixture(scope="module")
def engine():
    return mixtral_engine()


def configure(engine, strategy, budget, host=True):
    clock = ModeledClock(default_profile(), engine.geometry, default_host_profile() if host else None)
    engine.configure(strategy, budget, clock)
    if isinstance(strategy, Resident):
        for key in engine.store.weights:
            engine.prefetch(key)


def decode(engine, strategy, budget, prompt=PROMPT, host=True):
    configure(engine, strategy, budget, host)
    request = Request("r", prompt, 4)
    engine.begin_request(request)
    return engine.decode(request)


def test_the_next_layers_copies_are_issued_before_this_layers_host_experts_are_joined(engine):
    configure(engine, Overlapped(DEVICE), engine.total_expert_bytes // 2)
    events = []
    clock = engine.clock
    issue, wait_host = clock.issue, clock.wait_host
    clock.issue = lambda key, *a, **k: (events.append(("copy", key[0], engine.current_layer)), issue(key, *a, **k))[1]
    clock.wait_host = lambda jobs: (events.append(("join", engine.current_layer, None)), wait_host(jobs))[1]
    engine.begin_request(Request("r", LONG, 1))
    engine.forward(torch.tensor([LONG]), engine.new_kv_cache())
    staged = [(i, e) for i, e in enumerate(events) if e[0] == "copy" and e[1] == e[2] + 1]
    assert staged and engine.stats.staged_experts == len(staged)
    for i, (_, nxt, layer) in staged:  # a copy for layer L + 1 issued while L runs, before L's host join
        joins = [j for j, e in enumerate(events) if e[0] == "join" and e[1] == layer]
        assert joins and i < joins[0]
    assert engine.stats.host_experts > 0


def test_without_the_overlap_no_copy_is_issued_ahead(engine):
    configure(engine, Overlapped(DEVICE, ahead=False), engine.total_expert_bytes // 2)
    engine.begin_request(Request("r", LONG, 1))
    engine.forward(torch.tensor([LONG]), engine.new_kv_cache())
    assert engine.stats.staged_experts == 0


def prefill_time(engine, ahead):
    """One prompt's forward under STREAM with every miss copied (no host profile), its modeled seconds and the
    routing it recorded."""
    configure(engine, Overlapped(STREAM, ahead=ahead, place="fetch"), engine.total_expert_bytes, host=False)
    engine.begin_request(Request("r", PROMPT, 1))
    recorder = engine.start_recording()
    start = engine.clock.now()
    engine.forward(torch.tensor([PROMPT]), engine.new_kv_cache())
    engine.clock.sync()
    engine.stop_recording()
    return engine.clock.now() - start, recorder


def test_the_overlapped_prefills_modeled_time_is_the_pipelined_recurrence(engine):
    """Layer L + 1's copies start when layer L's grouped op and the router's guess have run, so L + 1 ends at
    ``max(end_L + guess + dense, end_L + guess + m_{L+1}·copy) + grouped_{L+1}``; without the overlap its copies
    start after its own dense part: ``end_L + dense + m·copy + grouped``."""
    plain_s, rec = prefill_time(engine, ahead=False)
    overlapped_s, rec2 = prefill_time(engine, ahead=True)
    assert engine.stats.staged_unused == 0 and engine.stats.streamed_experts > 0
    assert torch.equal(rec.counts, rec2.counts)
    costs, T = engine.costs, len(PROMPT)
    copy, guess, dense = costs.copy_s(), costs.router_s(T), costs.layer_s(T)
    tail = costs.head_s(1) + costs.model.op_seconds(*costs.model.sample(1))
    groups = [[n for n in row.tolist() if n] for row in rec.counts]
    plain = sum(dense + len(g) * copy + costs.experts_grouped_s(g) for g in groups) + tail
    assert plain_s == pytest.approx(plain, rel=1e-9)
    t = dense + len(groups[0]) * copy + costs.experts_grouped_s(groups[0])
    for g in groups[1:]:
        t += guess
        t = max(t + dense, t + len(g) * copy) + costs.experts_grouped_s(g)
    assert overlapped_s == pytest.approx(t + tail, rel=1e-9)
    assert overlapped_s < plain_s


def test_the_cache_never_holds_more_than_its_bytes_and_tokens_stay_the_references(engine):
    reference = decode(engine, Resident(), engine.total_expert_bytes)
    for policy, budget in ((DEVICE, 2 * engine.expert_bytes), (STREAM, engine.total_expert_bytes // 3)):
        strategy = Overlapped(policy)
        configure(engine, strategy, budget)
        peak, fetch = [0], engine._fetch

        def counted(*a, **k):
            slot = fetch(*a, **k)
            peak[0] = max(peak[0], engine.cache.used_bytes)
            assert engine.cache.used_bytes <= engine.cache.capacity_bytes <= budget
            return slot

        engine._fetch = counted
        try:
            request = Request("r", LONG, 4)
            engine.begin_request(request)
            tokens = engine.decode(request)
        finally:
            del engine._fetch
        assert engine.stats.staged_experts > 0 and peak[0] <= engine.cache.capacity_bytes
        long_reference = decode(engine, Resident(), engine.total_expert_bytes, prompt=LONG)
        assert tokens == long_reference
    assert decode(engine, Overlapped(DEVICE), engine.total_expert_bytes // 2) == reference


def test_specters_prefill_overlap_option_is_checked():
    from specterbench_specter.specter import Specter

    Specter.validate_options({"prefill_overlap": "on"})
    with pytest.raises(UsageError, match="prefill_overlap='maybe' is invalid: use on or off"):
        Specter.validate_options({"prefill_overlap": "maybe"})
