"""What the engine launches, counted on the CPU with a TorchDispatchMode at real routing geometries (random-init,
hidden 64), held to the description the cost model prices with (specterbench.engine.kernels)."""

import pytest
import torch
import torch.nn.functional as F

from specterbench import Strategy
from specterbench.baselines import LRU
from specterbench.catalog.tiny import ROUTING_GEOMETRIES, routing_geometry_random
from specterbench.engine.draft import QuantSpec, shared_quantized
from specterbench.engine.engine import Engine
from specterbench.engine.kernels import EXPERT_OP_LAUNCHES, HOST_READ_LAUNCHES, LaunchCounter
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.engine.sampling import DecodeSetting

PROMPT = tuple(range(3, 15))
# ceilings on ops per decode token: a regression in what the engine launches breaks them
RESIDENT_LIMITS = {"qwen1.5-moe": 1300, "deepseek-v2-lite": 1500}


class AllResident(Strategy):
    name = "all-resident"
    version = "1"

    def min_cache_bytes(self, engine):
        return engine.total_expert_bytes


def configure(engine, strategy, budget_bytes):
    engine.configure(strategy, budget_bytes, ModeledClock(default_profile(), engine.geometry,
                                                          default_host_profile()))
    if isinstance(strategy, AllResident):
        for key in engine.store.weights:
            engine.prefetch(key)


@pytest.fixture(scope="module", params=list(ROUTING_GEOMETRIES))
def engine(request):
    return Engine(routing_geometry_random(request.param), name=f"random-{request.param}")


def counted(engine, fn):
    """(ops counted, launches the modeled clock charged) while ``fn`` runs."""
    before = engine.clock.totals.launches
    with LaunchCounter() as counter:
        fn()
    return counter.total, engine.clock.totals.launches - before


def decode_step(engine, sampler, kv, token, position, **forward):
    logits = engine.forward(torch.tensor([[token]]), kv, **forward)
    return sampler.pick(logits[-1], position)


@pytest.mark.parametrize("mode", ["gathered", "grouped"])
@pytest.mark.parametrize("tokens", [1, 2, 9, 33])
def test_the_expert_part_of_a_moe_layer_is_at_most_12_ops_whatever_top_k_and_tokens(engine, tokens, mode):
    configure(engine, AllResident(), engine.total_expert_bytes)
    engine.pool.mode = mode  # grouped: F.grouped_mm (the GPU's path; it runs on the CPU too, O(slots) per call)
    k, E = engine.top_k, engine.num_experts
    gen = torch.Generator().manual_seed(tokens)
    idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(tokens)])  # [T, k]
    weights = torch.rand(tokens, k, generator=gen)
    hidden = torch.randn(tokens, engine.own_geometry.hidden, generator=gen)
    with LaunchCounter() as counter:
        out = engine.run_moe_layer(3, F.silu, hidden, idx, weights)
    assert out.shape == hidden.shape
    assert counter.total <= 12, counter.ops
    assert counter.total <= EXPERT_OP_LAUNCHES[mode] + HOST_READ_LAUNCHES


@pytest.mark.parametrize("mode", ["gathered", "grouped"])
def test_the_grouped_op_equals_the_per_expert_sum(engine, mode):
    configure(engine, AllResident(), engine.total_expert_bytes)
    engine.pool.mode = mode
    k, E = engine.top_k, engine.num_experts
    gen = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(7)])  # [7, k]
    weights, hidden = torch.rand(7, k, generator=gen), torch.randn(7, engine.own_geometry.hidden, generator=gen)
    ours = engine.run_moe_layer(2, F.silu, hidden, idx, weights)
    want = torch.zeros_like(hidden)
    for t in range(7):
        for j in range(k):
            gate_up, down = (w.float() for w in engine.store.weights[(2, int(idx[t, j]))])
            g, u = F.linear(hidden[t], gate_up).chunk(2)
            want[t] += weights[t, j] * F.linear(F.silu(g) * u, down)
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["gathered", "grouped"])
def test_experts_run_elsewhere_take_their_rows_of_the_grouped_op(engine, mode):
    from specterbench.strategy import ON_HOST

    class HostOdd(Strategy):
        name = "host-odd"
        version = "1"

        def place_miss(self, key, n_tokens):
            return ON_HOST

    configure(engine, HostOdd(), engine.total_expert_bytes)
    engine.pool.mode = mode
    for e in range(0, engine.num_experts, 2):  # even experts on the device, odd ones missed and run on the host
        engine.prefetch((1, e))
    gen = torch.Generator().manual_seed(1)
    k, E, H = engine.top_k, engine.num_experts, engine.own_geometry.hidden
    idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(5)])  # [5, k]
    weights, hidden = torch.rand(5, k, generator=gen), torch.randn(5, H, generator=gen)
    ours = engine.run_moe_layer(1, F.silu, hidden, idx, weights)
    assert engine.stats.host_experts > 0 and engine.stats.expert_computes > 0
    configure(engine, AllResident(), engine.total_expert_bytes)
    torch.testing.assert_close(ours, engine.run_moe_layer(1, F.silu, hidden, idx, weights), rtol=1e-5, atol=1e-5)


def test_a_resident_decode_token_issues_at_most_its_limit_and_the_cost_model_charges_it(engine):
    configure(engine, AllResident(), engine.total_expert_bytes)
    sampler = DecodeSetting.sample(temperature=1.0).sampler("p0")
    kv = engine.new_kv_cache()
    token = sampler.pick(engine.forward(torch.tensor([PROMPT]), kv)[-1], len(PROMPT))
    decode_step(engine, sampler, kv, token, len(PROMPT) + 1)  # warm caches (the sampler's vocabulary table)
    ops, charged = counted(engine, lambda: decode_step(engine, sampler, kv, token, len(PROMPT) + 2))
    limit = RESIDENT_LIMITS.get(engine.name.removeprefix("random-"))
    if limit is not None:
        assert ops <= limit
    assert charged == pytest.approx(ops, rel=0.10)


def test_an_lru_cell_at_half_the_experts_adds_at_most_a_tenth(engine):
    def ops_per_token(strategy, budget):
        configure(engine, strategy, budget)
        sampler = DecodeSetting.sample(temperature=1.0).sampler("p0")
        kv = engine.new_kv_cache()
        token = sampler.pick(engine.forward(torch.tensor([PROMPT]), kv)[-1], len(PROMPT))
        counts = []
        for i in range(4):
            ops, _ = counted(engine, lambda: decode_step(engine, sampler, kv, token, len(PROMPT) + 1 + i))
            counts.append(ops)
        return sum(counts) / len(counts)

    resident = ops_per_token(AllResident(), engine.total_expert_bytes)
    assert ops_per_token(LRU(), engine.total_expert_bytes // 2) <= 1.10 * resident


def test_the_cost_model_charges_the_draft_step_and_the_verification_it_counts(engine):
    configure(engine, AllResident(), engine.total_expert_bytes)
    draft = shared_quantized(engine, QuantSpec(bits=4, blocksize=32, quantizer="int"))
    sampler = DecodeSetting.sample(temperature=1.0).sampler("p0")
    kv = engine.new_kv_cache()
    token = sampler.pick(engine.forward(torch.tensor([PROMPT]), kv)[-1], len(PROMPT))
    kept = kv.get_seq_length()
    ops, charged = counted(engine, lambda: decode_step(engine, sampler, kv, token, len(PROMPT) + 1, experts=draft))
    assert charged == pytest.approx(ops, rel=0.10)
    engine.rollback(kv, kept)
    window = torch.tensor([[token, 5, 6, 7, 8]])  # the last token and four proposals

    def verify():
        sampler.pick_many(engine.forward(window, kv, all_logits=True), len(PROMPT) + 1)

    ops, charged = counted(engine, verify)
    assert charged == pytest.approx(ops, rel=0.10)


def test_a_grown_pool_keeps_its_experts_and_computes_the_same(engine):
    class Holder(Strategy):
        name = "holder"
        version = "1"

        def device_bytes(self, engine):
            return 4 * engine.expert_bytes

    k, H = engine.top_k, engine.own_geometry.hidden
    configure(engine, Holder(), (k + 4) * engine.expert_bytes)
    for e in range(k):
        engine.prefetch((0, e))
    before = engine.pool.slots
    engine.release_device_bytes(4 * engine.expert_bytes)
    assert engine.pool.slots == before + 4 and all((0, e) in engine.cache for e in range(k))
    idx, weights = torch.arange(k).unsqueeze(0), torch.full((1, k), 1.0 / k)
    hidden = torch.randn(1, H, generator=torch.Generator().manual_seed(3))
    ours = engine.run_moe_layer(0, F.silu, hidden, idx, weights)
    assert engine.stats.hits == k
    configure(engine, AllResident(), engine.total_expert_bytes)
    torch.testing.assert_close(ours, engine.run_moe_layer(0, F.silu, hidden, idx, weights), rtol=1e-5, atol=1e-5)
