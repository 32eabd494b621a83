"""Decoding: greedy, or Gumbel-max sampling with noise tied to (seed, request, absolute position).

Sampled decoding stays exactly checkable. The token at absolute position ``p`` of request ``r`` is

    argmax_v( filtered_logits[v] / temperature + G[seed, r, p, v] )         G ~ Gumbel(0, 1), i.i.d.

which is an exact sample from softmax(filtered_logits / temperature). The noise ``G`` depends only on
(seed, request id, position) — never on which strategy, draft or pass computed the logits — so:

* a lossless strategy reproduces the reference's sampled tokens token for token, and
* a speculative draft that proposes ``pick(draft_logits, p)`` is accepted at ``p`` exactly when the target's
  own sampled token ``pick(target_logits, p)`` equals it: verification is the same rule as in greedy
  decoding (accept the agreeing prefix plus the target's token at the first disagreement).

Greedy decoding is the ``mode="greedy"`` setting: plain argmax, no noise.

    setting = DecodeSetting.sample(temperature=1.0, top_p=0.95, seed=0)
    sampler = setting.sampler(request_id="p03")
    token = sampler.pick(logits[-1], position=len(prompt))          # logits [V] -> int
    tokens = sampler.pick_many(logits, first_position=len(prompt))  # logits [N, V] -> list[int]
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import torch

from specterbench.errors import UsageError

DECODE_MODES = ("greedy", "sample")
TEMPERATURE_RANGE = (0.0, 5.0)  # exclusive lower bound, inclusive upper bound


@dataclass(frozen=True, slots=True)
class DecodeSetting:
    """How tokens are chosen from logits. ``temperature``/``top_p``/``top_k`` apply to ``mode="sample"``.

    ``top_p`` in (0, 1]: keep the smallest set of tokens whose probability reaches ``top_p``;
    ``top_k`` >= 1: keep the ``top_k`` most likely tokens. ``seed`` selects the noise stream.
    """

    mode: str = "greedy"
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.mode not in DECODE_MODES:
            raise UsageError(f"unknown decode mode {self.mode!r}: use one of {', '.join(DECODE_MODES)}")
        lo, hi = TEMPERATURE_RANGE
        if not (lo < float(self.temperature) <= hi):
            raise UsageError(f"--temperature {self.temperature} is out of range: use a value in ({lo:g}, {hi:g}]")
        if self.top_p is not None and not (0.0 < float(self.top_p) <= 1.0):
            raise UsageError(f"--top-p {self.top_p} is out of range: use a value in (0, 1]")
        if self.top_k is not None and int(self.top_k) < 1:
            raise UsageError(f"--top-k {self.top_k} is out of range: use an integer >= 1")

    @classmethod
    def greedy(cls) -> "DecodeSetting":
        return cls()

    @classmethod
    def sample(cls, temperature: float = 1.0, top_p: float | None = None, top_k: int | None = None,
               seed: int = 0) -> "DecodeSetting":
        return cls("sample", float(temperature), top_p, top_k, seed)

    @classmethod
    def from_dict(cls, data: dict | None) -> "DecodeSetting":
        """Inverse of :meth:`to_dict`; ``None`` (rows written before decode modes existed) is greedy."""
        if not data:
            return cls()
        return cls(data.get("mode", "greedy"), float(data.get("temperature", 1.0)), data.get("top_p"),
                   data.get("top_k"), int(data.get("seed", 0)))

    def to_dict(self) -> dict:
        if self.mode == "greedy":
            return {"mode": "greedy"}
        return asdict(self)

    @property
    def label(self) -> str:
        """Short, stable text for tables and cell keys: ``greedy`` or ``sample T=1 p=0.95 k=50 seed=0``."""
        if self.mode == "greedy":
            return "greedy"
        parts = [f"sample T={self.temperature:g}"]
        if self.top_p is not None:
            parts.append(f"p={self.top_p:g}")
        if self.top_k is not None:
            parts.append(f"k={self.top_k}")
        parts.append(f"seed={self.seed}")
        return " ".join(parts)

    def sampler(self, request_id: str, record_margins: bool = False) -> "TokenSampler":
        return TokenSampler(self, request_id, record_margins)


def _stream_seed(seed: int, request_id: str, position: int) -> int:
    digest = hashlib.blake2b(f"{seed}\x1f{request_id}\x1f{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def gumbel_noise(seed: int, request_id: str, position: int, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [V] for one (seed, request, absolute position); float64 on the CPU, so every
    device and dtype sees the same draw."""
    gen = torch.Generator().manual_seed(_stream_seed(seed, request_id, position))
    u = torch.rand(vocab, generator=gen, dtype=torch.float64).clamp_(1e-300, 1.0 - 1e-16)
    return -torch.log(-torch.log(u))


class TokenSampler:
    """Chooses tokens for one request under a :class:`DecodeSetting` (see the module docstring)."""

    __slots__ = ("setting", "request_id", "margins")

    def __init__(self, setting: DecodeSetting, request_id: str, record_margins: bool = False):
        self.setting = setting
        self.request_id = str(request_id)
        #: ``{position: margin}`` of every token :meth:`pick` chose, when recording (the reference pass does, so a
        #: later divergence at a near-tie can be told from a strategy's error); None otherwise (no extra work)
        self.margins: dict[int, float] | None = {} if record_margins else None

    def scores(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """The perturbed scores [V] whose argmax is the token at ``position`` (float64, CPU)."""
        s = self.setting
        x = logits.detach().to("cpu", torch.float64).reshape(-1)
        if s.mode == "greedy":
            return x
        x = x / s.temperature
        if s.top_k is not None and s.top_k < x.numel():
            kth = torch.topk(x, s.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if s.top_p is not None and s.top_p < 1.0:
            probs, order = torch.sort(torch.softmax(x, -1), descending=True)
            keep_sorted = (probs.cumsum(-1) - probs) < s.top_p  # tokens before which mass < top_p; keeps >= 1
            keep = torch.zeros_like(keep_sorted)
            keep[order] = keep_sorted
            x = x.masked_fill(~keep, float("-inf"))
        return x + gumbel_noise(s.seed, self.request_id, position, x.numel())

    def pick(self, logits: torch.Tensor, position: int) -> int:
        """The token at absolute ``position`` (0 = first prompt token) from ``logits`` [V] predicting it."""
        if self.margins is not None:
            x = self.scores(logits, position)
            top2 = torch.topk(x, 2).values
            self.margins[position] = float(top2[0] - top2[1])
            return int(x.argmax())  # argmax, not topk's index: the same tie-break as without recording
        if self.setting.mode == "greedy":
            return int(logits.reshape(-1).argmax())
        return int(self.scores(logits, position).argmax())

    def pick_many(self, logits: torch.Tensor, first_position: int) -> list[int]:
        """Tokens for consecutive positions from ``logits`` [N, V] (row i predicts ``first_position + i``)."""
        if self.setting.mode == "greedy" and self.margins is None:
            return logits.argmax(-1).tolist()
        return [self.pick(row, first_position + i) for i, row in enumerate(logits)]

    def margin(self, logits: torch.Tensor, position: int) -> float:
        """Gap between the best and second-best score at ``position``: how close the choice was to a tie
        (used to tell low-precision numerics from a strategy's divergence)."""
        top2 = torch.topk(self.scores(logits, position), 2).values
        return float(top2[0] - top2[1])


GREEDY = DecodeSetting()

#: The project's default decode (``make bench``, ``specterbench run``, sweeps, the gate): Gumbel-max sampling at
#: T = 1.0, the measured setting whose routing is closest to teacher-forced routing on held-out text over the shipped
#: stand-ins (``scripts/decode_closeness.py``; README "Decode modes"); greedy continuations of these models loop.
DEFAULT_DECODE = DecodeSetting.sample(temperature=1.0)
