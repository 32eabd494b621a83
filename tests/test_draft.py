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
