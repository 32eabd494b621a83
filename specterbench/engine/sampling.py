"""Decoding: greedy, or Gumbel-max sampling with noise tied to (seed, request, absolute position).

Sampled decoding stays exactly checkable. The token at absolute position ``p`` of request ``r`` is

    argmax_v( filtered_logits[v] / temperature + G[seed, r, p, v] )         G ~ Gumbel(0, 1), i.i.d.

which is an exact sample from softmax(filtered_logits / temperature). The noise ``G`` depends only on
(seed, request id, position) — never on which strategy, draft or pass computed the logits — so:

* a lossless strategy reproduces the reference's sampled tokens token for token, and
* a speculative draft that proposes ``pick(draft_logits, p)`` is accepted at ``p`` exactly when the target's
  own sampled token ``pick(target_logits, p)`` equals it: verification is the same rule as in greedy
  decoding (accept the agreeing prefix plus the target's token at the first disagreement).

``G`` comes from a counter-based stream computed where the logits are (:func:`gumbel_noise`: an integer hash of
(seed, request, position, vocabulary index) in int64 tensor ops, float32 noise), so no logits leave the device and
every device draws the same noise. Greedy decoding is the ``mode="greedy"`` setting: plain argmax, no noise.

    setting = DecodeSetting.sample(temperature=1.0, top_p=0.95, seed=0)
    sampler = setting.sampler(request_id="p03")
    token = sampler.pick(logits[-1], position=len(prompt))          # logits [V] -> int
    tokens = sampler.pick_many(logits, first_position=len(prompt))  # logits [N, V] -> list[int]
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass

import torch

from specterbench.engine.kernels import host_read
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

    def sampler(self, request_id: str, record_margins: bool = False, guide=None) -> "TokenSampler":
        return TokenSampler(self, request_id, record_margins, guide)


def _stream_seed(seed: int, request_id: str, position: int) -> int:
    digest = hashlib.blake2b(f"{seed}\x1f{request_id}\x1f{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15 as a signed int64: the Weyl step between vocabulary indices
_MIX1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9 (splitmix64's multipliers, as signed int64)
_MIX2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB
_LOG_2_24 = 24 * math.log(2.0)
_WEYL: dict = {}  # (vocab, device) -> [V] int64: v * golden, wrapped


def _weyl(vocab: int, device) -> torch.Tensor:
    key = (vocab, torch.device(device))
    if key not in _WEYL:
        _WEYL[key] = torch.arange(vocab, dtype=torch.long, device=device) * _GOLDEN  # [V]
    return _WEYL[key]


def gumbel_noise(seed: int, request_id: str, positions, vocab: int, device="cpu") -> torch.Tensor:
    """Gumbel(0, 1) noise [V] for one absolute position (an int), [N, V] for N ``positions`` (float32, on
    ``device``) of one request: a counter-based stream, ``splitmix64(key(seed, request, position) + v · golden)``
    for vocabulary index ``v``, its top 24 bits a uniform ``u``, the noise ``-log(-log(u))`` — integer tensor ops on
    the logits' device, so every device, pass and strategy draws the same numbers."""
    noise = _scores(None, seed, request_id, positions, vocab, device)[0]
    return noise[0] if isinstance(positions, int) else noise


def _scores(x, seed, request_id, positions, vocab, device):
    """``x - log(-log(u))`` [N, V] for logits ``x`` [N, V] (or the noise alone when ``x`` is None)."""
    positions = [positions] if isinstance(positions, int) else list(positions)
    keys = [_stream_seed(seed, request_id, p) for p in positions]
    key = keys[0] if len(keys) == 1 else torch.tensor(keys, dtype=torch.long, device=device).unsqueeze(1)  # [N, 1]
    z = _weyl(vocab, device) + key  # [N, V] int64 (wrapping)
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    z = (z ^ (z >> 31)) >> 39  # [N, V]: 24 bits (the xor clears the sign bit)
    e = _LOG_2_24 - torch.log(z.to(torch.float32))  # -log(u), u = z / 2^24 (u = 0: noise -inf, never picked)
    noise_neg = torch.log(e)  # [N, V]: -Gumbel noise
    if x is None:
        return (-noise_neg).reshape(len(positions), vocab), None
    return None, (x - noise_neg).reshape(len(positions), vocab)


class TokenSampler:
    """Chooses tokens for one request under a :class:`DecodeSetting` (see the module docstring). Everything runs on
    the logits' device in float32; the host reads the chosen token ids once per call."""

    __slots__ = ("setting", "request_id", "margins", "guide")

    def __init__(self, setting: DecodeSetting, request_id: str, record_margins: bool = False, guide=None):
        self.setting = setting
        self.request_id = str(request_id)
        #: a :class:`~specterbench.engine.numerics.NumericsGuide`: where the reference's choice was a near-tie and
        #: this one differs, the reference's token is taken (lossless within numerics); None: every choice is own
        self.guide = guide
        #: ``{position: margin}`` of every token :meth:`pick` chose, when recording (the reference pass does, so a
        #: later divergence at a near-tie can be told from a strategy's error); None otherwise (no extra work)
        self.margins: dict[int, float] | None = {} if record_margins else None

    def scores_many(self, logits: torch.Tensor, first_position: int) -> torch.Tensor:
        """The perturbed scores [N, V] (float32, on the logits' device) whose row-wise argmax are the tokens at
        ``first_position``, ``first_position + 1``, ..."""
        s = self.setting
        x = logits.detach().reshape(-1, logits.shape[-1]).to(torch.float32)  # [N, V]
        if s.mode == "greedy":
            return x
        if s.temperature != 1.0:
            x = x / s.temperature
        if s.top_k is not None and s.top_k < x.shape[-1]:
            kth = torch.topk(x, s.top_k, dim=-1).values[:, -1:]  # [N, 1]
            x = x.masked_fill(x < kth, float("-inf"))
        if s.top_p is not None and s.top_p < 1.0:
            probs, order = torch.sort(torch.softmax(x, -1), dim=-1, descending=True)  # [N, V]
            keep_sorted = (probs.cumsum(-1) - probs) < s.top_p  # tokens before which mass < top_p; keeps >= 1
            keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
            x = x.masked_fill(~keep, float("-inf"))
        positions = range(first_position, first_position + x.shape[0])
        return _scores(x, s.seed, self.request_id, positions, x.shape[-1], x.device)[1]

    def scores(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """The perturbed scores [V] whose argmax is the token at ``position`` (float32, on the logits' device)."""
        return self.scores_many(logits.reshape(1, -1), position)[0]

    def pick(self, logits: torch.Tensor, position: int) -> int:
        """The token at absolute ``position`` (0 = first prompt token) from ``logits`` [V] predicting it."""
        return self.pick_many(logits.reshape(1, -1), position)[0]

    def pick_many(self, logits: torch.Tensor, first_position: int) -> list[int]:
        """Tokens for consecutive positions from ``logits`` [N, V] (row i predicts ``first_position + i``): one
        pass over all rows, one host read."""
        x = self.scores_many(logits, first_position)  # [N, V]
        if self.margins is not None:
            top2 = torch.topk(x, 2, dim=-1).values  # [N, 2]
            for i, m in enumerate(host_read(top2[:, 0] - top2[:, 1])):
                self.margins[first_position + i] = float(m)
        chosen = host_read(x.argmax(-1))  # argmax, not topk's index: the same tie-break with or without margins
        if self.guide is not None:
            chosen = [self.guide.choose(first_position + i, t) for i, t in enumerate(chosen)]
        return chosen

    def margin(self, logits: torch.Tensor, position: int) -> float:
        """Gap between the best and second-best score at ``position``: how close the choice was to a tie
        (used to tell low-precision numerics from a strategy's divergence)."""
        top2 = torch.topk(self.scores(logits, position), 2).values
        return float(top2[0] - top2[1])


GREEDY = DecodeSetting()

#: The project's default decode (``make bench``, ``specterbench run``, sweeps, the gate): Gumbel-max sampling at
#: T = 1.0, the measured setting whose routing is closest to teacher-forced routing on held-out text over the shipped
#: stand-ins (``scripts/decode_closeness.py``; docs/clock.md, Decode modes); greedy continuations of these models loop.
DEFAULT_DECODE = DecodeSetting.sample(temperature=1.0)
