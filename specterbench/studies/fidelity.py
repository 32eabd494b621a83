"""How much a stand-in's tokens depend on its routed experts, and how faithful its quantized drafts are.

Both are agreement between the model and a modified copy, teacher-forced on the same text:

- **experts removed**: the copy's routed experts output zero (routers, attention, shared experts and dense layers
  unchanged) — a real MoE's tokens collapse without them;
- **draft**: the copy's routed experts quantized with a :class:`~specterbench.engine.draft.QuantSpec` (its
  ``error_scale`` included) and, as Specter's draft, every other linear layer in its dense copy's format.

Per-token agreement is counted greedy (argmax) and sampled at the default decode (T=1: the project's Gumbel-max
sampler, the same noise for model and copy at each position, i.e. what speculative verification accepts);
``kl_nats`` is the mean KL(model ‖ copy) of the next-token distributions; ``expert_overlap`` the mean
|top-k(model) ∩ top-k(copy)| / k and ``exact_set`` the share of (token, MoE layer) pairs whose top-k sets are equal
(order ignored), also per layer.

The draft-fidelity **calibration**: the stand-ins quantize far better than real models (uncalibrated, even a 3-bit
draft agrees on nearly every token), so each model may carry scales on its draft's quantization error, fitted on
*training* text (never the held-out text measured here, nor the benchmark prompts) to the published int4 anchors and
stored in the model's ``draft_calibration.json``: ``error_scale`` on the routed experts (to MoE-SpeQ's exact expert
set 0.909) and ``head_error_scale`` on the output head of the draft's dense copy (to greedy agreement 0.92). A scaled
draft quantizes ``W + (s−1)·(Q(W)−W)`` with the same format: real codes of that format, erring more than W's own
rounding (the stored ``realized_rms_error_ratio`` says by how much). :func:`fit_calibration` does the fit; every draft
built from the model takes it by default (:meth:`QuantSpec.for_model`, :class:`QuantizedDense`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from specterbench.catalog import corpus, embedded
from specterbench.catalog.embedded import DraftCalibration
from specterbench.engine.dense_copy import dense_copy_specs, dense_spec
from specterbench.engine.draft import QuantSpec
from specterbench.engine.quant_spec import roundtrip
from specterbench.engine.sampling import DEFAULT_DECODE
from specterbench.engine.seam import find_moe_blocks

#: published anchors of a real 4-bit draft, printed beside the int4/g128 rows
ANCHORS = {
    "exact_set": (0.909, "MoE-SpeQ arXiv 2511.14102 Fig. 6: INT4-g128 draft of Qwen1.5-MoE, same top-4 set as FP16"),
    "greedy": (0.91, "QuantSpec arXiv 2502.10424: 4-bit self-draft acceptance 0.91–0.94; MoE-SpeQ §4.5 'over 90%'"),
}
#: the bands the int4/g128 draft is held to, around the published anchors
INT4_BANDS = {"exact_set": (0.87, 0.95), "greedy": (0.88, 0.95)}
#: at most this share of tokens may survive removing the routed experts (a real MoE's tokens collapse without them)
REMOVED_MAX = 0.30


@dataclass(frozen=True, slots=True)
class Agreement:
    """Model vs a modified copy, teacher-forced on ``tokens`` positions."""

    greedy: float
    sampled: float
    kl_nats: float
    expert_overlap: float
    exact_set: float
    exact_set_per_layer: tuple[float, ...]
    tokens: int


def routed_expert_blocks(model):

    return find_moe_blocks(model)


def without_routed_experts(model):
    """A float32 copy of ``model`` whose routed experts output zero (their down projections are zero)."""
    removed = copy.deepcopy(model).float().eval()
    with torch.no_grad():
        for block in routed_expert_blocks(removed):
            block.experts.down_proj.zero_()
    return removed


def draft_copy(model, spec, dense=None):
    """A float32 copy of ``model`` as a self-draft computes: routed experts through ``spec`` (its error scale
    included), every other linear layer but the shared-expert gates through ``dense`` (None: the target's)."""

    draft = copy.deepcopy(model).float().eval()
    with torch.no_grad():
        if dense is not None:  # first: a tied head shares the embedding's tensor, which must stay the target's
            for m, s in dense_copy_specs(draft, dense):
                m.weight = torch.nn.Parameter(roundtrip(m.weight.detach().contiguous(), s), requires_grad=False)
        for block in routed_expert_blocks(draft):
            for name in ("gate_up_proj", "down_proj"):
                w = getattr(block.experts, name)  # [E, out, in]
                for e in range(w.shape[0]):
                    w[e].copy_(roundtrip(w[e].contiguous(), spec))
    return draft


@torch.no_grad()
def agreement(model, other, windows: torch.Tensor, decode=None, batch_size: int = 8,
              label: str = "heldout") -> Agreement:
    """Teacher-forced agreement of ``other`` with ``model`` on ``windows`` [W, T] (every position predicts the next
    token; the sampler's noise of window i, position t is that of request ``f"{label}-{i}"`` at t + 1)."""

    setting = decode if decode is not None else DEFAULT_DECODE
    k = int(model.config.num_experts_per_tok)
    greedy = sampled = total = 0
    kl = 0.0
    overlap = slots = 0
    exact: list[int] = []
    layer_slots = 0
    for s in range(0, len(windows), batch_size):
        chunk = windows[s : s + batch_size]  # [B, T]
        a = model(input_ids=chunk, output_router_logits=True, use_cache=False)
        b = other(input_ids=chunk, output_router_logits=True, use_cache=False)
        la, lb = a.logits.float(), b.logits.float()  # [B, T, V]
        greedy += int((la.argmax(-1) == lb.argmax(-1)).sum())
        total += chunk.numel()
        pa, lpb = la.log_softmax(-1), lb.log_softmax(-1)
        kl += float((pa.exp() * (pa - lpb)).sum())
        for i in range(len(chunk)):
            sampler = setting.sampler(f"{label}-{s + i}")
            for t in range(chunk.shape[1]):
                sampled += int(sampler.scores(la[i, t], t + 1).argmax() == sampler.scores(lb[i, t], t + 1).argmax())
        if not exact:
            exact = [0] * len(a.router_logits)
        for layer, (ra, rb) in enumerate(zip(a.router_logits, b.router_logits)):  # each [B·T, E]
            ia = ra.float().topk(k, dim=-1).indices.sort(-1).values
            ib = rb.float().topk(k, dim=-1).indices.sort(-1).values
            overlap += int((ia.unsqueeze(-1) == ib.unsqueeze(-2)).any(-1).sum())
            slots += ia.numel()
            exact[layer] += int((ia == ib).all(-1).sum())
        layer_slots += chunk.numel()
    per_layer = tuple(e / layer_slots for e in exact)
    return Agreement(greedy=greedy / total, sampled=sampled / total, kl_nats=kl / total,
                     expert_overlap=overlap / slots, exact_set=sum(per_layer) / len(per_layer),
                     exact_set_per_layer=per_layer, tokens=total)


# ---- calibration ---------------------------------------------------------------------------------------------


@torch.no_grad()
def realized_error_ratio(model, spec) -> float:
    """RMS error of the routed experts quantized with ``spec`` over that of the same format without a scale."""

    plain = type(spec)(bits=spec.bits, quant_type=spec.quant_type, blocksize=spec.blocksize,
                       quantizer=spec.quantizer, error_scale=1.0)
    num = den = 0.0
    for block in routed_expert_blocks(model):
        for name in ("gate_up_proj", "down_proj"):
            w = getattr(block.experts, name).detach().float()  # [E, out, in]
            for e in range(w.shape[0]):
                num += float((roundtrip(w[e], spec) - w[e]).pow(2).sum())
                den += float((roundtrip(w[e], plain) - w[e]).pow(2).sum())
    return (num / den) ** 0.5 if den else 1.0


def error_scale_of(directory: str | Path | None) -> float:
    """The routed experts' draft error scale stored with a model directory (1.0: none)."""
    cal = embedded.load_calibration(directory) if directory is not None else None
    return cal.error_scale if cal is not None else 1.0


#: what the calibration is fitted to, on training text: the int4/g128 draft's exact expert-set agreement (the
#: routed experts' scale; MoE-SpeQ's 0.909) and then its greedy token agreement (the head's scale; the middle of
#: the published 4-bit self-draft acceptance 0.91–0.94 and of the greedy band of INT4_BANDS)
FIT_EXACT_SET = 0.909
FIT_GREEDY = 0.92
FIT_WINDOWS = 8


def _bisect_log(measure, target: float, max_scale: float, steps: int) -> float:
    """The scale in [1, max_scale] at which ``measure`` (falling as the scale grows) crosses ``target``."""
    import math

    if measure(1.0) <= target:
        return 1.0
    if measure(max_scale) >= target:
        return max_scale
    lo, hi = 0.0, math.log(max_scale)
    for _ in range(steps):
        mid = (lo + hi) / 2
        if measure(math.exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return round(math.exp((lo + hi) / 2), 2)


def fit_calibration(model, tokenizer, seq_len: int, n_windows: int = FIT_WINDOWS, steps: int = 8,
                    log=print) -> DraftCalibration:
    """Fit a model's draft-fidelity calibration on windows of the *training* works (never the held-out text the
    report measures on, nor the benchmark prompts), the int4/g128 draft with Specter's 8-bit dense copy (int8 per
    channel, the int8 kernel's format, as Specter's drafts run):

    1. the routed experts' error scale, bisected (log scale) to an exact expert-set agreement of
       :data:`FIT_EXACT_SET` (the output head does not move routing, so this comes first);
    2. the output head's error scale, at that expert scale, to a greedy token agreement of :data:`FIT_GREEDY` —
       a tiny model's tokens barely move when a low-weight expert of the top-k changes, so the experts' scale
       alone leaves its tokens far more faithful than a real draft's (0.99 at the anchor's expert-set agreement).
    """

    windows = corpus.text_windows(tokenizer, n_windows, seq_len, split="calibration")
    dense = dense_spec(8)
    measured: dict[str, dict] = {"experts": {}, "head": {}}
    saved = getattr(model.config, "draft_head_error_scale", None)

    def at(experts: float, head: float, key: str, scale: float) -> Agreement:
        model.config.draft_head_error_scale = head
        spec = QuantSpec(bits=4, blocksize=128, quantizer="int", error_scale=experts)
        row = agreement(model, draft_copy(model, spec, dense), windows, label="calibration")
        measured[key][f"{scale:.4g}"] = {"exact_set": round(row.exact_set, 4), "greedy": round(row.greedy, 4)}
        log(f"  experts ×{experts:.4g}, head ×{head:.4g}: exact expert set {row.exact_set:.4f}, greedy "
            f"{row.greedy:.4f}")
        return row

    try:
        experts = _bisect_log(lambda x: at(x, 1.0, "experts", x).exact_set, FIT_EXACT_SET, 64.0, steps)
        head = _bisect_log(lambda x: at(experts, x, "head", x).greedy, FIT_GREEDY, MAX_HEAD_SCALE, steps)
    finally:
        model.config.draft_head_error_scale = saved
    realized = realized_error_ratio(model, QuantSpec(bits=4, blocksize=128, quantizer="int", error_scale=experts))
    log(f"  experts ×{experts}: the routed-expert weights err {realized:.2f}× the plain int4/g128 RMS error")
    return DraftCalibration(error_scale=experts, head_error_scale=head, realized_rms_error_ratio=round(realized, 3),
                       fitted_on=f"{windows.shape[0]} training-text windows × {windows.shape[1]} tokens, "
                       f"teacher-forced", target=f"int4/g128 + dense {dense.label()} draft: exact top-k expert set "
                       f"{FIT_EXACT_SET} (MoE-SpeQ arXiv 2511.14102 Fig. 6), then greedy token agreement {FIT_GREEDY} "
                       f"(QuantSpec arXiv 2502.10424: 0.91–0.94)", measured=measured)


MAX_HEAD_SCALE = 1000.0
