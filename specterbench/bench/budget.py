"""Device byte budgets for expert weights: a share of all expert bytes (``35%``, ``0.35``) or bytes (``120MB``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from specterbench.errors import UsageError

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass(frozen=True, slots=True)
class Budget:
    """A device byte budget for expert weights: a fraction of all expert bytes, or absolute bytes."""

    text: str
    fraction: float | None = None
    nbytes: int | None = None

    def resolve(self, total_expert_bytes: int) -> int:
        return self.nbytes if self.nbytes is not None else int(self.fraction * total_expert_bytes)

    def key(self) -> str:
        return f"{self.fraction:.4f}" if self.fraction is not None else f"{self.nbytes}B"


def parse_budget(text: str) -> Budget:
    """``35%``, ``0.35`` (fractions of all expert bytes) or ``120MB``, ``1.5GiB``, ``123456`` (bytes)."""
    s = text.strip().lower().replace(" ", "")
    if s.startswith("-"):
        raise UsageError(f"budget {text!r} is negative; a budget is a positive share of all expert bytes (35%, "
                         f"0.35) or a byte count (120MB)")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)%", s)
    if m:
        if float(m.group(1)) == 0:
            raise UsageError(f"budget {text!r} is zero; give a positive share of all expert bytes (35%) or bytes")
        return Budget(text, fraction=float(m.group(1)) / 100)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]i?b|b)?", s)
    if not m:
        raise UsageError(f"malformed budget {text!r}; write a percentage (35%), a fraction (0.35) or bytes "
                         f"(120MB, 1.5GiB, 123456)")
    value, unit = float(m.group(1)), m.group(2)
    if value == 0:
        raise UsageError(f"budget {text!r} is zero; give a positive share of all expert bytes (35%) or bytes")
    if unit is None and "." in m.group(1):
        if not 0 < value <= 1:
            raise UsageError(f"budget fraction {text!r} must be in (0, 1]; for bytes write an integer or a unit")
        return Budget(text, fraction=value)
    return Budget(text, nbytes=int(value * _UNITS[unit or "b"]))
