"""Fused kernels the engine swaps into a model's dense part, as serving engines do.

transformers' RMSNorm issues six kernels per call (``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``, ``mul``) and a
decoder layer calls it two to four times; :func:`fuse_rms_norms` makes each such module one ``_fused_rms_norm``
kernel. A module is fused only when it is an RMSNorm with ``weight`` and ``variance_epsilon`` and the fused kernel
reproduces its output on a probe input to the dtype's tolerance (a norm of another form — e.g. ``1 + weight`` — is
left as it is). Outputs differ from the unfused ones only by rounding.
"""

from __future__ import annotations

import types

import torch
from torch import nn

_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _fused_forward(self, hidden_states):  # [..., H] -> [..., H]
    return torch.ops.aten._fused_rms_norm(hidden_states, [hidden_states.shape[-1]], self.weight,
                                          self.variance_epsilon)[0]


def _is_rms_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (type(module).__name__.endswith("RMSNorm") and isinstance(weight, torch.Tensor) and weight.dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), float))


def _reproduces(module: nn.Module) -> bool:
    """Whether the fused kernel gives the module's own output on a probe input."""
    w = module.weight
    x = torch.randn(3, w.shape[0], generator=torch.Generator().manual_seed(0)).to(w.device, w.dtype)  # [3, H]
    try:
        with torch.inference_mode():
            ours, theirs = _fused_forward(module, x), module.forward(x)
    except (RuntimeError, NotImplementedError):
        return False
    tol = _TOLERANCE.get(w.dtype, 1e-2)
    return ours.shape == theirs.shape and torch.allclose(ours.float(), theirs.float(), rtol=tol, atol=tol)


def fuse_rms_norms(model: nn.Module) -> int:
    """Make every RMSNorm of ``model`` that the fused kernel reproduces one kernel; returns how many were fused."""
    verdict: dict[type, bool] = {}
    fused = 0
    for module in model.modules():
        if not _is_rms_norm(module):
            continue
        if type(module) not in verdict:
            verdict[type(module)] = _reproduces(module)
        if verdict[type(module)]:
            module.forward = types.MethodType(_fused_forward, module)
            fused += 1
    return fused
