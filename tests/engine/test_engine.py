import pytest
import torch
from support import configure, route

from specterbench import Request, Strategy
from specterbench.baselines import LRU, OnDemand
from specterbench.catalog.tiny import TINY_FAMILIES, tiny_random
from specterbench.engine.engine import Engine
from specterbench.errors import BudgetError, EngineViolation, ModelError


def test_store_holds_every_expert_in_bf16_and_the_model_holds_none(engine):
    assert len(engine.store.weights) == 2 * 8
    assert engine.expert_bytes == 3 * 64 * 96 * 2
    assert not any("gate_up_proj" in n for n, _ in engine.model.named_parameters())


def test_on_demand_fetches_every_needed_expert_and_keeps_nothing(engine):
    configure(engine, OnDemand(), slots=4)
    for tokens in ([[0, 1]], [[1, 2]], [[0, 1]]):
        route(engine, 0, tokens)
        assert len(engine.cache) == 0
    assert (engine.stats.hits, engine.stats.misses) == (0, 6)
    assert engine.stats.h2d_bytes == 6 * engine.expert_bytes == engine.stats.demand_bytes


def test_lru_hits_and_evicts_the_least_recently_used_expert_of_the_layer(engine):
    configure(engine, LRU(), slots=4)  # 2 slots per layer; a layer may use free slots while the cache fills
    route(engine, 1, [[5, 6]])  # fill layer 1's share: the cache is now full after layer 0's first step
    route(engine, 0, [[0, 1]])  # miss 0, miss 1
    route(engine, 0, [[1, 2]])  # hit 1, miss 2 evicts 0
    route(engine, 0, [[0, 1]])  # miss 0 evicts 2, hit 1
    assert (engine.stats.hits, engine.stats.misses) == (2, 6)
    assert sorted(engine.cache.keys()) == [(0, 0), (0, 1), (1, 5), (1, 6)]
    assert engine.stats.h2d_bytes == 6 * engine.expert_bytes


def test_lru_quota_keeps_one_layer_from_evicting_another(engine):
    configure(engine, LRU(), slots=4)
    route(engine, 0, [[0, 1]])
    route(engine, 1, [[0, 1]])
    route(engine, 1, [[2, 3]])  # layer 1 is at its quota: it evicts its own experts
    route(engine, 0, [[0, 1]])
    assert (engine.stats.hits, engine.stats.misses) == (2, 6)


def test_prefill_touching_every_expert_streams_within_the_budget(engine):
    configure(engine, LRU(), slots=2)
    out = route(engine, 0, [[e, (e + 1) % 8] for e in range(8)])  # 8 tokens cover all 8 experts
    assert out.shape == (8, 64)
    assert engine.cache.peak_bytes <= 2 * engine.expert_bytes
    assert engine.stats.misses == 8


def test_layer_output_equals_the_stock_experts_module(engine):
    model, _ = tiny_random("mixtral")
    stock = model.model.layers[0].mlp.experts
    configure(engine, LRU(), slots=3)
    torch.manual_seed(1)
    idx = torch.stack([torch.randperm(8)[:2] for _ in range(5)])
    hidden, weights = torch.randn(5, 64), torch.rand(5, 2)
    ours = engine.run_moe_layer(0, stock.act_fn, hidden, idx, weights)
    torch.testing.assert_close(ours, stock(hidden, idx, weights), rtol=1e-5, atol=1e-6)


def test_budget_below_one_forward_is_refused(engine):
    with pytest.raises(BudgetError, match="needs at least"):
        configure(engine, LRU(), slots=1)


def test_device_bytes_of_a_strategy_are_charged_to_the_budget(engine):
    class Holder(Strategy):
        name = "holder"
        version = "1"

        def device_bytes(self, engine):
            return 2 * engine.expert_bytes

    configure(engine, Holder(), slots=5)
    assert engine.cache.capacity_bytes == 3 * engine.expert_bytes


def test_prefetch_beyond_the_budget_is_declined(engine):
    configure(engine, LRU(), slots=2)
    assert engine.prefetch((0, 3)) and engine.prefetch((0, 4))
    assert not engine.prefetch((0, 5))
    assert engine.cache.used_bytes == 2 * engine.expert_bytes


def test_evicting_the_expert_in_use_is_refused(engine):
    class Rogue(Strategy):
        name = "rogue"
        version = "1"

        def before_layer(self, layer, experts, n):
            self.engine.cache.in_use = (layer, experts[0])
            self.engine.evict((layer, experts[0]))

    configure(engine, Rogue(), slots=4)
    engine.prefetch((0, 0))
    with pytest.raises(EngineViolation, match="in use"):
        route(engine, 0, [[0, 1]])


def test_a_victim_outside_the_candidates_is_refused(engine):
    class Wrong(Strategy):
        name = "wrong"
        version = "1"

        def choose_victim(self, candidates, needed):
            return (1, 7)

    configure(engine, Wrong(), slots=2)
    with pytest.raises(EngineViolation, match="not evictable"):
        route(engine, 0, [[0, 1], [2, 3]])


def test_wasted_prefetches_are_counted(engine):
    configure(engine, LRU(), slots=4)
    engine.prefetch((0, 6))
    engine.clock.compute(0, 1e9)  # let it land
    route(engine, 0, [[0, 1]])
    route(engine, 0, [[2, 3]])  # evicts the unused prefetch
    assert engine.stats.prefetch_issued == 1 and engine.stats.prefetch_wasted >= 1


def test_a_model_without_moe_blocks_names_the_supported_families():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(ModelError, match="supported families: mixtral"):
        Engine(model, name="llama")


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_engine_tokens_equal_stock_generate(family):
    model, tok = tiny_random(family)
    prompt = tok.encode("Shall I compare thee to a summer's day?")
    stock = model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
    engine = Engine(model, name=family, tokenizer=tok)
    configure(engine, LRU(), slots=engine.top_k * engine.num_layers)
    request = Request("p", tuple(prompt), 12)
    engine.begin_request(request)
    assert engine.greedy_decode(request) == stock[0, len(prompt):].tolist()
    assert engine.stats.misses > 0
