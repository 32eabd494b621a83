"""Speculative windows of several requests verified together: each request's tokens equal its own batch-1 decode,
greedy and sampled, every token it accepted kept, and the work done twice or for nothing counted."""

import pytest
import torch

from specterbench import Request, Strategy
from specterbench.catalog.tiny import tiny_random
from specterbench.engine.batch import begin_batch, per_request_samples
from specterbench.engine.engine import Engine
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.engine.sampling import GREEDY, DecodeSetting
from specterbench_specter import SpecDecode, SpecHost, SpecMoEOff, SpecNgram, Specter

SAMPLED = DecodeSetting.sample(temperature=1.0)


def engine_for():
    model, tok = tiny_random("mixtral")
    return Engine(model, name="mixtral", tokenizer=tok)


def configure(engine, strategy, fraction=0.8):
    engine.configure(strategy, int(fraction * engine.total_expert_bytes),
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))


def requests_for(decode, n=4, tokens=10):
    prompts = [tuple(torch.randint(0, 200, (6,), generator=torch.Generator().manual_seed(i)).tolist())
               for i in range(n)]
    return [Request(f"p{i}", ids, tokens, decode=decode) for i, ids in enumerate(prompts)]


def alone(requests):
    engine = engine_for()
    configure(engine, Strategy(), 1.0)
    out = []
    for r in requests:
        engine.begin_request(r)
        out.append(engine.decode(r))
    return out


@pytest.mark.parametrize("decode", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("make", [lambda: Specter(k=3), lambda: SpecHost(k=4), lambda: SpecDecode(k=3),
                                  lambda: SpecMoEOff(), lambda: SpecNgram(k=4),
                                  lambda: SpecDecode(k=3, draft_noise=0.5)],
                         ids=["specter", "spec-host", "spec-decode", "specmoeoff", "spec-ngram", "noisy-draft"])
def test_each_request_of_a_batch_gets_its_own_batch_1_tokens(make, decode):
    requests = requests_for(decode)
    engine = engine_for()
    strategy = make()
    configure(engine, strategy)
    begin_batch(engine, requests)
    assert strategy.generate_batch(engine, requests) == alone(requests)
    m = strategy.metrics()
    assert set(m["acceptance_per_request"]) <= {r.id for r in requests}
    assert m["batch_verify_positions"] >= m["batch_reverified_positions"] + m["batch_filler_positions"]


def test_ragged_acceptance_keeps_every_accepted_token_and_counts_the_reverified_ones():
    """A draft that agrees with the target for one request and never for another: the first accepts whole
    windows, the cache is cropped to the second's length, and the first's accepted tokens come back as pending
    tokens of the next window — verified again, counted, never lost (its tokens arrive faster than one a window)."""
    requests = requests_for(GREEDY, n=2, tokens=12)
    engine = engine_for()
    strategy = SpecDecode(k=3)
    configure(engine, strategy, 1.0)
    good = alone(requests)[0]
    propose = strategy.propose_batch

    def one_good_one_wrong(engine, reqs, samplers, rows, L, T, kv, k):
        made = propose(engine, reqs, samplers, rows, L, T, kv, k)
        pos = L + len(rows[0]) - made[0]  # the position of request 0's first proposal
        rows[0][len(rows[0]) - made[0]:] = [good[p - 6] if p - 6 < len(good) else 0 for p in range(pos, pos + made[0])]
        rows[1][len(rows[1]) - made[1]:] = [(t + 1) % 200 for t in rows[1][len(rows[1]) - made[1]:]]
        return made

    strategy.propose_batch = one_good_one_wrong
    begin_batch(engine, requests)
    out = strategy.generate_batch(engine, requests)
    assert out == alone(requests)
    m = strategy.metrics()
    assert m["acceptance_per_request"]["p1"] == 0.0 and m["acceptance_per_request"]["p0"] > 0.5
    assert m["batch_reverified_positions"] > 0
    mine = per_request_samples(engine.samples, 2)
    assert sum(s.tokens for s in mine[0]) == sum(s.tokens for s in mine[1]) == 12
    assert len(mine[0]) < len(mine[1])  # request 0 finished in fewer steps; its samples end there


def test_k0_with_ragged_pending_tokens_fills_the_rows_and_stays_lossless():
    requests = requests_for(SAMPLED, n=3, tokens=8)
    engine = engine_for()
    strategy = SpecDecode(k=3)
    configure(engine, strategy, 1.0)
    ks = iter([3, 0, 0, 3, 0])
    strategy.choose_k = lambda remaining: min(next(ks, 0), remaining)
    begin_batch(engine, requests)
    assert strategy.generate_batch(engine, requests) == alone(requests)


@pytest.fixture
def four_prompts(monkeypatch):
    """Four short prompts (the shared fixture has three; a batch of 4 needs more)."""
    from specterbench.bench import runner
    from specterbench.testing.pytest_plugin import SMALL_PROMPTS

    texts = [(f"q{j}", f"{text} {j}") for j, (_, text) in enumerate(SMALL_PROMPTS * 2)][:4]
    monkeypatch.setattr(runner, "load_prompts", lambda name, n: texts[:n])


@pytest.mark.parametrize("decode", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_runner_checks_every_speculative_strategy_at_batch_4_against_its_batch_1_reference(
        host, four_prompts, tmp_path, decode):
    from specterbench.bench.budget import parse_budget
    from specterbench.bench.config import BenchConfig
    from specterbench.bench.runner import Runner

    names = ("specter", "spec-host", "spec-decode", "specmoeoff", "spec-ngram", "spec-small")
    cfg = BenchConfig(models=("tiny-random-mixtral",), strategies=names, budgets=(parse_budget("90%"),),
                      profile="a100-40g-pcie4", prompts=4, tokens=6, batches=(4,), decode=decode,
                      strategy_options={"specter": {"k": 3}, "spec-host": {"k": 2}})
    rows = {r.strategy: r for r in Runner(host, cfg, tmp_path).run()}
    assert rows["spec-small"].status == "unsupported"  # its draft model's KV is one request's
    for name in names[:-1]:
        row = rows[name]
        assert (row.status, row.lossless, row.batch) == ("ok", True, 4), (name, row.error)
        assert row.extra["numerics"] == "bit-identical", name
        assert row.extra["batch_verify_positions"] > 0 and row.tokens_per_s_total > row.tokens_per_s_per_user


def test_a_batched_cell_seeds_its_governor_with_batched_windows():
    """``engine.cell_batch`` = 4 before ``prepare``: the seed decodes calibration prompts four at a time, so the
    governor's batch-4 fit holds batched windows (their draft steps, unions over 4·T positions) and the seed's
    windows count every request's tokens; the batch-1 fit is left at its priors. The batch then decodes losslessly."""
    from specterbench.strategy import RoutingCalibration

    engine = engine_for()
    strategy = Specter()
    configure(engine, strategy)
    prompts = tuple(r.prompt_ids + (7,) * i for i, r in enumerate(requests_for(GREEDY, n=3)))  # 6 to 8 tokens
    calibration = RoutingCalibration(torch.ones(engine.num_layers, engine.num_experts), prompts, decode=GREEDY)
    engine.cell_batch = 4
    strategy.prepare(engine, calibration)
    g = strategy.governor
    assert strategy.cell_batch == 4 and g.batch == 1  # back to batch 1 between batches
    fit = g.fits[4]
    assert fit.draft_step_s is not None and fit.gamma_n > 1 and fit.ratio
    assert 1 not in g.fits or (g.fits[1].gamma_n, g.fits[1].draft_step_s) == (1.0, None)
    assert max(n for _, _, n in strategy.seed_windows) > 4  # a window's tokens over the four requests
    assert strategy.plain_seen[0] > 0 and strategy.plain_seen[1] > 0  # its first window, plain, against its model
    requests = requests_for(SAMPLED)
    begin_batch(engine, requests)
    assert strategy.generate_batch(engine, requests) == alone(requests)


def test_a_plain_batched_step_needs_the_union_of_its_tokens_experts():
    """Uniform routing over E experts, top-k: B tokens need E·(1 − (1 − k/E)^B) experts a layer, and with R of the
    L·E experts resident a share 1 − R/(L·E) of them misses; more tokens, more of the layer."""
    from specterbench.strategy import RoutingCalibration

    engine = engine_for()
    strategy = Specter()
    configure(engine, strategy)
    L, E, k = engine.num_layers, engine.num_experts, engine.top_k
    strategy.calibration = RoutingCalibration(torch.ones(L, E), ((1, 2, 3),))
    for b in (1, 4, 16):
        uncovered, union = strategy.batch_cover(L * E // 2, b)
        assert union == pytest.approx(E * (1 - (1 - k / E) ** b))
        assert uncovered == pytest.approx(0.5)
    assert strategy.batch_cover(0, 4)[0] == pytest.approx(1.0)
