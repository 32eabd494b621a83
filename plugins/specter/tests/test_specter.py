import pytest
import torch

from specterbench import Request, Strategy
from specterbench.baselines.cpu_experts import CpuExperts
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.catalog.tiny import TINY_FAMILIES, tiny_random
from specterbench.engine.draft import quantized_bytes
from specterbench.engine.engine import Engine
from specterbench.engine.geometry import project
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.engine.sampling import GREEDY, DecodeSetting
from specterbench.errors import BudgetError, UsageError
from specterbench.strategy import RoutingCalibration
from specterbench_specter import SpecDecode, SpecMoEOff, Specter, SpecterArtifact, accepted_prefix

PROMPT = "Shall I compare thee to a summer's day? Thou art more lovely"
SAMPLED = DecodeSetting.sample(temperature=1.0)
ALL = ("specter", "specter-artifact", "specmoeoff", "spec-decode")


def engine_for(family="mixtral"):
    model, tok = tiny_random(family)
    return Engine(model, name=family, tokenizer=tok)


def configure(engine, strategy, fraction, host=True):
    configure_bytes(engine, strategy, int(fraction * engine.total_expert_bytes), host)


def configure_bytes(engine, strategy, budget_bytes, host=True):
    engine.configure(strategy, budget_bytes,
                     ModeledClock(default_profile(), engine.geometry, default_host_profile() if host else None))


@pytest.mark.parametrize("proposals, target, accepted", [
    ([5, 6, 7], [1, 6, 7, 8], 0),  # first proposal wrong: accept none, emit the target's token
    ([5, 6, 7], [5, 6, 9, 8], 2),  # some
    ([5, 6, 7], [5, 6, 7, 8], 3),  # all K, plus the bonus token
])
def test_accepted_prefix(proposals, target, accepted):
    assert accepted_prefix(proposals, target) == accepted


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


@pytest.mark.parametrize("decode", [GREEDY, SAMPLED], ids=["greedy", "sample"])
@pytest.mark.parametrize("cls", [Specter, SpecDecode])
def test_tokens_are_the_targets_when_the_draft_disagrees_everywhere(cls, decode):
    engine = engine_for()
    strategy = cls(k=3)
    configure(engine, strategy, 0.8)
    torch.manual_seed(3)
    from specterbench.engine.packing import PackedWeight

    for key, pair in strategy.draft.packed.items():  # a draft that knows nothing: loud random experts
        strategy.draft.packed[key] = tuple(PackedWeight(torch.randn(p.shape) * 5, p.spec, engine.compute_dtype)
                                           for p in pair)
    request = Request("p", tuple(engine.tokenizer.encode(PROMPT)), 10, decode=decode)
    engine.begin_request(request)
    out = strategy.generate(engine, request)
    engine2 = engine_for()
    configure(engine2, Strategy(), 1.0)
    engine2.begin_request(request)
    assert out == engine2.decode(request)
    if decode is GREEDY:  # sampled, the shared noise dominates a random model's flat logits: drafts still agree
        assert strategy.metrics()["acceptance_rate"] < 0.5


def test_k0_is_plain_decoding_over_the_same_cache():
    """K = 0 reproduces the fallback — cpu-experts over the same cache bytes: popular experts resident, misses
    on the host or fetched by the balanced rule — token for token and miss for miss."""
    engine = engine_for()
    request = Request("p", tuple(engine.tokenizer.encode(PROMPT)), 12, decode=SAMPLED)
    counts = torch.arange(engine.num_layers * engine.num_experts).reshape(engine.num_layers, -1) % 5
    calibration = RoutingCalibration(counts, ())
    runs, cache_bytes = [], None
    for strategy in (Specter(k=0), CpuExperts()):
        engine = engine_for()
        engine.geometry = project(engine.own_geometry, "mixtral")
        budget = int(0.9 * engine.total_expert_bytes) if cache_bytes is None else cache_bytes  # the same cache
        configure_bytes(engine, strategy, budget)
        cache_bytes = engine.cache.capacity_bytes
        strategy.prepare(engine, calibration)
        engine.begin_request(request)
        tokens = strategy.generate(engine, request)
        s = engine.stats
        runs.append((tokens, s.hits, s.misses, s.host_experts, s.h2d_bytes))
    assert runs[0] == runs[1]
    assert runs[0][3] > 0  # the host path was taken


def test_int4_g128_draft_is_charged_at_its_packed_size():
    engine = engine_for()
    strategy = SpecterArtifact(k=2)
    configure(engine, strategy, 0.6)
    from specterbench.engine.draft import expert_scratch_bytes

    item = engine.compute_dtype.itemsize
    packed = 0
    for key, pair in engine.store.weights.items():
        for w, p in zip(pair, strategy.draft.packed[key]):
            groups = w.shape[0] * (w.shape[1] // 128 if w.shape[1] % 128 == 0 else 1)  # per row
            # nibbles + torch int4 kernel's (scale, zero) table in the compute dtype, else fp16 scale and 4-bit zero
            meta = groups * 2 * item if p.kernel == "int4mm" else groups * 20 // 8
            packed += w.numel() // 2 + meta
    assert strategy.draft.nbytes == packed + expert_scratch_bytes(engine, strategy.spec)  # + the scratch it computes in
    assert strategy.draft.allocated_bytes() <= 1.02 * strategy.draft.nbytes
    assert strategy.draft.nbytes == quantized_bytes(engine, strategy.spec)
    assert engine.cache.capacity_bytes == int(0.6 * engine.total_expert_bytes) - strategy.draft.nbytes


def test_plan_is_issued_earliest_layer_first():
    engine = engine_for()
    engine.geometry = project(engine.own_geometry, "mixtral")  # copies slow enough to queue
    strategy = Specter(k=3)
    configure(engine, strategy, 0.8)
    strategy.begin_window(3)
    routing = [(1, [6, 7], [1, 1]), (0, [2, 3], [1, 1])]  # layer 1 reported first on purpose
    strategy.after_draft_step(0, routing, step_s=1.0)
    engine.clock.settle()
    order = sorted((s.transfer.start_s, s.key) for s in engine.cache.slots.values())
    layers = [key[0] for _, key in order]
    assert {key for _, key in order} == {(1, 6), (1, 7), (0, 2), (0, 3)}
    assert layers[1:] == sorted(layers[1:])  # after the copy that took the idle link, layer 0 goes first


def test_plan_copies_never_displace_residents():
    """The plan may take the room of transients only: a full cache of residents refuses the draft's predictions
    (the verification places those misses), and no resident is evicted by a plan copy."""
    engine = engine_for()
    strategy = Specter(k=3)
    configure(engine, strategy, 0.8)
    strategy.residents = set(engine.store.weights)  # every expert a calibration resident (none cached yet)
    strategy.residents_by_unpopularity = sorted(strategy.residents)
    while engine.cache.free_bytes >= engine.expert_bytes:  # fill the cache with residents, none predicted below
        key = next(k for k in sorted(strategy.residents, reverse=True) if k not in engine.cache)
        assert engine.prefetch(key).name == "QUEUED"
    engine.clock.settle()
    before = set(engine.cache.slots)
    strategy.begin_window(3)
    strategy.after_draft_step(0, [(0, [0, 1], [2, 1]), (1, [0, 1], [1, 2])], step_s=1.0)
    strategy.before_verify()
    engine.clock.settle()
    predicted_missing = {(0, 0), (0, 1), (1, 0), (1, 1)} - before
    assert predicted_missing  # the plan had something to bring in
    assert set(engine.cache.slots) == before and not strategy.planner.issued  # no resident gave its slot


def test_resident_use_is_the_share_of_cached_residents_a_verification_reads():
    """``resident_use`` (beside ``expert_precision``, the plan's copies' use) is what a resident's slot is worth to
    a window: the residents cached as the window starts that its verification routed to, over those cached."""
    engine = engine_for()
    strategy = Specter(k=3)
    configure(engine, strategy, 0.8)
    strategy.residents = {(0, 0), (0, 1), (1, 2), (1, 3)}
    strategy.residents_by_unpopularity = sorted(strategy.residents)
    for key in sorted(strategy.residents - {(1, 3)}):  # (1, 3) a resident given up earlier: not cached
        assert engine.prefetch(key).name == "QUEUED"
    engine.clock.settle()
    strategy.k_option = 3
    assert strategy.choose_k(10) == 3 and strategy.residents_cached == 3
    assert engine.prefetch((1, 3)).name == "QUEUED"  # lands during the window: read, but not counted
    engine.clock.settle()
    strategy.begin_window(3)
    strategy.before_verify()
    strategy.before_layer(0, [0, 5], [2, 2])  # reads resident (0, 0), not (0, 1)
    strategy.before_layer(1, [2, 3], [3, 1])  # reads (1, 2), and (1, 3), not cached as the window started
    strategy.accepted_lengths.append(1)  # what the window's acceptance step records
    strategy.end_window(3, 2, 1.0)
    assert strategy.metrics()["resident_use"] == round(2 / 3, 4)


@pytest.mark.parametrize("cls, options, match", [
    (Specter, {"k": 33}, r"k=33 is out of range: use 'auto' or an integer from 0 to 32"),
    (Specter, {"k": "x"}, "out of range"),
    (Specter, {"host": "gpu"}, "use one of auto, off"),
    (Specter, {"bits": 5}, "supported: 2, 3, 4, 8"),
    (Specter, {"quantizer": "gptq"}, "supported: bnb, int, hqq"),
    (Specter, {"quantizer": "bnb", "bits": 3}, "supported: 4, 8"),
    (SpecterArtifact, {"k": 5}, "use one of 2, 4, 6, 8, 12, 16, 20, 24, 32"),
    (SpecDecode, {"k": 0}, "an integer from 1 to 32"),
])
def test_bad_options_are_named_in_one_line(cls, options, match):
    with pytest.raises(UsageError, match=match) as err:
        cls.validate_options(options)
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match=match):
        cls(**options)


def test_budget_too_small_for_the_draft_states_the_minimum():
    engine = engine_for()
    with pytest.raises(BudgetError, match=r"needs at least \d+ bytes \(\d+\.\d% of expert bytes\)"):
        configure(engine, Specter(bits=8), 0.3)


def test_specter_drafts_at_4_bits_and_falls_back_to_3_where_only_that_fits():
    """The default draft is int4/g128; a budget that cannot hold it (but holds the int3 one) runs the int3 draft,
    charged as such; naming the bits turns the fallback off (a one-line refusal instead)."""
    engine = engine_for()
    need = {b: quantized_bytes(engine, Specter(bits=b).spec) + engine.min_budget_bytes() for b in (3, 4)}
    from specterbench.engine.dense_copy import dense_quantized_bytes
    dense = dense_quantized_bytes(engine, Specter.dense_spec_of({}))
    assert need[3] < need[4]
    roomy, tight = need[4] + dense + engine.expert_bytes, need[3] + dense + 1
    assert tight < need[4] + dense
    for budget, bits in ((roomy, 4), (tight, 3)):
        strategy = Specter()
        configure_bytes(engine, strategy, budget)
        assert strategy.spec.bits == bits and strategy.draft.spec.bits == bits
        assert engine.cache.capacity_bytes == budget - quantized_bytes(engine, strategy.spec) - dense
        Specter.check_budget(engine, budget, {})
    strategy = Specter()
    strategy.fit_budget(engine, tight)  # what configure asks first, with the cell's budget
    assert strategy.spec.bits == 3 and strategy.device_bytes(engine) == need[3] - engine.min_budget_bytes() + dense
    with pytest.raises(BudgetError, match=r"smallest budget that works is") as err:
        Specter.check_budget(engine, tight, {"bits": 4})
    assert "\n" not in str(err.value)
    with pytest.raises(BudgetError, match=r"int3/g128"):  # below even the fallback: the fallback's minimum named
        Specter.check_budget(engine, need[3] - 1, {})


def test_specter_drafts_below_a_quantized_target():
    """A 4-bit target: the default int4 draft is not below it, so the int3 one drafts; 3 named bits at a 3-bit
    target refuse in one line."""
    from specterbench.engine.precision import Precision

    for bits in (4, 3):
        engine = engine_for()
        engine.set_precision(Precision.parse(bits, 16))
        roomy = 10 * engine.total_expert_bytes  # the tiny model's draft outweighs its packed experts: no byte limit
        if bits == 4:
            assert Specter.draft_spec_for(engine, roomy, {}).bits == 3
            assert Specter.draft_spec_for(engine, roomy, {"bits": 4}) is None
        else:
            with pytest.raises(UsageError, match="not below the target's 3-bit experts") as err:
                Specter.check_budget(engine, roomy, {})
            assert "\n" not in str(err.value)


@pytest.mark.parametrize("decode", [GREEDY, SAMPLED], ids=["greedy", "sample"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_speculative_strategies_are_lossless_on_every_family(host, small_prompts, tmp_path, family, decode):
    cfg = BenchConfig(models=(f"tiny-random-{family.replace('_', '-')}",), strategies=ALL,
                      budgets=(parse_budget("70%"),), profile="a100-40g-pcie4", prompts=1, tokens=8,
                      decode=decode, strategy_options={"specter": {"k": 4}, "specter-artifact": {"k": 4},
                                                     "spec-decode": {"k": 3}})
    rows = Runner(host, cfg, tmp_path).run()
    assert [r.strategy for r in rows] == list(ALL)
    for row in rows:
        assert row.status == "ok", row.error
        assert row.lossless is True
        assert row.peak_cache_bytes <= row.budget_bytes - row.extra["draft_device_bytes"]


def test_specter_records_its_depths_and_forecasts(host, small_prompts, tmp_path):
    cfg = BenchConfig(models=("tiny-random-mixtral",), strategies=("specter",), budgets=(parse_budget("70%"),),
                      profile="a100-40g-pcie4", prompts=1, tokens=12, decode=SAMPLED)
    row = Runner(host, cfg, tmp_path).run()[0]
    assert row.status == "ok", row.error
    hist = row.extra["k_hist"]
    assert sum(hist.values()) == len(row.extra["windows_predicted_vs_realised_ms"]) or sum(hist.values()) > 64
    assert all(int(k) % 2 == 0 and 0 <= int(k) <= 32 for k in hist)
    assert row.extra["predicted_window_ms_total"] > 0 and row.extra["realised_window_ms_total"] > 0


def test_specmoeoff_is_k3_int4_and_the_artifact_profiles_its_depths():
    assert SpecMoEOff().k == 3 and SpecMoEOff().spec.label() == "int4/g128"
    assert SpecterArtifact().spec.label() == "int4/g128"
    assert SpecterArtifact.k_candidates == (2, 4, 6, 8, 12, 16, 20, 24, 32)


def test_check_budget_names_the_smallest_budget_that_works():
    engine = engine_for()
    with pytest.raises(BudgetError, match=r"smallest budget that works is \d+\.\d%") as err:
        Specter.check_budget(engine, int(0.05 * engine.total_expert_bytes), {"bits": 4})
    pct = float(str(err.value).split("works is ")[1].split("%")[0])
    Specter.check_budget(engine, int(pct / 100 * engine.total_expert_bytes) + 1, {"bits": 4})
    assert "+ dense int8/channel" in str(err.value)  # Specter's default draft has its own 8-bit dense copy


def test_the_dense_copy_is_charged_with_the_draft_and_given_back_with_it():
    from specterbench.engine.dense_copy import dense_quantized_bytes, dense_spec
    from specterbench.engine.draft import quantized_bytes

    engine = engine_for()
    engine.geometry = project(engine.own_geometry, "mixtral")
    with_copy, without = Specter(), Specter(dense_bits=16)
    assert with_copy.dense_spec == dense_spec(8) and without.dense_spec is None
    assert with_copy.device_bytes(engine) == quantized_bytes(engine, with_copy.spec) + dense_quantized_bytes(
        engine, dense_spec(8))
    assert without.device_bytes(engine) == quantized_bytes(engine, without.spec)


def test_the_draft_goes_back_to_the_cache_when_plain_decoding_is_predicted_cheaper():
    engine = engine_for()
    engine.geometry = project(engine.own_geometry, "mixtral")
    strategy = Specter()
    budget = int(0.9 * engine.total_expert_bytes)
    configure_bytes(engine, strategy, budget)
    counts = torch.ones(engine.num_layers, engine.num_experts)
    for _ in range(200):  # a draft the target never agrees with
        strategy.governor.observe_acceptance(4, 0)
    strategy.maybe_release_draft(engine, RoutingCalibration(counts, ()))
    assert strategy.draft_released and strategy.k == 0
    assert engine.cache.capacity_bytes == budget
    assert strategy.metrics()["draft_released"] is True


def test_draft_noise_degrades_the_draft_and_stays_lossless(host, small_prompts, tmp_path):
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.config import BenchConfig
    from specterbench.bench.runner import Runner

    def run(noise, out):
        cfg = BenchConfig(models=("tiny-random-mixtral",), strategies=("specter",), budgets=(parse_budget("60%"),),
                          profile="a100-40g-pcie4", prompts=1, tokens=24,
                          strategy_options={"specter": {"k": 4, "draft_noise": noise}})
        (row,) = Runner(host, cfg, out).run()
        assert row.status == "ok" and row.lossless, row.error
        return row.extra["acceptance_rate"]

    assert run(0.9, tmp_path / "noisy") < run(0.0, tmp_path / "clean")


def test_a_draft_that_loses_to_plain_decoding_is_dropped_during_the_run():
    """The floor: when the windows' forecast per token is worse than plain decoding over the cache the draft's bytes
    would join, for a few windows in a row, the draft goes and the cell decodes plainly (K = 0)."""
    engine = engine_for()
    engine.geometry = project(engine.own_geometry, "mixtral")
    strategy = Specter()
    configure(engine, strategy, 0.6)
    strategy.calibration_counts = [1] * (engine.num_layers * engine.num_experts)
    for _ in range(200):  # a draft whose proposals are always rejected
        strategy.governor.observe_acceptance(8, 0)
    ks = [strategy.choose_k(100) for _ in range(Specter.RELEASE_VOTES)]
    assert strategy.draft_released and ks[-1] == 0
    assert engine.cache.capacity_bytes == int(0.6 * engine.total_expert_bytes)


def test_a_stretch_of_short_windows_does_not_drop_a_draft_that_pays():
    """The release reads the recent windows' realised time per token one standard error below its estimate: bursty
    accepted runs (1 to 29 tokens from one window) that pay on average keep the draft; a draft that loses beyond its
    noise still goes."""
    engine = engine_for()
    engine.geometry = project(engine.own_geometry, "mixtral")
    strategy = Specter()
    configure(engine, strategy, 0.6)
    strategy.calibration_counts = [1] * (engine.num_layers * engine.num_experts)
    costs = strategy.window_costs(100)
    plain = strategy.plain_without_draft_s(costs)
    window = 10 * plain  # one window's seconds, whatever it emits
    bursty = [29, 2, 3, 25, 1, 2, 27, 4]  # 93 tokens in 8 windows: 0.86 x plain per token
    strategy.recent_windows = [(window, n) for n in bursty[:5]] + [(window, n) for n in (1, 2, 2)]  # a bad stretch
    estimate = sum(s for s, _ in strategy.recent_windows) / sum(n for _, n in strategy.recent_windows)
    assert estimate * (1 + Specter.RELEASE_MARGIN) > plain  # the estimate alone would drop it
    assert not strategy.draft_loses(0.0, costs)
    strategy.recent_windows = [(window, n) for n in (8, 9, 8, 9, 8, 9, 8, 9)]  # steadily 1.18 x plain per token
    assert strategy.draft_loses(0.0, costs)


def test_specters_eviction_does_not_walk_the_cache(monkeypatch):
    """Each eviction looks at a few entries (its transients' heap, the least popular residents), not the cache."""
    from specterbench.catalog.tiny import routing_geometry_random
    from specterbench.engine.cache import Candidates

    engine = Engine(routing_geometry_random("qwen1.5-moe", hidden=32), name="qwen-geometry")  # 60 × 24 experts
    strategy = Specter(k=4, bits=3)  # the small draft: the cache keeps hundreds of experts
    configure(engine, strategy, 0.5)
    prompt = tuple(range(3, 19))
    counts = engine.start_recording()
    engine.begin_request(Request("c", prompt, 4))
    engine.decode(Request("c", prompt, 4))
    engine.stop_recording()
    strategy.prepare(engine, RoutingCalibration(counts.counts, (), (counts.counts,)))
    walked, calls = [0], [0]
    iterate, choose = Candidates.__iter__, Specter.choose_victim

    def counting_iter(self):
        for key in iterate(self):
            walked[0] += 1
            yield key

    def counting_choose(self, candidates, needed):
        calls[0] += 1
        return choose(self, candidates, needed)

    monkeypatch.setattr(Candidates, "__iter__", counting_iter)
    monkeypatch.setattr(Specter, "choose_victim", counting_choose)
    request = Request("p", prompt, 12)
    engine.begin_request(request)
    strategy.generate(engine, request)
    cached = len(engine.cache)
    assert calls[0] > 20 and cached > 250  # a cache of hundreds of experts
    assert walked[0] / calls[0] < 0.02 * cached  # a choice that listed every candidate would walk it all


def test_acceptance_by_position_conditions_on_reaching_the_position():
    from specterbench_specter.acceptance import acceptance_by_position, per_token_acceptance

    ks, accepted = [4, 4, 2, 4], [4, 1, 2, 0]
    by_pos = acceptance_by_position(ks, accepted)
    # position 1: 4 windows reached it, 3 accepted; 2: 3 reached (a >= 1), 2 accepted; 3: 2 reached (k=4, a>=2), 1
    assert by_pos == {"1": 3 / 4, "2": 2 / 3, "3": 1 / 1, "4": 1 / 1}
    # 7 accepted drafts, 2 windows stopped on a rejection
    assert per_token_acceptance(ks, accepted) == pytest.approx(7 / 9)
    assert per_token_acceptance([], []) is None


def test_speculative_rows_carry_per_position_acceptance(host, tmp_path):
    cfg = BenchConfig(models=("tiny-random-mixtral",), strategies=("spec-decode",), budgets=(parse_budget("70%"),),
                      profile="a100-40g-pcie4", prompts=1, tokens=12, decode=SAMPLED)
    row = Runner(host, cfg, tmp_path).run()[0]
    assert row.status == "ok", row.error
    by_pos = row.extra["acceptance_by_position"]
    assert by_pos and all(0.0 <= v <= 1.0 for v in by_pos.values())
    assert 0.0 <= row.extra["per_token_acceptance"] <= 1.0
    assert row.extra["mean_accepted_tokens"] is not None and row.extra["accepted_length_hist"]
