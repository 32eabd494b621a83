"""Lossless within numerics: the tolerance follows the dtype and the depth, a near-tie is numerics, a real error
(a wrong expert, a dropped token) is far outside it, and the host path's last-bit differences are inside it."""

import math

import pytest
import torch
import torch.nn.functional as F

from specterbench.catalog.tiny import tiny_random
from specterbench.engine.engine import Engine
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.numerics import (
    NumericsGuide,
    classify_divergence,
    loglik_tolerance,
    margin_tolerance,
    score_tolerance,
)
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.engine.sampling import DecodeSetting
from specterbench.strategy import ON_HOST, SUBSTITUTE, Strategy


def test_the_tolerance_follows_the_significand_of_the_dtype_and_the_square_root_of_the_depth():
    assert score_tolerance(torch.bfloat16, 8) == pytest.approx(32 * 2**-8 * 4)
    assert score_tolerance(torch.float32, 8) == pytest.approx(32 * 2**-24 * 4)
    assert margin_tolerance(torch.float16, 2) == pytest.approx(2 * 32 * 2**-11 * 2)
    assert margin_tolerance(torch.bfloat16, 8, temperature=0.5) == pytest.approx(
        2 * margin_tolerance(torch.bfloat16, 8))
    assert loglik_tolerance(torch.float32, 8, 10) == pytest.approx(10 * margin_tolerance(torch.float32, 8))


def test_a_near_tie_is_numerics_and_a_clear_choice_or_an_unknown_margin_is_not():
    note = classify_divergence({40: 0.01, 41: 3.0}, 40, torch.bfloat16, 6)
    assert note.startswith("numerics (margin 0.01 < ") and "bfloat16, 6 layers" in note
    assert classify_divergence({40: 3.0}, 40, torch.bfloat16, 6) is None
    assert classify_divergence({40: 0.01}, 41, torch.bfloat16, 6) is None
    assert classify_divergence(None, 40, torch.bfloat16, 6) is None
    assert classify_divergence({7: 0.01}, 7, torch.float32, 6) is None  # the same gap in float32 is a divergence


def test_a_guided_sampler_takes_the_reference_token_at_a_near_tie_and_only_there():
    guide = NumericsGuide(tokens={5: 11, 6: 12}, margins={5: 1e-9, 6: 2.0}, tolerance=1e-6)
    sampler = DecodeSetting().sampler("r", guide=guide)
    logits = torch.zeros(2, 16)
    logits[0, 3] = logits[1, 4] = 1.0  # own choices 3 and 4
    assert sampler.pick_many(logits, 5) == [11, 4]  # position 5 a near-tie in the reference: its token; 6 not
    assert guide.followed == [5]


class AllResident(Strategy):
    name = "all-resident"
    version = "1"

    def min_cache_bytes(self, engine):
        return engine.total_expert_bytes


class AllOnHost(Strategy):
    name = "all-on-host"
    version = "1"

    def place_miss(self, key, n_tokens):
        return ON_HOST


class WrongExpert(Strategy):
    """Computes every missed expert with the next expert's weights: a real error."""

    name = "wrong-expert"
    version = "1"

    def place_miss(self, key, n_tokens):
        return SUBSTITUTE

    def substitute(self, key):
        layer, e = key
        other = self.engine.store.weights[(layer, (e + 1) % self.engine.num_experts)]
        return tuple(w.to(self.engine.compute_dtype) for w in other), 1.0


@pytest.fixture(scope="module")
def engine():
    model, _ = tiny_random("mixtral")
    return Engine(model, name="tiny-random-mixtral")


def loglik(engine, strategy, ids, resident: bool) -> float:
    clock = ModeledClock(default_profile(), engine.geometry, default_host_profile())
    engine.configure(strategy, engine.total_expert_bytes if resident else engine.min_budget_bytes(), clock)
    if resident:
        for key in engine.store.weights:
            engine.prefetch(key)
    logits = engine.forward(torch.tensor([ids]), engine.new_kv_cache(), all_logits=True).float()  # [T, V]
    return float(F.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None]).sum())


def test_real_errors_fail_the_check_where_the_host_path_passes(engine):
    ids = list(range(3, 43))
    layers = int(engine.model.config.num_hidden_layers)
    tol = loglik_tolerance(engine.compute_dtype, layers, len(ids) - 1)
    reference = loglik(engine, AllResident(), ids, resident=True)
    host = loglik(engine, AllOnHost(), ids, resident=False)
    wrong = loglik(engine, WrongExpert(), ids, resident=False)
    dropped = loglik(engine, AllResident(), ids[:20] + ids[21:], resident=True)
    assert abs(host - reference) <= tol  # another kernel's summation order: inside
    assert abs(wrong - reference) > 10 * tol  # a wrong expert: far outside
    assert abs(dropped - reference) > 10 * tol  # a dropped token: far outside
    assert math.isfinite(reference)
