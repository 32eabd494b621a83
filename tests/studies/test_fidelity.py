"""The stand-ins' tokens depend on their routed experts, their drafts err like real 4-bit drafts (with the
model's draft-fidelity calibration, applied by default), and the calibration's plumbing. CPU-only, never trains."""

from __future__ import annotations

import json

import pytest
import torch

from specterbench.catalog import corpus, embedded
from specterbench.engine.dense_copy import QuantizedDense, dense_spec, model_head_error_scale
from specterbench.engine.draft import QuantSpec, shared_quantized
from specterbench.engine.quant_spec import model_error_scale, roundtrip
from specterbench.errors import ModelError, UsageError
from specterbench.studies import fidelity
from specterbench.studies.train import reliance_loss, routed_experts_removed

INT4 = dict(bits=4, blocksize=128, quantizer="int")


@pytest.fixture(scope="module")
def shipped():
    """Each shipped stand-in (float32) with 2 held-out windows of 128 tokens."""
    out = {}
    for name in embedded.EMBEDDED_MODELS:
        model, tok = embedded.load(name)
        out[name] = (model, corpus.text_windows(tok, 2, 128))
    return out


# ---- the calibration's plumbing ------------------------------------------------------------------------------


def test_an_error_scale_makes_the_draft_err_more_in_the_same_format():
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.02
    plain = roundtrip(w, QuantSpec(**INT4))
    scaled = roundtrip(w, QuantSpec(**INT4, error_scale=8.0))
    assert (scaled - w).pow(2).mean() > 4 * (plain - w).pow(2).mean()
    # still int4/g128 codes: at most 16 distinct values per group of 128
    assert all(len(torch.unique(g)) <= 16 for g in scaled.reshape(-1, 128))


def test_error_scale_out_of_range_is_one_line():
    with pytest.raises(UsageError, match=r"error_scale=0.5 is out of range.*from 1"):
        QuantSpec(**INT4, error_scale=0.5)
    with pytest.raises(UsageError, match="error_scale must be a number"):
        QuantSpec.from_options({"error_scale": "lots"}, **INT4)


def test_a_spec_without_a_scale_takes_the_models_and_an_explicit_one_wins(shipped):
    model, _ = shipped["tiny-qwen-moe"]
    assert QuantSpec(**INT4).for_model(model).error_scale == model_error_scale(model)
    assert QuantSpec(**INT4, error_scale=1.0).for_model(model).error_scale == 1.0
    assert QuantSpec.from_options({"error_scale": "3"}, **INT4).error_scale == 3.0


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_every_shipped_stand_in_carries_a_fitted_calibration_that_load_applies(name):
    directory = embedded.model_dir(name)
    cal = embedded.load_calibration(directory)
    assert cal is not None and cal.error_scale >= 1.0 and cal.head_error_scale >= 1.0
    assert "training-text" in cal.fitted_on and cal.measured["experts"]
    model, _ = embedded.load(name)
    assert model_error_scale(model) == cal.error_scale
    assert model_head_error_scale(model) == cal.head_error_scale


def test_a_malformed_calibration_file_is_one_line(tmp_path):
    (tmp_path / embedded.CALIBRATION_FILE).write_text("{not json")
    with pytest.raises(ModelError, match="is not JSON.*--fit"):
        embedded.load_calibration(tmp_path)
    (tmp_path / embedded.CALIBRATION_FILE).write_text(json.dumps({"error_scale": 2}))
    with pytest.raises(ModelError, match="is malformed.*--fit"):
        embedded.load_calibration(tmp_path)


def test_the_engines_draft_copies_apply_the_models_calibration():
    from specterbench.engine.engine import Engine

    model, tok = embedded.load("tiny-qwen-moe")
    engine = Engine(model, name="tiny-qwen-moe", tokenizer=tok)
    draft = shared_quantized(engine, QuantSpec(**INT4))
    assert draft.spec.error_scale == model_error_scale(model) > 1.0
    assert "calibrated" in draft.spec.label()
    key = (1, 0)
    gate_up = engine.store.weights[key][0].float()
    uncalibrated = roundtrip(gate_up, QuantSpec(**INT4, error_scale=1.0))
    assert not torch.equal(draft.weights(key)[0].float(), uncalibrated.to(draft.weights(key)[0].dtype).float())
    dense = QuantizedDense(engine, dense_spec(8))
    head = model.get_output_embeddings()
    i = next(i for i, m in enumerate(dense.modules) if m is head)
    plain_head = roundtrip(head.weight.detach().float(), dense_spec(8))
    assert (dense.packed[i].dequantize(torch.float32) - head.weight.float()).abs().mean() > \
        2 * (plain_head - head.weight.float()).abs().mean()


# ---- the expert-reliance loss ----------------------------------------------------------------------------------


def test_routed_experts_removed_zeroes_them_and_restores_them(shipped):
    model, windows = shipped["tiny-mixtral"]
    x = windows[:1, :32]
    with torch.no_grad():
        before = model(input_ids=x).logits
        with routed_experts_removed(model):
            removed = model(input_ids=x).logits
        after = model(input_ids=x).logits
        reference = fidelity.without_routed_experts(model)(input_ids=x).logits
    assert torch.equal(before, after)
    assert torch.allclose(removed, reference, atol=1e-4)
    assert not torch.allclose(before, removed, atol=1e-2)


def test_the_reliance_loss_is_a_hinge_on_the_removed_paths_cross_entropy(shipped):
    model, windows = shipped["tiny-mixtral"]
    x, y = windows[:1, :-1], windows[:1, 1:]
    with torch.no_grad():
        loss, ce = reliance_loss(model, x, y, floor=100.0)
        assert float(loss) == pytest.approx(100.0 - ce, rel=1e-5)
        loss, _ = reliance_loss(model, x, y, floor=0.0)
        assert float(loss) == 0.0


# ---- the shipped stand-ins: experts matter, drafts err like real ones ------------------------------------------


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_tokens_collapse_without_the_routed_experts(shipped, name):
    model, windows = shipped[name]
    row = fidelity.agreement(model, fidelity.without_routed_experts(model), windows)
    assert row.greedy <= fidelity.REMOVED_MAX and row.sampled <= fidelity.REMOVED_MAX


@pytest.mark.parametrize("name", embedded.EMBEDDED_MODELS)
def test_the_calibrated_int4_draft_errs_like_a_real_one_and_fewer_bits_err_more(shipped, name):
    model, windows = shipped[name]
    dense = dense_spec(8)
    rows = {bits: fidelity.agreement(model, fidelity.draft_copy(
        model, QuantSpec(bits=bits, blocksize=128, quantizer="int").for_model(model), dense), windows)
        for bits in (4, 3, 2)}
    # a small sample (2 × 128 tokens): the bands of the full report (0.87–0.95, 0.88–0.95) widened by 0.04
    assert 0.83 <= rows[4].exact_set <= 0.99
    assert 0.84 <= rows[4].greedy <= 0.99
    assert rows[2].exact_set < rows[3].exact_set < rows[4].exact_set
    assert rows[2].kl_nats > rows[3].kl_nats > rows[4].kl_nats


def test_fidelity_rows_report_checks_beside_the_anchors(shipped):
    from specterbench.studies import realism, realism_tables

    model, windows = shipped["tiny-qwen-moe"]
    tok = embedded.load("tiny-qwen-moe")[1]
    rows = realism.fidelity_rows(model, tok, 64, realism.ReportSize(draft_windows=1))
    assert set(rows["drafts"]) == {"int4/g128", "int3/g128", "int2/g128"}
    assert {"removed_greedy", "removed_sampled", "int4_exact_set", "int4_greedy", "lower_bits_worse"} <= set(
        rows["checks"])
    table = realism_tables.format_fidelity({"fidelity": rows})
    assert "0.909" in table and "2511.14102" in table and "2502.10424" in table and "calibrated" in table
