"""spec-small: a separate dense draft (tiny-draft on the stand-ins) proposes, the target verifies; the output is the
target's, the draft's weights and KV cache are charged to the budget, and its acceptance is reported per position."""

import math

import pytest
import torch

from specterbench import Request
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.catalog import drafts, embedded
from specterbench.catalog.tiny import tiny_random
from specterbench.cli import main
from specterbench.engine.engine import Engine
from specterbench.engine.geometry import geometry_from_config, project
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import default_host_profile, default_profile
from specterbench.engine.sampling import GREEDY, DecodeSetting
from specterbench.errors import BudgetError, ModelError, UsageError
from specterbench.runfiles.results import read_rows
from specterbench_specter import SpecSmall

PROMPT = "Shall I compare thee to a summer's day? Thou art more lovely"
#: tiny-draft's weights (2,361,024 bf16 parameters) and its KV cache (256 positions x 4 layers x K and V x 2 heads x 32)
TINY_DRAFT_BYTES = 2_361_024 * 2 + 256 * 4 * 2 * 2 * 32 * 2


@pytest.fixture(scope="module")
def stand_in():
    model, tok = embedded.load("tiny-mixtral")
    return Engine(model, name="tiny-mixtral", tokenizer=tok)


def run_cell(host, tmp_path, decode, geometry=None, budget="50%"):
    config = BenchConfig(models=("tiny-mixtral",), strategies=("spec-small",), budgets=(parse_budget(budget),),
                         profile="a100-40g-pcie4", tokens=16, prompts=2, decode=decode, geometry=geometry)
    Runner(host, config, tmp_path).run()
    (row,) = read_rows(tmp_path)
    assert row.status == "ok" and row.lossless, row.error
    return row


def test_greedy_output_is_the_targets_and_the_draft_is_accepted_per_position(host, small_prompts, tmp_path):
    row = run_cell(host, tmp_path, GREEDY)
    m = row.extra
    assert m["draft"] == "tiny-draft" and m["draft_params"] == 2_361_024
    assert m["draft_device_bytes"] == TINY_DRAFT_BYTES == row.strategy_device_bytes
    assert row.peak_cache_bytes <= row.budget_bytes - TINY_DRAFT_BYTES  # the expert cache shrank by the draft
    by_position = m["acceptance_by_position"]
    assert set(by_position) >= {"1", "2"} and all(0 <= v <= 1 for v in by_position.values())
    # trained on the target's corpus with its tokenizer, the draft agrees with it often, not always
    assert 0.2 < by_position["1"] and 0.2 < m["per_token_acceptance"] < 1
    assert 0 < m["draft_time_share"] < 1


def test_sampled_output_is_the_targets_under_a_projection(host, small_prompts, tmp_path):
    row = run_cell(host, tmp_path, DecodeSetting("sample", temperature=1.0), geometry="auto")
    m = row.extra
    assert m["draft_priced_as"].startswith("mixtral-draft: dense, 24 layers, hidden 1024")
    assert 0.45e9 < m["draft_priced_params"] < 0.55e9  # the stated ~0.5B dense draft of Mixtral's family
    # the priced draft's share of the projected model's expert bytes, charged in the stand-in's
    engine_total = 6 * 8 * 3 * 256 * 160 * 2
    own = geometry_from_config(embedded.load("tiny-mixtral")[0].config, "tiny-mixtral", 6)
    priced_total = project(own, "mixtral").all_expert_bytes
    priced = m["draft_priced_params"] * 2 + 256 * 24 * 2 * 4 * 64 * 2
    assert m["draft_device_bytes"] == math.ceil(priced * engine_total / priced_total)
    assert "1" in m["acceptance_by_position"]


def test_the_draft_cache_holds_what_the_target_kept(stand_in):
    """After each window the draft's KV cache holds only positions the target kept, so its next proposal reads the
    same prefix a fresh draft would."""
    engine = stand_in
    strategy = SpecSmall(k=4)
    engine.configure(strategy, int(0.6 * engine.total_expert_bytes),
                     ModeledClock(default_profile(), engine.geometry, default_host_profile()))
    strategy.prepare(engine)
    ids = engine.tokenizer.encode(PROMPT)
    request = Request("a", ids, 12, decode=GREEDY)
    engine.begin_request(request)
    out = strategy.generate(engine, request)
    seq = ids + out
    assert strategy.dkv_len == strategy.dkv.get_seq_length() < len(seq)
    with torch.inference_mode():
        cached = strategy.draft_model(input_ids=torch.tensor([seq[strategy.dkv_len:]]),
                                      past_key_values=strategy.dkv, use_cache=True).logits[0, -1]
        fresh = strategy.draft_model(input_ids=torch.tensor([seq])).logits[0, -1]
    assert torch.allclose(cached, fresh, atol=1e-4)


def test_a_budget_below_the_draft_is_refused_in_one_line(stand_in):
    need = TINY_DRAFT_BYTES + stand_in.min_budget_bytes()
    SpecSmall.check_budget(stand_in, need, {})
    with pytest.raises(BudgetError, match=r"cannot hold spec-small's draft tiny-draft \(4984192 bytes.*smallest "
                                          r"budget that works is 46\.5%") as err:
        SpecSmall.check_budget(stand_in, need - 1, {})
    assert "\n" not in str(err.value)


def test_a_target_with_another_tokenizer_is_refused():
    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="tiny-random-mixtral", tokenizer=tok)
    with pytest.raises(ModelError, match="tokenizer is not draft tiny-draft's"):
        SpecSmall.check_budget(engine, engine.total_expert_bytes, {"draft": "tiny-draft"})
    SpecSmall.check_budget(engine, engine.total_expert_bytes, {})  # auto: the random draft shares its bytes
    assert drafts.same_tokenizer(drafts.load("tiny-draft")[1], embedded.load("tiny-deepseek")[1])


@pytest.mark.parametrize("options, message", [
    ({"k": 0}, "option k=0 is invalid"),
    ({"k": "abc"}, "option k='abc' is invalid"),
    ({"k": 33}, "option k=33 is invalid"),
    ({"host": "yes"}, "option host='yes' is invalid"),
    ({"draft": "gpt2"}, "option draft='gpt2' is invalid"),
    ({"bits": 4}, "has no option(s) bits"),
])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SpecSmall.validate_options(options)


def test_the_cli_refuses_a_bad_option_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--model", "tiny-random-mixtral", "--strategies", "spec-small", "--set", "spec-small.k=0",
                 "--tokens", "4", "--prompts", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "option k=0 is invalid" in err and "\n" not in err
    assert not out.exists() or not any(out.iterdir())  # no run folder left behind
