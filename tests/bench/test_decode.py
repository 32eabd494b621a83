"""Decode modes through the runner: sampled decoding stays exactly checkable, and the decoded text is kept."""

import json

import pytest

from specterbench import Strategy, hookimpl
from specterbench.analysis.compare import check_compatible
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.catalog.tiny import TINY_FAMILIES
from specterbench.engine.sampling import GREEDY, DecodeSetting
from specterbench.errors import UsageError
from specterbench.runfiles.reference import adjacent_reuse, read_reference, repeated_ngram_share, workload_lines

SAMPLED = DecodeSetting.sample(temperature=1.0)


def config(**kw):
    base = dict(models=("tiny-random-mixtral",), strategies=("lru",), budgets=(parse_budget("35%"),),
                profile="a100-40g-pcie4", prompts=2, tokens=8, decode=SAMPLED)
    base.update(kw)
    return BenchConfig(**base)


class AcceptsOneWrongToken(Strategy):
    """A broken verifier: decodes like the target but accepts one token the target would not have sampled."""

    name = "accepts-one-wrong-token"
    version = "1"

    def generate(self, engine, request):
        tokens = engine.decode(request)
        tokens[3] = (tokens[3] + 1) % engine.model.config.vocab_size
        return tokens


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_sampled_baselines_reproduce_the_sampled_reference_on_every_family(host, small_prompts, tmp_path, family):
    model = f"tiny-random-{family.replace('_', '-')}"
    rows = Runner(host, config(models=(model,), strategies=("on-demand", "lru", "oracle")), tmp_path).run()
    for row in rows:
        assert row.status == "ok", row.error
        assert row.lossless is True
        assert row.decode == {"mode": "sample", "temperature": 1.0, "top_p": None, "top_k": None, "seed": 0}


def test_sampled_reference_differs_from_greedy_and_follows_the_seed(host, small_prompts, tmp_path):
    runs = {}
    for name, decode, seed in (("greedy", GREEDY, 0), ("s0", SAMPLED, 0), ("s1", SAMPLED, 1), ("s0b", SAMPLED, 0)):
        Runner(host, config(decode=decode, seed=seed), tmp_path / name).run()
        runs[name] = [e["tokens"] for e in read_reference(tmp_path / name)]
    assert runs["s0"] == runs["s0b"]
    assert runs["s0"] != runs["greedy"] and runs["s0"] != runs["s1"]


def test_a_verifier_that_accepts_a_token_the_target_would_not_sample_is_a_divergence(host, small_prompts,
                                                                                       tmp_path):
    class Plugin:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(AcceptsOneWrongToken)

    host.register(Plugin(), "wrong-verifier-plugin")
    row = Runner(host, config(strategies=(AcceptsOneWrongToken.name,)), tmp_path).run()[0]
    assert row.status == "diverged" and row.lossless is False
    assert row.first_divergence["position"] == 3


def test_the_run_keeps_the_reference_tokens_and_text_and_prints_a_workload_line(host, small_prompts, tmp_path):
    Runner(host, config(), tmp_path).run()
    entries = read_reference(tmp_path)
    assert len(entries) == 2 and all(len(e["tokens"]) == 8 and isinstance(e["text"], str) for e in entries)
    assert entries[0]["decode_label"] == SAMPLED.label == "sample T=1 seed=0"
    (line,) = workload_lines(tmp_path)
    assert f"decode {SAMPLED.label}" in line and "repeated 8-grams" in line and "expert reuse" in line
    Runner(host, config(), tmp_path, resume=True).run()  # a resumed run does not write the reference twice
    assert len(read_reference(tmp_path)) == 2


def test_repeated_ngrams_and_adjacent_reuse_by_hand():
    loop = [1, 2, 3] * 6  # 18 tokens, 11 8-grams, of which the last 8 repeat an earlier one
    assert repeated_ngram_share([loop]) == pytest.approx(8 / 11)
    assert repeated_ngram_share([list(range(20))]) == 0.0
    trace = [(0, (0, 1, 2, 3)), (0, (0, 1)), (0, (1, 2)), (0, (2, 3))]  # prefill (4 experts > k), 3 decode steps
    assert adjacent_reuse(trace, top_k=2) == pytest.approx((1 + 1) / 4)


def test_compare_refuses_to_mix_decode_settings(host, small_prompts, tmp_path):
    a = Runner(host, config(decode=GREEDY), tmp_path / "a").run()
    b = Runner(host, config(), tmp_path / "b").run()
    with pytest.raises(UsageError, match="decode setting"):
        check_compatible(a, b)


def test_the_noise_follows_the_run_seed():
    assert config(seed=7).decode.seed == 7
    assert json.loads(json.dumps(config().decode.to_dict()))["mode"] == "sample"
