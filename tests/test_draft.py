"""The self-draft's quantizers: bytes known before quantizing, error shrinking with bits, parking between cells."""

import pytest
import torch

from specterbench.engine.draft import QuantSpec, park_unclaimed, roundtrip, shared_quantized
from specterbench.engine.engine import Engine
from specterbench.engine.models import tiny_random
from specterbench.errors import UsageError


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_int_quantizer_bytes_are_the_packed_values_plus_group_metadata(bits):
    spec = QuantSpec(bits=bits, blocksize=128, quantizer="int")
    n = 4096 * 128
    assert spec.tensor_bytes(n) == n * bits // 8 + (n // 128) * (16 + bits) // 8
    assert spec.bits_per_weight() == pytest.approx(bits + (16 + bits) / 128, abs=1e-3)


def test_int4_g128_is_the_gptq_layout():
    assert 4.125 <= QuantSpec(bits=4, blocksize=128, quantizer="int").bits_per_weight() <= 4.25


def test_error_shrinks_with_bits():
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    errors = [float((roundtrip(w, QuantSpec(bits=b, blocksize=128, quantizer="int")) - w).pow(2).mean())
              for b in (2, 3, 4, 8)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3


@pytest.mark.parametrize("options, match", [
    ({"quantizer": "gptq"}, "unknown quantizer 'gptq'; supported: bnb, int, hqq"),
    ({"quantizer": "bnb", "bits": 2}, "unsupported draft bit width 2 for quantizer 'bnb'; supported: 4, 8"),
    ({"bits": "four"}, "must be integers"),
    ({"quantizer": "int", "blocksize": 100}, "power of two from 32 to 4096"),
])
def test_bad_quantization_options_are_one_line(options, match):
    with pytest.raises(UsageError, match=match) as err:
        QuantSpec.from_options(options)
    assert "\n" not in str(err.value)


def test_parked_drafts_come_back_when_a_strategy_uses_them():
    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="mixtral", tokenizer=tok)
    spec = QuantSpec(bits=3, blocksize=32, quantizer="int")
    draft = shared_quantized(engine, spec)
    park_unclaimed(engine)
    assert shared_quantized(engine, spec) is draft  # quantized once, shared across cells


def test_dense_copy_is_swapped_in_for_one_pass_and_priced_at_its_bits():
    from specterbench.engine.clocks import ModeledClock
    from specterbench.engine.draft import QuantizedDense, dense_spec
    from specterbench.engine.profiles import BUILTIN_HOST_PROFILES, BUILTIN_PROFILES
    from specterbench.plugins.strategy import Strategy

    model, tok = tiny_random("qwen2_moe")
    engine = Engine(model, name="qwen", tokenizer=tok)
    engine.configure(Strategy(), engine.total_expert_bytes,
                     ModeledClock(BUILTIN_PROFILES[0], engine.geometry, BUILTIN_HOST_PROFILES[0]))
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    target = model.lm_head.weight
    copy = QuantizedDense(engine, dense_spec(4))
    t0 = engine.clock.now()
    full = engine.forward(ids, engine.new_kv_cache())
    t1 = engine.clock.now()
    low = engine.forward(ids, engine.new_kv_cache(), dense=copy)
    t2 = engine.clock.now()
    assert model.lm_head.weight is target  # the target's weights are back after the pass
    assert not torch.equal(full, low) and torch.allclose(full.softmax(-1), low.softmax(-1), atol=0.2)
    assert t2 - t1 < t1 - t0  # fewer weight bytes read
    assert copy.bytes_ratio == pytest.approx(dense_spec(4).bits_per_weight() / 16)
    assert 0 < copy.nbytes < engine.total_expert_bytes
    again = engine.forward(ids, engine.new_kv_cache())
    assert torch.equal(again, full)


@pytest.mark.parametrize("value", ["5", "fp8", "32"])
def test_bad_dense_bits_are_one_line(value):
    from specterbench.engine.draft import dense_spec

    with pytest.raises(UsageError, match="use one of 16, 8, 4, 3") as err:
        dense_spec(value)
    assert "\n" not in str(err.value) and f"dense_bits={value} is invalid" in str(err.value)


def test_dense_copy_bytes_are_the_real_models_share_at_a_projection():
    from specterbench.engine.draft import dense_params, dense_quantized_bytes, dense_spec
    from specterbench.engine.geometry import project

    model, tok = tiny_random("mixtral")
    engine = Engine(model, name="mixtral", tokenizer=tok)
    engine.geometry = project(engine.own_geometry, "mixtral")
    spec = dense_spec(8)
    share = dense_params(engine.geometry) * spec.bits_per_weight() / 8 / engine.geometry.all_expert_bytes
    assert dense_quantized_bytes(engine, spec) == round(share * engine.total_expert_bytes)
    assert 0.003 < share < 0.03  # Mixtral: attention and head are ~3% of the 16-bit expert bytes
    assert dense_quantized_bytes(engine, None) == 0
