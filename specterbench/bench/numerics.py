"""Telling low-precision numerics from a strategy's divergence.

A lossless strategy must reproduce the reference's tokens. But a K+1-token verification pass (or any other
legitimate change of kernel shapes and reduction order) rounds differently from one-token decoding, and in bf16
that can flip the choice between two tokens whose scores nearly tie. Such a flip is not the strategy's fault.

The rule: at the first position where a lossless strategy's tokens differ, look up the **reference's top-2 score
margin** there (the gap between the best and second-best score the reference's sampler saw — logits for greedy,
logits / T + Gumbel noise when sampling; recorded by the reference pass). If it is below the tolerance of the
compute dtype, the row says ``numerics (margin m)`` and is not a strategy failure; otherwise it fails as before.

Tolerances (score units): a 16-bit float keeps ``p`` significant bits (bf16 8, fp16 11, fp32 24), so a logit of
magnitude up to 32 — the range language models' logits stay in — is off by at most ``2^-p · 32`` after rounding;
two such errors of opposite sign flip a gap below twice that. Hence bf16 0.25, fp16 0.03125, fp32 ≈ 3.8e-6.
Sampling divides logits by T first; the tolerance is divided by T as well (a colder temperature magnifies the
same rounding).
"""

from __future__ import annotations

import torch

LOGIT_RANGE = 32.0  # |logit| bound the tolerance is derived for
_SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24, torch.float64: 53}


def margin_tolerance(dtype: torch.dtype, temperature: float | None = None) -> float:
    """The score gap below which ``dtype`` rounding alone can flip the argmax (see the module docstring)."""
    bits = _SIGNIFICAND_BITS.get(dtype, 8)
    tol = 2 * LOGIT_RANGE * 2.0 ** -bits
    return tol / temperature if temperature else tol


def classify_divergence(margins: dict[int, float] | None, position: int, dtype: torch.dtype,
                        temperature: float | None = None) -> str | None:
    """``"numerics (margin m)"`` when the reference's margin at absolute ``position`` is below the tolerance;
    None when it is not (a real divergence) or when no margin was recorded there."""
    if not margins or position not in margins:
        return None
    m = margins[position]
    if m < margin_tolerance(dtype, temperature):
        return f"numerics (margin {m:.4g} < {margin_tolerance(dtype, temperature):.4g} for {_name(dtype)})"
    return None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
