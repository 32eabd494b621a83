"""The host's routed-expert kernels: the rates a host profile states for them, keyed by instruction set and precision.

A host profile's ``expert_kernels`` table holds, per instruction set its expert kernels use (``amx``, ``avx512``,
``avx2``) and per weight precision (``bf16``, ``int8``, ``int4``), the kernel's sustained FLOP/s on all threads
(``flops_per_s``: what a prefill block is bound by), the weight bytes per second its decode GEMV streams
(``bytes_per_s``: at most DRAM's) and where both figures come from (``source``). In TOML::

    [host_profile.expert_kernels.avx512.int4]
    flops_per_s = 4.0e12
    bytes_per_s = 70.0e9
    source = "..."

The host profile's ``isa`` names the instruction set whose kernels run (default: the widest one stated). A host expert
is priced at the rate of the experts' stored precision (:func:`kernel_precision`); a host profile that states no rate
for it is refused in one line (:func:`kernel_rate`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from specterbench.errors import UsageError

HOST_ISAS = ("amx", "avx512", "avx2")  # widest first
KERNEL_PRECISIONS = ("bf16", "int8", "int4")
RATE_FIELDS = ("flops_per_s", "bytes_per_s")


class KernelRate(NamedTuple):
    """One expert kernel of a host: its instruction set, precision, FLOP/s, weight bytes/s and their source."""

    isa: str
    precision: str
    flops_per_s: float
    bytes_per_s: float
    source: str


def kernel_precision(bits_per_weight: float | None) -> str:
    """The kernel precision experts stored at ``bits_per_weight`` run with: unquantized (None) ``bf16``, an 8-bit
    format (scales included, above 6 bits per weight) ``int8``, 4 bits and fewer ``int4`` (2- and 3-bit formats go
    through the same low-bit dot product as 4-bit ones in llama.cpp's CPU kernels, so they take its rate)."""
    if bits_per_weight is None:
        return "bf16"
    return "int8" if bits_per_weight > 6 else "int4"


def precision_of_bits(expert_bits: int) -> str:
    """The kernel precision of ``--expert-bits`` (16: bf16)."""
    return "bf16" if expert_bits >= 16 else "int8" if expert_bits >= 8 else "int4"


def check_expert_kernels(name: str, isa, kernels) -> None:
    """Refuse a malformed ``expert_kernels`` table or ``isa`` in one line naming the key and the fix."""
    where = f"host profile {name!r}"
    if not isinstance(kernels, dict):
        raise UsageError(f"{where}: expert_kernels must be a table [expert_kernels.<isa>.<precision>]")
    for k_isa, table in kernels.items():
        if k_isa not in HOST_ISAS:
            raise UsageError(f"{where}: expert_kernels.{k_isa} names no instruction set; use one of "
                             f"{', '.join(HOST_ISAS)}")
        if not isinstance(table, dict):
            raise UsageError(f"{where}: expert_kernels.{k_isa} must be a table of precisions")
        for precision, rate in table.items():
            key = f"expert_kernels.{k_isa}.{precision}"
            if precision not in KERNEL_PRECISIONS:
                raise UsageError(f"{where}: {key} names no precision; use one of {', '.join(KERNEL_PRECISIONS)}")
            if not isinstance(rate, dict) or set(rate) - {*RATE_FIELDS, "source"}:
                raise UsageError(f"{where}: {key} must be a table of flops_per_s, bytes_per_s and source")
            for field in RATE_FIELDS:
                v = rate.get(field)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    raise UsageError(f"{where}: {key}.{field} must be a finite number > 0, got {v!r}; state the "
                                     f"kernel's measured rate with its source, or remove {key}")
            src = rate.get("source")
            if not (isinstance(src, str) and src.strip()):
                raise UsageError(f"{where}: {key}.source must say where its figures come from")
    if isa is not None:
        if isa not in HOST_ISAS:
            raise UsageError(f"{where}: isa {isa!r} is not one of {', '.join(HOST_ISAS)}; name the instruction "
                             f"set its expert kernels use, or leave it out")
        if isa not in kernels:
            raise UsageError(f"{where}: isa {isa!r} has no expert_kernels.{isa} table; add its rates or name "
                             f"another isa")


def active_isa(isa, kernels: dict) -> str | None:
    """The instruction set whose kernels run: ``isa`` if stated, else the widest one ``kernels`` states."""
    return isa if isa is not None else next((i for i in HOST_ISAS if i in kernels), None)


def kernel_rate(profile, precision: str) -> KernelRate:
    """The rate of ``profile``'s expert kernel at ``precision``; a one-line UsageError naming the missing key and
    the fix when the host profile does not state it."""
    kernels = profile.expert_kernels
    isa = active_isa(profile.isa, kernels)
    rate = kernels.get(isa, {}).get(precision) if isa else None
    if rate is None:
        key = f"expert_kernels.{isa or 'avx512'}.{precision}"
        raise UsageError(f"host profile {profile.name!r} states no {key} (flops_per_s, bytes_per_s, source), which "
                         f"host experts stored at {precision} are priced with; add it to the host profile file "
                         f"(`specterbench calibrate` writes bf16), or choose another --host-profile or --expert-bits")
    return KernelRate(isa, precision, float(rate["flops_per_s"]), float(rate["bytes_per_s"]), rate["source"])
