"""The ``specterbench`` lm-eval model type: scores through the engine, generates through the strategy."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from specterbench.catalog.tiny import tiny_random  # noqa: E402
from specterbench.errors import UsageError  # noqa: E402
from specterbench.quality.lmeval import SpecterbenchLM  # noqa: E402
from specterbench.quality.scoring_engine import load_engine  # noqa: E402
from specterbench.quality.tasks import TASKS_DIR  # noqa: E402

CONTEXT = "BRUTUS.\nKneel not,"
CONTINUATION = " gentle Portia."


@pytest.fixture(scope="module")
def engine():
    return load_engine("tiny-random-mixtral")


def ll_request(context, continuation, idx=0):
    return Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=idx)


def gen_request(context, until=("\n",), max_gen_toks=6):
    return Instance(request_type="generate_until", doc={}, idx=0,
                    arguments=(context, {"until": list(until), "max_gen_toks": max_gen_toks}))


def test_loglikelihood_equals_a_direct_computation_from_the_model_logits(engine):
    lm = SpecterbenchLM(engine=engine, strategy="reference", progress=False)
    [(ll, greedy)] = lm.loglikelihood([ll_request(CONTEXT, CONTINUATION)])
    model, tok = tiny_random("mixtral")  # the same seeded weights, untouched by the engine
    ctx, cont = tok.encode(CONTEXT), tok.encode(CONTINUATION)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ctx + cont])).logits[0].float(), -1)  # [T, V]
    rows = logp[len(ctx) - 1:-1]  # the positions that predict the continuation
    direct = float(rows.gather(-1, torch.tensor(cont)[:, None]).sum())
    assert ll == pytest.approx(direct, abs=1e-3)
    assert greedy == bool((rows.argmax(-1) == torch.tensor(cont)).all())


def test_an_offloading_strategy_scores_bit_for_bit_like_the_reference(engine):
    requests = [ll_request(CONTEXT, CONTINUATION), ll_request("To be, or not", " to be", 1)]
    ref = SpecterbenchLM(engine=engine, strategy="reference", progress=False).loglikelihood(requests)
    lru = SpecterbenchLM(engine=engine, strategy="lru", budget="35%", progress=False)
    assert lru.loglikelihood(requests) == ref
    assert engine.stats.misses > 0  # it really went through a cache that cannot hold everything


def test_rolling_loglikelihood_scores_every_token_once_across_windows(engine):
    text = "Now is the winter of our discontent made glorious summer by this sun of York."
    whole = SpecterbenchLM(engine=engine, strategy="reference", progress=False)
    request = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    [one_window] = whole.loglikelihood_rolling([request])
    ids = whole.tok_encode(text)
    assert one_window == pytest.approx(whole.score_tokens([whole.prefix_token_id], ids)[0], abs=1e-4)
    windowed = SpecterbenchLM(engine=engine, strategy="reference", max_length=16, progress=False)
    [many_windows] = windowed.loglikelihood_rolling([request])
    assert many_windows < 0 and many_windows != one_window  # shorter contexts, same tokens scored


def test_generate_until_goes_through_the_speculative_strategy_and_matches_the_reference(engine, monkeypatch,
                                                                                      small_prompts):
    from specterbench_specter.specter import Specter

    contexts = [gen_request(CONTEXT), gen_request("What say'st thou", until=(".",), max_gen_toks=8)]
    ref = SpecterbenchLM(engine=engine, strategy="reference", progress=False).generate_until(contexts)
    calls = []
    original = Specter.generate
    monkeypatch.setattr(Specter, "generate", lambda self, e, r: calls.append(r) or original(self, e, r))
    spec = SpecterbenchLM(engine=engine, strategy="specter", budget="60%", k=3, progress=False)
    assert spec.generate_until(contexts) == ref
    assert len(calls) == 2 and spec.strategy.windows > 0  # draft-and-verify windows ran


def test_the_draft_alone_is_close_to_the_target_but_not_identical(engine):
    request = [ll_request(CONTEXT, CONTINUATION)]
    [(target, _)] = SpecterbenchLM(engine=engine, strategy="reference", progress=False).loglikelihood(request)
    draft = SpecterbenchLM(engine=engine, strategy="draft", progress=False)
    [(quantized, _)] = draft.loglikelihood(request)
    assert quantized != target and quantized == pytest.approx(target, rel=0.05)
    assert draft.get_model_info()["draft_quant"] == "nf4/b64"


def test_unknown_strategy_answers_with_did_you_mean(engine):
    with pytest.raises(UsageError, match="did you mean 'specter'"):
        SpecterbenchLM(engine=engine, strategy="spectre")


def test_a_bound_that_replays_the_reference_routing_is_refused(engine):
    with pytest.raises(UsageError, match="oracle"):
        SpecterbenchLM(engine=engine, strategy="oracle")


def test_lm_eval_command_line_runs_offline_from_any_directory_and_prints_its_table(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    cmd = [str(Path(sys.executable).with_name("specterbench-lm-eval")), "--model", "specterbench",
           "--model_args", "model=tiny-random-mixtral,strategy=lru,budget=50%,progress=false",
           "--tasks", "shakespeare_scramble", "--include_path", str(TASKS_DIR), "--device", "cpu", "--limit", "2"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "|shakespeare_scramble|" in out.stdout.replace(" ", "")
    assert "acc" in out.stdout and "specterbench" in out.stdout
