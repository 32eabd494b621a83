"""Prompt length and context depth as axes: prompts of exactly the asked length cut from the held-out text, the
context prefilled outside the timing, attention and KV reads priced by context length, and bad values refused in
one line."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from cli_errors import one_line

from specterbench.bench.prompts import Shape, shaped_prompts
from specterbench.cli import main
from specterbench.engine.costs import CostModel
from specterbench.engine.geometry import geometry_preset
from specterbench.runfiles.results import read_rows

MODEL = "tiny-random-mixtral"  # 512 positions


def call(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_prompts_are_cut_to_exactly_the_asked_length_repeating_the_text_as_needed(engine):
    texts = [("a", "Now is the winter of our discontent"), ("b", "made glorious summer by this sun of York")]
    prompts = shaped_prompts(engine.tokenizer, texts, 3, Shape(length=300, depth=100))
    assert [len(ids) for _, ids in prompts] == [400, 400, 400]  # far more than the two lines hold
    assert len({ids for _, ids in prompts}) == 3 and prompts[0][0] == "p300-d100-0"


def test_a_run_decodes_prompts_of_the_asked_length_after_the_asked_depth(host, capsys, tmp_path):
    code, out, err = call(capsys, "run", "--model", MODEL, "--strategies", "lru", "--budgets", "50%", "--prompts", 2,
                          "--tokens", 3, "--prompt-tokens", "24,40", "--depth", "0,16", "--out", tmp_path,
                          "--run-id", "r", "--quiet", "--output", "csv")
    assert code == 0, err
    rows = read_rows(tmp_path / "r")
    assert sorted((r.prompt_tokens, r.depth_tokens) for r in rows) == [(24, 0), (24, 16), (40, 0), (40, 16)]
    assert all(r.samples["prompt_tokens"] == [r.prompt_tokens] * 2 and r.lossless for r in rows)
    ref = [json.loads(line) for line in (tmp_path / "r" / "reference.jsonl").read_text().splitlines()]
    assert sorted({len(r["prompt_ids"]) for r in ref}) == [24, 40, 56]  # context + prompt, as the model saw them
    tests = set(pd.read_csv(io.StringIO(out))["test"])
    assert tests == {"pp24", "pp40", "pp24 @ d16", "pp40 @ d16", "tg3", "tg3 @ d16"}


def test_the_kv_read_of_a_decoded_token_grows_with_its_context():
    g = geometry_preset("mixtral")
    from specterbench.plugins.host import get_host

    costs = CostModel(get_host().profiles().get("a100-40g-pcie4"), g)
    shallow, deep = costs.dense_layer(1, 1, moe=True), costs.dense_layer(1, 4097, moe=True)
    kv = 2 * 4096 * g.kv_heads * g.head_dim * g.dtype_bytes * g.layer_scale  # K and V of every position, one layer
    assert deep.nbytes - shallow.nbytes == pytest.approx(kv)
    assert deep.flops - shallow.flops == pytest.approx(4 * 4096 * g.heads * g.head_dim * g.layer_scale)


def test_decode_at_depth_pays_the_kv_read_per_token_and_ttft_leaves_the_context_out(host, capsys, tmp_path):
    depth = 64
    code, _, err = call(capsys, "run", "--model", MODEL, "--geometry", "mixtral", "--strategies", "resident",
                        "--prompts", 2, "--tokens", 4, "--prompt-tokens", "16,80", "--depth", f"0,{depth}",
                        "--out", tmp_path, "--run-id", "r", "--quiet")
    assert code == 0, err
    rows = {(r.prompt_tokens, r.depth_tokens): r for r in read_rows(tmp_path / "r")}
    g, profile = geometry_preset("mixtral"), host.profiles().get("a100-40g-pcie4")
    kv_per_token_s = 2 * g.layers * g.kv_heads * g.head_dim * g.dtype_bytes * depth / profile.mem_bytes_per_s
    # every decoded token reads `depth` more positions of K and V in every layer, on the device's memory
    assert rows[16, depth].tpot_mean_ms - rows[16, 0].tpot_mean_ms == pytest.approx(kv_per_token_s * 1e3, rel=1e-3)
    # the 16-token prompt at depth 64 is timed without its context: faster than an 80-token prompt from scratch
    assert rows[16, depth].ttft_ms < rows[80, 0].ttft_ms


@pytest.mark.parametrize("args, message", [
    (["--depth", "500", "--prompt-tokens", "16"], "needs 519 positions, beyond tiny-random-mixtral's context of 512; "
                                                  "use --depth 493 or less"),
    (["--prompt-tokens", "600"], "use --prompt-tokens 509 or less, or run a checkpoint with a longer context "
                                 "(--model-path; `specterbench random-checkpoint DIR --family mixtral --set "
                                 "max_position_embeddings=603`"),
    (["--prompt-tokens", "abc"], "--prompt-tokens 'abc' is not a number of tokens"),
    (["--depth", "-4"], "--depth '-4' is not a number of tokens"),
])
def test_a_length_beyond_the_context_or_not_a_number_is_one_line(host, capsys, tmp_path, args, message):
    code, _, err = call(capsys, "run", "--model", MODEL, "--strategies", "lru", "--budgets", "50%", "--prompts", 1,
                        "--tokens", 3, "--out", tmp_path, "--run-id", "x", "--quiet", *args)
    assert code == 2 and message in one_line(err)
    assert not (tmp_path / "x").exists()


def test_make_bench_passes_prompt_tokens_depth_and_output():
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    line = subprocess.run(["make", "-n", "bench", "PROMPT_TOKENS=512,2048", "DEPTH=0,4096", "OUTPUT=csv"], cwd=root,
                          capture_output=True, text=True, timeout=60).stdout
    assert "--prompt-tokens 512,2048 --depth 0,4096 --output csv" in line
    plain = subprocess.run(["make", "-n", "bench"], cwd=root, capture_output=True, text=True, timeout=60).stdout
    assert "--prompt-tokens" not in plain and "--depth" not in plain and "--output md" in plain


@pytest.mark.slow
def test_every_built_in_strategy_decodes_after_a_context_and_stays_lossless(host, capsys, tmp_path):
    code, _, err = call(capsys, "run", "--model", MODEL, "--strategies", "all", "--budgets", "50%", "--prompts", 1,
                        "--tokens", 4, "--prompt-tokens", 16, "--depth", 16, "--out", tmp_path, "--run-id", "r",
                        "--quiet")
    assert code == 0, err
    rows = read_rows(tmp_path / "r")
    assert all(r.status == "ok" and r.depth_tokens == 16 for r in rows), [r.error for r in rows if r.error]
    assert all(r.lossless for r in rows if r.lossless_strategy)
