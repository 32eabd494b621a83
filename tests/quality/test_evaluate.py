"""``specterbench eval``: the quality table of reference, strategies and the draft alone, and its failure rows."""

import argparse
import contextlib
import io
import json

import pytest

pytest.importorskip("lm_eval")

from specterbench import Strategy, hookimpl  # noqa: E402
from specterbench.cli.quality import add_parser  # noqa: E402
from specterbench.errors import UsageError  # noqa: E402
from specterbench.quality.eval_rows import SampleComparison, compare_samples  # noqa: E402
from specterbench.quality.evaluate import resolve_tasks  # noqa: E402


class Boom(Strategy):
    name = "test-boom"
    version = "1"
    description = "raises inside the engine (test plugin)"

    def before_layer(self, layer, experts, tokens_per_expert):
        raise RuntimeError("boom in before_layer")


class Liar(Strategy):
    name = "test-liar"
    version = "1"
    description = "claims to be lossless but shifts every generated token (test plugin)"

    def generate(self, engine, request):
        return [(t + 1) % 256 for t in engine.greedy_decode(request)]


class TestStrategies:
    @hookimpl
    def specterbench_register_strategies(self, register):
        register(Boom)
        register(Liar)


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    from specterbench.plugins.host import get_host, reset_host

    reset_host()
    get_host().register(TestStrategies(), "test-eval-strategies")
    out = tmp_path_factory.mktemp("eval")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["eval", "--model", "tiny-random-mixtral",
                              "--strategies", "test-boom,test-liar,lru,cpu-experts",
                              "--tasks", "shakespeare_scramble,shakespeare_complete", "--limit", "2",
                              "--drafts", "nf4/b64,int3/g128,int3/g128+d8", "--out", str(out), "--run-id", "t",
                              "--quiet"])
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = args.func(args)
    finally:
        reset_host()
    rows = [json.loads(line) for line in (out / "eval-t" / "eval.jsonl").read_text().splitlines()]
    return rc, stdout.getvalue(), stderr.getvalue(), {(r["variant"], r["task"]): r for r in rows}, out / "eval-t"


def test_eval_prints_the_quality_table_with_reference_strategy_and_draft_rows(eval_run):
    rc, stdout, _, rows, run_dir = eval_run
    for needle in ("| reference", "| lru", "| draft (nf4/b64, alone)", "acc ↑", "exact_match ↑", "Δ vs reference"):
        assert needle in stdout
    assert rows[("lru", "shakespeare_scramble")]["check"] == "identical (2 samples)"
    assert rows[("lru", "shakespeare_scramble")]["delta"] == 0.0
    nf4, int3 = rows[("draft nf4/b64", "shakespeare_scramble")], rows[("draft int3/g128", "shakespeare_scramble")]
    assert nf4["status"] == int3["status"] == "ok" and nf4["lossless"] is int3["lossless"] is False
    assert "| draft (int3/g128, alone)" in stdout  # one row per --drafts quantization, each with its bytes
    assert int3["info"]["draft_bits_per_weight"] < nf4["info"]["draft_bits_per_weight"] < 5
    assert int3["info"]["draft_device_bytes"] < nf4["info"]["draft_device_bytes"]
    whole = rows[("draft int3/g128+d8", "shakespeare_scramble")]  # Specter's default: its own int8 dense copy
    assert whole["status"] == "ok" and "| draft (int3/g128 + dense int8/channel, alone)" in stdout
    assert whole["info"]["draft_device_bytes"] > int3["info"]["draft_device_bytes"]
    assert (run_dir / "eval.md").read_text().count("| tiny-random-mixtral | reference ") == 2


def test_a_host_executing_strategy_passes_the_lossless_check_within_numerics(eval_run):
    _, _, _, rows, _ = eval_run
    for task in ("shakespeare_scramble", "shakespeare_complete"):
        row = rows[("cpu-experts", task)]
        assert row["status"] == "ok", row["error"]
        assert row["check"].startswith(("identical", "equal within numerics"))
        assert row["info"]["samples_bit_identical"] + row["info"]["samples_within_numerics"] == 2


def test_a_lossless_strategy_whose_samples_differ_fails_the_run(eval_run):
    rc, _, stderr, rows, _ = eval_run
    liar = rows[("test-liar", "shakespeare_complete")]
    assert liar["status"] == "mismatch" and liar["check"].startswith("MISMATCH 2/2 samples")
    assert rows[("test-liar", "shakespeare_scramble")]["status"] == "ok"  # scoring does not use generate()
    assert rc == 1 and "test-liar/shakespeare_complete" in stderr


def test_a_failing_strategy_is_an_error_row_and_the_others_continue(eval_run):
    _, stdout, _, rows, _ = eval_run
    boom = rows[("test-boom", "shakespeare_scramble")]
    assert boom["status"] == "error" and "RuntimeError: boom in before_layer" in boom["error"]
    assert "ERROR: RuntimeError: boom" in stdout
    assert rows[("lru", "shakespeare_complete")]["status"] == "ok"  # ran after the failure
    assert rows[("draft int3/g128", "shakespeare_complete")]["status"] == "ok"


def test_unknown_task_shows_lm_evals_error_and_the_shipped_tasks():
    with pytest.raises(UsageError) as err:
        resolve_tasks(["shakespeare_scrambel"], include_defaults=False)
    message = str(err.value)
    assert "'shakespeare_scrambel' is not a registered task" in message  # lm-eval's own words
    assert "shakespeare_scramble, shakespeare_ppl, shakespeare_complete" in message
    assert "\n" not in message


def test_the_suite_group_expands_to_the_three_shipped_tasks():
    _, _, leaves = resolve_tasks(["specterbench_suite"])
    assert leaves == ["shakespeare_scramble", "shakespeare_ppl", "shakespeare_complete"]


def test_sample_comparison_is_exact_and_counts_agreeing_decisions():
    def sample(doc_id, lls):
        return {"doc_id": doc_id, "resps": [[(ll, False)] for ll in lls], "filtered_resps": [(ll, False) for ll in lls]}

    ref = [sample(0, [-1.0, -2.0]), sample(1, [-3.0, -1.5])]
    same = compare_samples([sample(0, [-1.0, -2.0]), sample(1, [-3.0, -1.5])], ref)
    assert same == SampleComparison(total=2, bit_identical=2, beyond=0, first=None, agreement=1.0)
    nudged = [sample(0, [-1.0000001, -2.0]), sample(1, [-3.0, -1.5])]
    assert compare_samples(nudged, ref) == SampleComparison(2, 1, 1, 0, 1.0)  # exactly: a hair is a difference
    within = compare_samples(nudged, ref, tolerance=lambda s: 1e-6)
    assert (within.bit_identical, within.within_numerics, within.beyond) == (1, 1, 0)  # within numerics
    flipped = [sample(0, [-1.0, -2.0]), sample(1, [-1.0, -1.5])]
    assert compare_samples(flipped, ref, tolerance=lambda s: 1e-6) == SampleComparison(2, 1, 1, 1, 0.5)


def test_shipped_task_items_are_well_formed():
    from specterbench.quality.tasks import TASKS_DIR

    def load(name):
        return [json.loads(line) for line in (TASKS_DIR / f"{name}.jsonl").read_text().splitlines()]

    scramble, ppl, complete = load("shakespeare_scramble"), load("shakespeare_ppl"), load("shakespeare_complete")
    assert (len(scramble), len(ppl), len(complete)) == (200, 50, 100)
    for task in (scramble, ppl, complete):
        assert len({item["id"] for item in task}) == len(task)
    for item in scramble:
        original = item["choices"][item["label"]]
        assert len(item["choices"]) == 4 and len(set(item["choices"])) == 4
        for choice in item["choices"]:  # each distractor: the same words, exactly two places changed
            diff = [a != b for a, b in zip(choice.split(), original.split())]
            assert sorted(choice.split()) == sorted(original.split()) and sum(diff) in (0, 2)
    assert all(400 <= len(item["text"]) <= 800 for item in ppl)
    for item in complete:
        assert item["target"].isascii() and " " not in item["target"] and not item["context"].endswith(" ")
