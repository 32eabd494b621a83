"""What "lossless" means on real hardware: outputs equal to the reference within the numerics the dtype allows.

A lossless strategy computes the same function as the reference, but not always with the same kernels: an expert on
the host CPU (F.linear) against the device's grouped or gathered GEMM, a K+1-token verification against one-token
decoding. Each reorders floating-point sums, and the results differ in the last bits. On the CPU of the test machine,
device and host are the same processor and the same threads; the difference is the kernel's summation order alone
(a gathered batched matmul against a per-expert GEMM, in float32: about 1e-7 relative per output).

The tolerance, per score (a logit, or a log-probability, in nats):

    tau(dtype, L) = LOGIT_RANGE * u * sqrt(2 L)

``u = 2^-p`` is the unit roundoff of the compute dtype (``p`` significand bits: bfloat16 8, float16 11, float32 24);
each of the 2L sublayers of an L-layer model (attention and MLP or MoE) may round its output differently, a
relative error of order ``u`` in the residual stream; independent roundings add as a random walk (``sqrt(2L)``);
a logit of magnitude up to ``LOGIT_RANGE`` inherits that relative error. Then:

- a **token** may differ from the reference's only where the reference's top-2 score margin is below ``2 tau``
  (two scores rounded in opposite directions): that position is "equal within numerics", and decoding continues
  from the reference's token (:class:`NumericsGuide`), so later positions stay comparable;
- a **log-likelihood** of ``n`` scored tokens may differ by at most ``2 tau n`` (each token's log-softmax: its own
  score and the normaliser) — unless the reference's routing was itself a near-tie: a router whose k-th and
  (k+1)-th logits are closer than ``2 tau`` may pick another expert after any rounding, and from there the outputs
  are those of a different (equally valid) mixture. Such a request is "within numerics (a routing near-tie)", counted
  apart, not held to the smooth bound.

Sampling divides logits by the temperature T first; the score tolerance is divided by T as well. A difference
above these is a real error (a wrong expert, a dropped token): ``tests/engine/test_numerics.py`` shows both fail.
The bound is honest but coarse in 16-bit dtypes: in bfloat16 at 32 layers, ``2 tau`` is 2.0 nats, so a
low-precision check cannot tell errors smaller than that from rounding; bit-identity is reported beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

LOGIT_RANGE = 32.0  # |logit| bound the tolerance is derived for
SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24, torch.float64: 53}


def unit_roundoff(dtype: torch.dtype) -> float:
    return 2.0 ** -SIGNIFICAND_BITS.get(dtype, 8)


def score_tolerance(dtype: torch.dtype, layers: int, temperature: float | None = None) -> float:
    """``tau``: how far one score may move by rounding alone (module docstring)."""
    tau = LOGIT_RANGE * unit_roundoff(dtype) * math.sqrt(2 * max(1, int(layers)))
    return tau / temperature if temperature else tau


def margin_tolerance(dtype: torch.dtype, layers: int, temperature: float | None = None) -> float:
    """The top-2 score gap below which rounding alone can flip the chosen token."""
    return 2 * score_tolerance(dtype, layers, temperature)


def loglik_tolerance(dtype: torch.dtype, layers: int, tokens: int) -> float:
    """How far the log-likelihood of ``tokens`` scored tokens may move by rounding alone."""
    return 2 * score_tolerance(dtype, layers) * max(1, int(tokens))


def router_margin(logits: torch.Tensor, top_k: int) -> float:
    """The smallest gap, over tokens, between a router's k-th and (k+1)-th logit (``logits`` [T, E]): how close
    the layer's expert choice came to a tie."""
    if logits.shape[-1] <= top_k:
        return math.inf
    top = torch.topk(logits.float(), top_k + 1, dim=-1).values  # [T, k + 1]
    return float((top[:, -2] - top[:, -1]).min())


def classify_divergence(margins: dict[int, float] | None, position: int, dtype: torch.dtype, layers: int,
                        temperature: float | None = None) -> str | None:
    """``"numerics (margin m < t for dtype, L layers)"`` when the reference's margin at absolute ``position`` is
    below the tolerance; None when it is not (a real divergence) or when no margin was recorded there."""
    if not margins or position not in margins:
        return None
    m, tol = margins[position], margin_tolerance(dtype, layers, temperature)
    if m < tol:
        return f"numerics (margin {m:.4g} < {tol:.4g} for {dtype_name(dtype)}, {layers} layers)"
    return None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(slots=True)
class NumericsGuide:
    """The reference's tokens and top-2 margins of one request, and the margin tolerance: a sampler that chooses
    another token where the reference's margin is below the tolerance takes the reference's instead and records
    the position (``followed``), so the rest of the decode stays comparable with the reference."""

    tokens: dict[int, int]  # absolute position -> the reference's token
    margins: dict[int, float]  # absolute position -> the reference's top-2 score margin there
    tolerance: float
    followed: list[int] = field(default_factory=list)

    def choose(self, position: int, token: int) -> int:
        ref = self.tokens.get(position)
        if ref is None or ref == token or self.margins.get(position, math.inf) >= self.tolerance:
            return token
        if position not in self.followed:
            self.followed.append(position)
        return ref
