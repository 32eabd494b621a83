"""What a strategy may know, ask and do through the engine (plugin contract v2)."""

import pytest
import torch
from support import configure, route

from specterbench import Strategy
from specterbench.engine.routing import group_tokens
from specterbench.strategy import PrefetchResult


def test_sizes_are_exposed(engine):
    assert (engine.num_layers, engine.num_experts, engine.top_k) == (2, 8, 2)
    assert engine.expert_bytes > 0 and engine.priced_expert_bytes > 0


def test_prefetch_says_what_it_did(engine):
    configure(engine, Strategy(), slots=2)
    assert engine.prefetch((0, 1)) is PrefetchResult.QUEUED
    assert engine.prefetch((0, 2)) is PrefetchResult.QUEUED
    assert engine.prefetch((0, 2)) is PrefetchResult.IN_FLIGHT  # queued behind (0, 1)
    assert engine.prefetch((0, 3)) is PrefetchResult.NO_ROOM and not engine.prefetch((0, 3))
    engine.clock.compute(0, 1e12)  # let both land
    assert engine.prefetch((0, 1)) is PrefetchResult.CACHED


def test_cancel_frees_a_queued_copy_but_not_one_on_the_link(engine):
    configure(engine, Strategy(), slots=3)
    engine.prefetch((0, 1))  # starts at once on the idle link
    engine.prefetch((0, 2))
    assert not engine.cancel((0, 1))
    assert engine.cancel((0, 2)) and (0, 2) not in engine.cache
    assert engine.stats.prefetch_bytes == engine.expert_bytes and engine.stats.prefetch_cancelled == 1
    assert not engine.cancel((1, 7))  # not cached


def test_on_copy_landed_reports_each_landed_copy_once(engine):
    class Listener(Strategy):
        name = "listener"
        version = "1"
        landed: list

        def on_copy_landed(self, key):
            self.landed.append(key)

    strategy = Listener()
    strategy.landed = []
    configure(engine, strategy, slots=4)
    engine.prefetch((1, 5))
    engine.clock.compute(0, 1e12)
    route(engine, 0, [[0, 1]])
    route(engine, 1, [[5, 6]])
    assert strategy.landed.count((1, 5)) == 1 and (0, 0) in strategy.landed


def test_router_signals_are_there_for_every_token_of_the_layer(engine):
    seen = {}

    class Reader(Strategy):
        name = "reader"
        version = "1"

        def before_layer(self, layer, experts, n):
            r = self.engine.routing
            seen[layer] = (r.top_k_index.clone(), r.logits.shape, float(r.probs.sum()), list(r.experts))
            if layer == 0:
                seen["guess"] = self.engine.router_guess(1)

    configure(engine, Reader(), slots=16)
    kv = engine.new_kv_cache()
    engine.forward(torch.tensor([[1, 2, 3, 4]]), kv)  # a 4-token prefill
    idx, logits_shape, prob_mass, experts = seen[0]
    assert idx.shape == (4, 2) and logits_shape == (4, 8) and prob_mass == pytest.approx(4.0)
    assert experts == sorted(set(idx.flatten().tolist()))
    assert seen["guess"].top_k_index.shape == (4, 2) and seen["guess"].layer == 1
    assert engine.routing is None  # only while a layer runs


def test_reading_no_router_signal_costs_nothing(engine, monkeypatch):
    calls = []
    gate = engine.gates[0]
    monkeypatch.setattr(gate, "forward", lambda h, f=gate.forward: calls.append(1) or f(h))
    configure(engine, Strategy(), slots=16)
    route(engine, 0, [[0, 1]])
    assert calls == []


def test_the_cache_has_a_per_layer_view(engine):
    configure(engine, Strategy(), slots=6)
    for key in ((0, 3), (1, 2), (0, 1)):
        engine.prefetch(key)
    assert engine.cache.layer_keys(0) == [(0, 3), (0, 1)] and engine.cache.layer_count(1) == 1
    engine.clock.compute(0, 1e12)
    candidates = engine.candidates(protect={(0, 3)})
    assert list(candidates.in_layer(0)) == [(0, 1)] and (0, 3) not in candidates and len(candidates) == 2


def test_warm_up_is_flagged_and_its_counts_are_dropped(engine):
    class Counter(Strategy):
        name = "counter"
        version = "1"
        ended = False

        def on_warmup_end(self):
            self.ended = True

    strategy = Counter()
    configure(engine, strategy, slots=4)
    engine.begin_warmup()
    assert engine.warming_up
    route(engine, 0, [[0, 1]])
    engine.end_warmup()
    assert not engine.warming_up and strategy.ended
    assert engine.stats.misses == 0 and engine.clock.totals.compute_busy_s == 0


def test_one_grouping_gives_the_rows_torch_where_would():
    torch.manual_seed(0)
    idx = torch.stack([torch.randperm(8)[:2] for _ in range(9)])  # [9, 2]
    weights = torch.rand(9, 2)
    groups = group_tokens(idx, weights, 8)
    for e, rows, scale in groups:
        token_idx, pos = torch.where(idx == e)
        assert torch.equal(rows, token_idx)
        assert torch.equal(scale, weights[token_idx, pos, None])
    assert groups.counts.sum() == 18 and groups.experts == sorted(set(idx.flatten().tolist()))


def test_prefill_stall_is_kept_apart_from_decode_stall(engine):
    configure(engine, Strategy(), slots=4)
    request = __import__("specterbench").Request("p", (1, 2, 3), 3)
    engine.begin_request(request)
    engine.decode(request)
    first, rest = engine.samples[0], engine.samples[1:]
    assert first.stall_s > 0  # the prefill missed every expert it routed to
    assert sum(s.stall_s for s in engine.samples) == pytest.approx(engine.clock.totals.stall_s)
    assert all(s.stall_s >= 0 for s in rest)


def test_a_one_token_layer_groups_like_a_longer_one():
    idx, weights = torch.tensor([[5, 2, 7]]), torch.tensor([[0.5, 0.3, 0.2]])
    one = group_tokens(idx, weights, 8)
    assert one.experts == [2, 5, 7] and one.tokens_per_expert == [1, 1, 1]
    assert [float(s) for _, _, s in one] == pytest.approx([0.3, 0.5, 0.2])
    assert all(rows.tolist() == [0] for _, rows, _ in one) and one.counts.tolist() == [0, 0, 1, 0, 0, 1, 0, 1]


def test_released_device_bytes_go_to_the_cache_up_to_the_budget(engine):
    class Holder(Strategy):
        name = "holder"
        version = "1"

        def device_bytes(self, engine):
            return 2 * engine.expert_bytes

    configure(engine, Holder(), slots=5)
    assert engine.cache.capacity_bytes == 3 * engine.expert_bytes
    engine.release_device_bytes(engine.expert_bytes)
    assert engine.cache.capacity_bytes == 4 * engine.expert_bytes
    with pytest.raises(Exception, match="not yet released"):
        engine.release_device_bytes(2 * engine.expert_bytes)


def test_default_option_and_budget_checks_accept_everything(engine):
    Strategy.validate_options({"anything": 1})
    Strategy.check_budget(engine, 1, {})
    assert Strategy().engine is None


def test_candidates_add_like_the_lists_of_contract_v1(engine):
    configure(engine, Strategy(), slots=4)
    engine.prefetch((0, 1))
    engine.clock.compute(0, 1e12)
    assert engine.candidates() + [(1, 1)] == [(0, 1), (1, 1)] and [(1, 1)] + engine.candidates() == [(1, 1), (0, 1)]
