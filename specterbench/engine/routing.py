"""Routing of one MoE layer: the one grouping of tokens by expert, and the router signals strategies may read.

:func:`group_tokens` is the only place tokens are grouped by expert — the target's expert loop and the quantized
draft's both call it: one ``bincount``, one stable ``argsort`` and one transfer of the counts to the host per layer,
no per-expert ``torch.where`` (and so no per-expert device synchronisation on CUDA). Within an expert, tokens keep
the row-major order ``torch.where(top_k_index == e)`` would give, so outputs are bit-identical to it.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable, Iterator

import torch


@dataclass(slots=True)
class TokenGroups:
    """Tokens of one MoE layer grouped by routed expert (experts ascending)."""

    experts: list[int]  # routed experts, ascending
    tokens_per_expert: list[int]  # same order
    token_idx: tuple[torch.Tensor, ...]  # per routed expert: its token rows [n]
    scales: tuple[torch.Tensor, ...]  # per routed expert: its routing weights [n, 1]
    num_experts: int = 0

    @property
    def counts(self) -> torch.Tensor:
        """[E] routed tokens per expert, on the host (built on request)."""
        out = torch.zeros(self.num_experts, dtype=torch.long)
        out[self.experts] = torch.tensor(self.tokens_per_expert, dtype=torch.long)
        return out

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        return iter(zip(self.experts, self.token_idx, self.scales))

    def of(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(token_idx [n], scales [n, 1])`` of a routed ``expert``."""
        i = bisect_left(self.experts, expert)
        if i == len(self.experts) or self.experts[i] != expert:
            raise KeyError(f"expert {expert} is not routed in this layer")
        return self.token_idx[i], self.scales[i]


_ROW0: dict = {}  # device -> tensor([0]): the token rows of every expert of a one-token layer


def group_tokens(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, num_experts: int) -> TokenGroups:
    """Group ``top_k_index`` [T, k] (with ``top_k_weights`` [T, k]) by expert."""
    T, k = top_k_index.shape
    if T == 1:  # a decode step: k distinct experts, one token each; one transfer of k ids
        ids = top_k_index[0].tolist()
        order = sorted(range(k), key=ids.__getitem__)
        w = top_k_weights[0].unsqueeze(-1)  # [k, 1]
        row0 = _ROW0.get(top_k_index.device)
        if row0 is None:
            row0 = _ROW0[top_k_index.device] = torch.zeros(1, dtype=torch.long, device=top_k_index.device)
        return TokenGroups([ids[j] for j in order], [1] * k, (row0,) * k, tuple(w[j:j + 1] for j in order),
                           num_experts)
    flat = top_k_index.reshape(-1)  # [T*k]
    counts = torch.bincount(flat, minlength=num_experts).cpu()  # [E]: the one transfer to the host
    order = torch.argsort(flat, stable=True)  # [T*k], grouped by expert, row-major within one
    experts = counts.nonzero().flatten().tolist()
    sizes = counts[experts].tolist()
    token_idx = torch.split(order // k, sizes)
    scales = torch.split(top_k_weights.reshape(-1)[order].unsqueeze(-1), sizes)
    return TokenGroups(experts, sizes, token_idx, scales, num_experts)


class LayerRouting:
    """``engine.routing`` while a MoE layer runs (prefill, decode and multi-token verification alike).

    - ``layer``: the MoE layer; ``hidden``: its MoE input [T, H]
    - ``top_k_index`` [T, k], ``top_k_weights`` [T, k]: the token→expert assignment and its weights
    - ``experts``, ``tokens_per_expert``: the routed experts (ascending) and their token counts
    - ``logits`` [T, E]: the router's logits, computed on first access only (the router applied again to
      ``hidden``; free on the clock: the model computed them already); ``probs`` [T, E]: their softmax (fp32)

    Nothing is computed for a strategy that does not read ``logits``/``probs``.
    """

    __slots__ = ("layer", "hidden", "top_k_index", "top_k_weights", "groups", "_router", "_logits")

    def __init__(self, layer: int, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                 groups: TokenGroups, router: Callable):
        self.layer, self.hidden = layer, hidden
        self.top_k_index, self.top_k_weights = top_k_index, top_k_weights
        self.groups, self._router, self._logits = groups, router, None

    @property
    def experts(self) -> list[int]:
        return self.groups.experts

    @property
    def tokens_per_expert(self) -> list[int]:
        return self.groups.tokens_per_expert

    @property
    def logits(self) -> torch.Tensor:
        if self._logits is None:
            with torch.inference_mode():
                self._logits = self._router(self.hidden)[0]
        return self._logits

    @property
    def probs(self) -> torch.Tensor:
        return torch.softmax(self.logits.float(), dim=-1)


@dataclass(frozen=True, slots=True)
class RouterGuess:
    """What a layer's router says about hidden states it is applied to early (``engine.peek_next_router``)."""

    layer: int
    logits: torch.Tensor  # [T, E]
    top_k_weights: torch.Tensor  # [T, k]
    top_k_index: torch.Tensor  # [T, k]

    def experts(self) -> list[int]:
        """The experts the guess routes to, ascending (one transfer to the host)."""
        return self.top_k_index.unique().tolist()
