import pytest
import torch

from specterbench.engine.sampling import DecodeSetting, TokenSampler, gumbel_noise
from specterbench.errors import UsageError


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, -1.0])
    assert DecodeSetting().sampler("r").pick(logits, 5) == 1


def test_noise_depends_only_on_seed_request_and_position():
    a = gumbel_noise(0, "r1", 7, 50)
    assert torch.equal(a, gumbel_noise(0, "r1", 7, 50))
    assert not torch.equal(a, gumbel_noise(0, "r1", 8, 50))
    assert not torch.equal(a, gumbel_noise(0, "r2", 7, 50))
    assert not torch.equal(a, gumbel_noise(1, "r1", 7, 50))


def test_sampled_tokens_follow_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    sampler = DecodeSetting.sample(temperature=1.0).sampler("dist")
    n = 4000
    counts = torch.bincount(torch.tensor([sampler.pick(logits, p) for p in range(n)]), minlength=4).double()
    expected = torch.softmax(logits.double(), -1) * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001


def test_pick_many_equals_pick_per_position():
    s = DecodeSetting.sample(temperature=0.7, seed=3)
    logits = torch.randn(10, 100)
    assert s.sampler("q").pick_many(logits, 20) == [s.sampler("q").pick(r, 20 + i) for i, r in enumerate(logits)]


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([5.0, 4.0, 0.0, -3.0, -4.0])
    top_k = DecodeSetting.sample(temperature=5.0, top_k=2).sampler("k")
    assert {top_k.pick(logits, p) for p in range(300)} <= {0, 1}
    top_p = DecodeSetting.sample(temperature=1.0, top_p=0.5).sampler("p")
    assert {top_p.pick(logits, p) for p in range(300)} == {0}  # token 0 alone holds > 50%


@pytest.mark.parametrize("kwargs, words", [
    (dict(mode="beam"), "unknown decode mode"),
    (dict(mode="sample", temperature=0.0), "(0, 5]"),
    (dict(mode="sample", temperature=5.5), "(0, 5]"),
    (dict(mode="sample", top_p=0.0), "(0, 1]"),
    (dict(mode="sample", top_p=1.5), "(0, 1]"),
    (dict(mode="sample", top_k=0), ">= 1"),
])
def test_bad_settings_name_the_accepted_range(kwargs, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace("]", r"\]")):
        DecodeSetting(**kwargs)


def test_round_trip_and_label():
    s = DecodeSetting.sample(temperature=0.7, top_p=0.9, seed=2)
    assert DecodeSetting.from_dict(s.to_dict()) == s
    assert DecodeSetting.from_dict(None) == DecodeSetting()
    assert s.label == "sample T=0.7 p=0.9 seed=2"
    assert isinstance(s.sampler("x"), TokenSampler)
