import pytest
import torch

from specterbench import Request
from specterbench.engine.engine import Engine
from specterbench.errors import BudgetError, UsageError
from specterbench.engine.geometry import project
from specterbench.engine.models import TINY_FAMILIES, tiny_random
from specterbench.engine.profiles import BUILTIN_PROFILES
from specterbench.bench.runner import BenchConfig, Runner, parse_budget
from specterbench.engine.clocks import ModeledClock
from specterbench.engine.draft import quantized_bytes
from specterbench_specter.specter import SpecDecode, Specter, accepted_prefix

PROMPT = "Shall I compare thee to a summer's day? Thou art more lovely"


def engine_for(family="mixtral"):
    model, tok = tiny_random(family)
    return Engine(model, name=family, tokenizer=tok)


def configure(engine, strategy, fraction):
    engine.configure(strategy, int(fraction * engine.total_expert_bytes),
                     ModeledClock(BUILTIN_PROFILES[0], engine.geometry))


@pytest.mark.parametrize("proposals, greedy, accepted", [
    ([5, 6, 7], [1, 6, 7, 8], 0),  # first proposal wrong: accept none, emit the target's token
    ([5, 6, 7], [5, 6, 9, 8], 2),  # some
    ([5, 6, 7], [5, 6, 7, 8], 3),  # all K, plus the bonus token
])
def test_accepted_prefix(proposals, greedy, accepted):
    assert accepted_prefix(proposals, greedy) == accepted


def test_kv_rollback_then_continue_equals_a_fresh_decode():
    engine = engine_for()
    configure(engine, SpecDecode(k=2), 1.0)
    ids = engine.tokenizer.encode(PROMPT)
    fresh = engine.new_kv_cache()
    engine.forward(torch.tensor([ids]), fresh)
    expect = engine.forward(torch.tensor([[7]]), fresh)
    kv = engine.new_kv_cache()
    engine.forward(torch.tensor([ids]), kv)
    engine.forward(torch.tensor([[9, 9, 9]]), kv)  # three rejected tokens
    engine.rollback(kv, len(ids))
    assert kv.get_seq_length() == len(ids)
    torch.testing.assert_close(engine.forward(torch.tensor([[7]]), kv), expect)


@pytest.mark.parametrize("cls", [Specter, SpecDecode])
def test_tokens_equal_greedy_when_the_draft_disagrees_everywhere(cls):
    engine = engine_for()
    strategy = cls(k=3)
    configure(engine, strategy, 0.6)
    torch.manual_seed(3)
    for key in strategy.draft.dense:  # a draft that knows nothing: loud random experts
        strategy.draft.dense[key] = tuple(torch.randn_like(w) * 5 for w in strategy.draft.dense[key])
    request = Request("p", tuple(engine.tokenizer.encode(PROMPT)), 10)
    engine.begin_request(request)
    out = strategy.generate(engine, request)
    engine2 = engine_for()
    configure(engine2, SpecDecode(k=1), 1.0)
    engine2.begin_request(request)
    assert out == engine2.greedy_decode(request)
    assert strategy.metrics()["acceptance_rate"] < 0.5


def test_draft_is_charged_to_the_budget_at_its_real_packed_size():
    engine = engine_for()
    strategy = Specter(k=2)
    configure(engine, strategy, 0.6)
    n = sum(w.numel() for pair in engine.store.weights.values() for w in pair)
    assert strategy.draft.nbytes == n // 2 + n // 64 * 4  # nf4 nibbles + one fp32 scale per 64 values
    assert strategy.draft.nbytes == quantized_bytes(engine, strategy.spec)
    assert engine.cache.capacity_bytes == int(0.6 * engine.total_expert_bytes) - strategy.draft.nbytes
    assert 0.27 < strategy.draft.bytes_ratio < 0.29


def test_plan_is_issued_earliest_layer_first():
    engine = engine_for()
    engine.geometry = project(engine.own_geometry, "mixtral")  # copies slow enough to queue
    strategy = Specter(k=3)
    configure(engine, strategy, 0.7)
    strategy.begin_window()
    routing = [(1, [6, 7], [1, 1]), (0, [2, 3], [1, 1])]  # layer 1 reported first on purpose
    engine.clock.compute(0, 1e12)  # let nothing else hold the link
    strategy.after_draft_step(0, routing, step_s=0.0)
    queued = [t.key for t in engine.clock.queued] + [s.key for s in engine.cache.slots.values()
                                                      if s.transfer.start_s is not None]
    engine.clock.settle()
    order = sorted((s.transfer.start_s, s.key) for s in engine.cache.slots.values())
    layers = [key[0] for _, key in order]
    assert set(queued) == {(1, 6), (1, 7), (0, 2), (0, 3)}
    assert layers[1:] == sorted(layers[1:])  # after the copy that took the idle link, layer 0 goes first


@pytest.mark.parametrize("options, match", [
    ({"k": 0}, "K must be from 1 to 64"), ({"k": 65}, "K must be from 1 to 64"), ({"k": "x"}, "K must be"),
    ({"bits": 3}, "supported: 4, 8"), ({"quant_type": "int4"}, "supported: nf4, fp4")])
def test_bad_options_are_named(options, match):
    with pytest.raises(UsageError, match=match):
        Specter(**options)


def test_budget_too_small_for_the_draft_states_the_minimum():
    engine = engine_for()
    with pytest.raises(BudgetError, match=r"needs at least \d+ bytes \(\d+\.\d% of expert bytes\)"):
        configure(engine, Specter(k=2), 0.3)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_specter_and_spec_decode_are_lossless_on_every_family(host, small_prompts, tmp_path, family):
    cfg = BenchConfig(models=(f"tiny-random-{family.replace('_', '-')}",), strategies=("specter", "spec-decode"),
                      budgets=(parse_budget("60%"),), profile="a100-40g-pcie4", prompts=2, tokens=10,
                      strategy_options={"specter": {"k": 3}, "spec-decode": {"k": 3}})
    rows = Runner(host, cfg, tmp_path).run()
    for row in rows:
        assert row.status == "ok", row.error
        assert row.lossless is True
        assert row.extra["acceptance_rate"] is not None
        assert row.peak_cache_bytes <= row.budget_bytes - row.extra["draft_device_bytes"]


def test_auto_k_profiles_candidates_on_calibration_prompts(host, small_prompts, tmp_path):
    cfg = BenchConfig(models=("tiny-random-mixtral",), strategies=("specter",), budgets=(parse_budget("60%"),),
                      profile="a100-40g-pcie4", prompts=1, tokens=6)
    row = Runner(host, cfg, tmp_path).run()[0]
    profile = row.extra["k_profile_ms_per_token"]
    assert set(profile) == {"1", "2", "3", "4", "6", "8"}
    assert row.extra["k"] == int(min(profile, key=profile.get))
