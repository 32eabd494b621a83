"""Routing of one MoE layer: what the host learns of it, and the router signals strategies may read.

:func:`group_tokens` is the host's one read of a layer's routing (``top_k_index`` [T, k], one copy per layer, no
per-expert synchronisation): from it the host knows the layer's experts (ascending), their token counts and each
token's place. The device's own grouping of tokens by expert happens inside the grouped expert op
(:func:`specterbench.engine.moe_layer.grouped_experts`); the per-expert device tensors of :class:`TokenGroups` —
an expert's token rows and routing weights, for the per-expert path (host experts, substitutes, a draft without a
grouped kernel) — are built only when asked for. Within an expert, tokens keep the row-major order
``torch.where(top_k_index == e)`` would give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from specterbench.engine.kernels import host_read


class TokenGroups:
    """Tokens of one MoE layer grouped by routed expert (experts ascending), built on the host from one read."""

    __slots__ = ("experts", "tokens_per_expert", "num_experts", "ids", "top_k_index", "top_k_weights", "_rows")

    def __init__(self, ids: list[list[int]], top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                 num_experts: int):
        self.ids = ids  # [T][k] on the host
        self.top_k_index, self.top_k_weights = top_k_index, top_k_weights  # [T, k] on the device
        self.num_experts = num_experts
        places: dict[int, list[tuple[int, int]]] = {}
        for t, row in enumerate(ids):
            for j, e in enumerate(row):
                places.setdefault(e, []).append((t, j))
        self.experts: list[int] = sorted(places)  # routed experts, ascending
        self._rows = places  # expert -> its (token, choice) places, row-major
        self.tokens_per_expert: list[int] = [len(places[e]) for e in self.experts]

    @property
    def counts(self) -> torch.Tensor:
        """[E] routed tokens per expert, on the host (built on request)."""
        out = torch.zeros(self.num_experts, dtype=torch.long)
        out[self.experts] = torch.tensor(self.tokens_per_expert, dtype=torch.long)
        return out

    def places(self, expert: int) -> list[tuple[int, int]]:
        """``(token, choice)`` of every routing of ``expert``, row-major (host lists)."""
        if expert not in self._rows:
            raise KeyError(f"expert {expert} is not routed in this layer")
        return self._rows[expert]

    def flat_positions(self, expert: int) -> list[int]:
        """Positions ``token * k + choice`` of ``expert``'s routings in the flattened [T * k] assignment."""
        k = self.top_k_index.shape[1]
        return [t * k + j for t, j in self.places(expert)]

    def of(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(token_idx [n], scales [n, 1])`` of a routed ``expert`` on the device (built now: per-expert path)."""
        places = self.places(expert)
        if len(self.ids) == 1:  # one token: views, nothing built
            j = places[0][1]
            return _row0(self.top_k_index.device), self.top_k_weights[0, j:j + 1].unsqueeze(-1)
        device = self.top_k_index.device
        rows = torch.tensor([t for t, _ in places], dtype=torch.long, device=device)  # [n]
        cols = torch.tensor([j for _, j in places], dtype=torch.long, device=device)  # [n]
        return rows, self.top_k_weights[rows, cols].unsqueeze(-1)

    @property
    def token_idx(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.of(e)[0] for e in self.experts)

    @property
    def scales(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.of(e)[1] for e in self.experts)

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        for e in self.experts:
            yield (e, *self.of(e))


_ROW0: dict = {}  # device -> tensor([0]): the token rows of every expert of a one-token layer


def _row0(device) -> torch.Tensor:
    row0 = _ROW0.get(device)
    if row0 is None:
        row0 = _ROW0[device] = torch.zeros(1, dtype=torch.long, device=device)
    return row0


def group_tokens(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, num_experts: int) -> TokenGroups:
    """Group ``top_k_index`` [T, k] (with ``top_k_weights`` [T, k]) by expert: one host read of the indices."""
    return TokenGroups(host_read(top_k_index), top_k_index, top_k_weights, num_experts)


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
