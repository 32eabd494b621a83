"""Device byte budgets for expert weights: a share of all expert bytes (``35%``, ``0.35``), bytes (``120MB``), or what
a card of some memory leaves for experts (``--gpu-memory 24GiB``, ``--budgets device``;
:mod:`specterbench.bench.device_memory`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from specterbench.errors import UsageError

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass(frozen=True, slots=True)
class Budget:
    """A device byte budget for expert weights: a fraction of all expert bytes, absolute bytes, or a card's memory
    (``card_bytes``: its fraction is filled in per model, once the cell's context is known, with ``plan`` saying how
    the card's bytes were spent)."""

    text: str
    fraction: float | None = None
    nbytes: int | None = None
    card_bytes: int | None = None
    card_reserve: int | None = None  # the card's runtime reserve (--gpu-reserve; None: the stated default)
    plan: object = field(default=None, compare=False)  # device_memory.DevicePlan of a resolved card budget

    def resolve(self, total_expert_bytes: int) -> int:
        if self.card_bytes is not None and self.fraction is None:
            raise UsageError(f"budget {self.text} is a card's memory, which only `specterbench run` and sweeps size; "
                             f"give a share of expert bytes (35%) or bytes (120MB) here")
        return self.nbytes if self.nbytes is not None else int(self.fraction * total_expert_bytes)

    def key(self) -> str:
        if self.card_bytes is not None:  # the same cell before and after its fraction is known
            return f"card{self.card_bytes}B" + ("" if self.card_reserve is None else f"-r{self.card_reserve}B")
        return f"{self.fraction:.4f}" if self.fraction is not None else f"{self.nbytes}B"


def parse_budget(text: str) -> Budget:
    """``35%``, ``0.35`` (shares of all expert bytes), ``120MB``, ``1.5GiB``, ``123456B`` (bytes), ``device`` (what
    the hardware profile's memory leaves for experts: its ``card_bytes`` is set from the profile). ``0%`` is a valid
    budget (every expert stays on the host) for the strategies that can run with none; the others refuse it when the
    run starts. A bare integer has no unit and is refused with the two readings it could have."""
    s = text.strip().lower().replace(" ", "")
    if s == "device":  # the hardware profile's memory, made a card budget once the profile is known
        return Budget("device", card_bytes=0)
    if s.startswith("-"):
        raise UsageError(f"budget {text!r} is negative; a budget is a share of all expert bytes (35%, 0.35) or a "
                         f"byte count (120MB)")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)%", s)
    if m:
        return Budget(text, fraction=float(m.group(1)) / 100)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]i?b|b)?", s)
    if not m:
        raise UsageError(f"malformed budget {text!r}; write a percentage (35%), a fraction (0.35) or bytes "
                         f"(120MB, 1.5GiB, 123456B)")
    value, unit = float(m.group(1)), m.group(2)
    if unit is None and "." not in m.group(1):
        raise UsageError(f"budget {text!r} has no unit; write {m.group(1)}% for a share of all expert bytes, or "
                         f"bytes with a unit ({m.group(1)}MB, {m.group(1)}B)")
    if unit is None:
        if not 0 <= value <= 1:
            raise UsageError(f"budget fraction {text!r} must be in [0, 1]; for bytes write a unit (120MB)")
        return Budget(text, fraction=value)
    return Budget(text, nbytes=int(value * _UNITS[unit]))
