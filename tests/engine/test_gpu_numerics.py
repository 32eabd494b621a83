"""Divergence at a near-tie: numerics, not a strategy failure (the tolerance per compute dtype)."""

import pytest
import torch

from specterbench.bench.numerics import classify_divergence, margin_tolerance


def test_tolerances_follow_the_significand_of_the_compute_dtype():
    assert margin_tolerance(torch.bfloat16) == 0.25
    assert margin_tolerance(torch.float16) == 2 * 32 * 2**-11
    assert margin_tolerance(torch.float32) < 1e-5
    assert margin_tolerance(torch.bfloat16, temperature=0.5) == 0.5  # colder sampling magnifies rounding


def test_a_near_tie_in_bf16_is_numerics_with_its_margin():
    note = classify_divergence({40: 0.01, 41: 3.0}, 40, torch.bfloat16)
    assert note.startswith("numerics (margin 0.01 < 0.25 for bfloat16")


@pytest.mark.parametrize("margins, position", [({40: 3.0}, 40), ({40: 0.01}, 41), (None, 40), ({}, 40)])
def test_a_clear_choice_or_an_unknown_margin_stays_a_divergence(margins, position):
    assert classify_divergence(margins, position, torch.bfloat16) is None


def test_the_same_gap_is_a_divergence_in_fp32():
    assert classify_divergence({7: 0.01}, 7, torch.float32) is None
