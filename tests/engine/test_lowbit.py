"""Low-bit kernels cost what they cost: achieved bandwidth efficiency, dequantization work, bytes as stored."""

import pytest
import torch

from specterbench.engine.costs import CostModel
from specterbench.engine.draft import QuantSpec
from specterbench.engine.geometry import geometry_preset
from specterbench.engine.lowbit import BF16, INT3, INT4, INT4_TORCH, INT8, kernel_for, kernel_for_ratio
from specterbench.engine.profiles import default_profile
from specterbench.engine.quant_spec import pack

A100 = default_profile()
MIXTRAL = geometry_preset("mixtral")


def model():
    return CostModel(A100, MIXTRAL)


def seconds(op):
    return model().op_seconds(*op)


def test_every_kernel_names_its_sources():
    for k in (INT8, INT4, INT4_TORCH, INT3):
        assert k.sources and all(k.sources)
        assert 0 < k.bandwidth_efficiency <= 1 and k.dequant_ops_per_weight > 0


def test_a_low_bit_expert_costs_more_than_its_bytes_at_bf16_efficiency():
    spec = QuantSpec(bits=4, blocksize=128, quantizer="int")
    ratio = spec.bits_per_weight() / 16
    op = model().expert(1, ratio, kernel_for(spec))
    bytes_at_bf16 = op.nbytes / A100.mem_bytes_per_s
    assert seconds(op) > bytes_at_bf16 + A100.launch_us * 1e-6 * op.launches
    assert op.efficiency == pytest.approx(INT4.bandwidth_efficiency)


def test_three_bit_unpacking_makes_it_slower_per_byte_than_four_bit():
    """A non-power-of-two packing pays its unpacking: int3 reads fewer bytes than int4 yet is not proportionally
    faster (llama.cpp measured 3-bit decoding slower than 4-bit)."""
    s3, s4 = (QuantSpec(bits=b, blocksize=128, quantizer="int") for b in (3, 4))
    op3 = model().experts_fused([1, 1], s3.bits_per_weight() / 16, kernel_for(s3))
    op4 = model().experts_fused([1, 1], s4.bits_per_weight() / 16, kernel_for(s4))
    per_byte3, per_byte4 = seconds(op3) / op3.nbytes, seconds(op4) / op4.nbytes
    assert per_byte3 > 1.3 * per_byte4
    assert op3.alu_ops / model().alu_ops_per_s > op3.nbytes / (A100.mem_bytes_per_s * op3.efficiency)  # ALU-bound


def test_dense_copy_prices_only_its_low_bit_weights_at_the_kernel_efficiency():
    eight = QuantSpec(bits=8, blocksize=64, quantizer="int")
    op = model().dense_layer(1, 512, True, eight.bits_per_weight() / 16, kernel_for(eight))
    assert INT8.bandwidth_efficiency < op.efficiency < 1.0  # the router and the KV cache stream at bf16 efficiency


def test_sixteen_bit_ops_are_unchanged():
    op = model().expert(1)
    assert op.alu_ops == 0 and op.efficiency == 1.0
    assert seconds(op) == pytest.approx(op.launches * A100.launch_us * 1e-6 + op.nbytes / A100.mem_bytes_per_s)


def test_a_bare_ratio_is_priced_as_the_uniform_kernel_of_its_bits():
    assert kernel_for_ratio(1.0) is BF16
    assert kernel_for_ratio(3.15 / 16) is INT3
    assert kernel_for_ratio(4.5 / 16) is INT4
    assert kernel_for_ratio(8.4 / 16) is INT8
    assert kernel_for(QuantSpec(bits=4, quant_type="nf4", blocksize=64, quantizer="bnb")) is INT4_TORCH
    assert model().expert(1, 3.15 / 16) == model().expert(1, 3.15 / 16, INT3)


def test_int_groups_are_billed_as_stored_when_a_row_is_not_a_multiple_of_the_group():
    spec = QuantSpec(bits=3, blocksize=128, quantizer="int")
    # 160 columns: the packed store quantizes each row as one group of 160 (engine/packing.py), and bills that
    assert spec.groups(4 * 160, 160) == 4
    assert spec.tensor_bytes(4 * 160, 160) == spec.weight_bytes((4, 160))
    w = torch.randn(4, 160)
    packed = pack(w, spec, torch.float32, kernels=False)
    assert packed.nbytes() <= spec.weight_bytes((4, 160)) * 1.02
    err = (packed.dequantize(torch.float32) - w).abs().amax(1)
    step = (w.amax(1) - w.amin(1)) / 7  # 8 levels span each row's min..max
    assert torch.all(err <= step / 2 + 1e-3)
