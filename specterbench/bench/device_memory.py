"""A card's memory as an expert budget: what is left for experts after everything else a serving engine keeps there.

``--gpu-memory 24GiB`` (or ``--budgets device``: the hardware profile's memory) prices a cell the way a user sizes a
card. Of the card's bytes, the priced model's dense weights (attention, routers, shared experts, dense MLPs,
embedding and head, at the target's dense precision), the KV cache of every request at the cell's context (prompt +
depth + new tokens, per request), the activations and logits of the largest forward, and a runtime reserve (the CUDA
context, the allocator's slack and library workspaces) come first; what remains is the expert budget every strategy
gets alike (a draft, buffers and cache slots all come out of it, as with any other budget).

All sizes are the priced geometry's (the real model's under a projection): a 24 GiB budget for Mixtral-8x7B is a
share of Mixtral-8x7B's expert bytes, applied to the stand-in's own experts.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from specterbench.bench.budget import Budget
from specterbench.engine.geometry import Geometry
from specterbench.errors import BudgetError, UsageError

GIB = 2**30
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
#: the runtime's own device memory before any weight: a CUDA context (~300-500 MiB on recent drivers), the caching
#: allocator's fragmentation and cuBLAS/attention workspaces; state yours with --reserve (measure it: the device's
#: used memory after loading nothing but the runtime)
DEFAULT_RESERVE_BYTES = 1 * GIB
#: activation bytes per token in flight beyond its hidden state: the attention and MLP intermediates one layer keeps
#: alive at a time (q, k, v, scores' row, the MLP's up-projection) are a few hidden sizes; the logits are float32
ACTIVATION_HIDDEN_MULTIPLE = 12


def parse_memory(text: str, flag: str = "--gpu-memory") -> int:
    """``24GiB``, ``80GB``, ``16384MiB`` → bytes; a number without a unit is refused (GB or GiB differ by 7%)."""
    s = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]i?b|b)?", s)
    if not m or not m.group(2):
        raise UsageError(f"{flag} {text!r} needs a unit: write e.g. 24GiB (binary, as nvidia-smi counts) or 24GB")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if value <= 0:
        raise UsageError(f"{flag} {text!r} must be positive, e.g. 24GiB")
    return int(value)


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def size_text(nbytes: int) -> str:
    """A card's size as users write it: ``24GiB``, ``80GB``, else GiB to one decimal."""
    if nbytes % GIB == 0:
        return f"{nbytes // GIB}GiB"
    if nbytes % 10**9 == 0:
        return f"{nbytes // 10**9}GB"
    return f"{nbytes / GIB:.1f}GiB"


def card_budgets(text: str, reserve: str | None = None, flag: str = "--gpu-memory") -> list[Budget]:
    """``24GiB,48GiB`` → one card budget each (a size without a unit is refused); ``reserve``: ``--gpu-reserve``."""
    reserve_bytes = None if reserve in (None, "") else parse_memory(reserve, "--gpu-reserve")
    sizes = [part.strip() for part in str(text).split(",") if part.strip()]
    if not sizes:
        raise UsageError(f"{flag} is empty; give card sizes with a unit, e.g. {flag} 24GiB,48GiB")
    return [Budget(size_text(n), card_bytes=n, card_reserve=reserve_bytes) for n in (parse_memory(s, flag)
                                                                                    for s in sizes)]


def with_profile_memory(budgets, profile, reserve: str | None = None) -> tuple[Budget, ...]:
    """``--budgets device``: the hardware profile's memory as a card budget (named ``device (40GiB)``)."""
    reserve_bytes = None if reserve in (None, "") else parse_memory(reserve, "--gpu-reserve")
    n = profile.device_memory_bytes
    return tuple(Budget(f"device ({size_text(n)})", card_bytes=n,
                        card_reserve=b.card_reserve if reserve_bytes is None else reserve_bytes)
                 if b.card_bytes == 0 else b for b in budgets)


def _largest(value, default: int) -> int:
    """The largest of an int or a tuple of ints (an axis a run may sweep), or ``default`` when absent."""
    if value is None:
        return default
    return max(value) if isinstance(value, (tuple, list)) else int(value)


def resolve_cards(budgets, engine, longest_prompt: int, new_tokens: int, config=None) -> tuple[Budget, ...]:
    """Each card budget with its fraction of expert bytes and its :class:`DevicePlan`, for ``engine``'s priced
    geometry and precision at the cell's context: the longest prompt, the context depth (when the run has one) and
    the new tokens, for every request of a batch (when the run has one); the largest forward is the prompt's
    prefill. Other budgets pass through. A card too small is one BudgetError line."""
    depth = _largest(getattr(config, "depths", None) or getattr(config, "depth", None), 0)
    batch = _largest(getattr(config, "batch", None), 1)
    out = []
    for b in budgets:
        if b.card_bytes is None:
            out.append(b)
            continue
        p = plan(engine.geometry, b.card_bytes, context_tokens=longest_prompt + depth + new_tokens, batch=batch,
                 forward_tokens=longest_prompt, dense_bits=float(engine.precision.dense_bits),
                 reserve_bytes=DEFAULT_RESERVE_BYTES if b.card_reserve is None else b.card_reserve)
        out.append(dataclasses.replace(b, fraction=min(1.0, p.fraction), plan=p))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """How a card's bytes are spent in one cell (all at the priced geometry)."""

    device_bytes: int  # the card
    dense_bytes: int  # attention, routers, shared experts, dense MLPs, embedding, head
    kv_bytes: int  # every request's KV cache at the cell's context
    activation_bytes: int  # the largest forward's activations and logits
    reserve_bytes: int  # runtime context, allocator slack, workspaces
    expert_bytes: int  # what is left: the expert budget (never negative)
    total_expert_bytes: int  # all expert bytes of the priced model
    context_tokens: int = 0  # each request's KV length: prompt + depth + new tokens
    batch: int = 1  # requests whose KV the card holds

    @property
    def fraction(self) -> float:
        return self.expert_bytes / self.total_expert_bytes if self.total_expert_bytes else 0.0

    def as_dict(self, geometry: Geometry) -> dict:
        """The plan as a row records it (``extra["device_plan"]``), with the whole MoE layers the experts' share
        holds (a layer split's unit) of the priced model's."""
        return {"card_bytes": self.device_bytes, "dense_bytes": self.dense_bytes, "kv_bytes": self.kv_bytes,
                "activation_bytes": self.activation_bytes, "reserve_bytes": self.reserve_bytes,
                "expert_bytes": min(self.expert_bytes, self.total_expert_bytes),
                "layers_resident": self.layers_resident(geometry),
                "moe_layers": round(geometry.moe_layers * geometry.layer_scale),
                "context_tokens": self.context_tokens, "batch": self.batch}

    def layers_resident(self, geometry: Geometry) -> int:
        """How many whole MoE layers of experts the budget holds (a layer split's unit)."""
        per_layer = geometry.expert_bytes * geometry.num_experts
        real_layers = round(geometry.moe_layers * geometry.layer_scale)
        return min(real_layers, int(self.expert_bytes // per_layer)) if per_layer else 0

    def describe(self) -> str:
        return (f"{gib(self.device_bytes)} card: dense weights {gib(self.dense_bytes)}, KV cache {gib(self.kv_bytes)}, "
                f"activations {gib(self.activation_bytes)}, reserve {gib(self.reserve_bytes)} → experts "
                f"{gib(self.expert_bytes)} ({self.fraction:.1%} of {gib(self.total_expert_bytes)})")


def dense_bytes(g: Geometry, dense_bits: float = 16.0) -> int:
    """The priced model's non-expert weights at ``dense_bits`` per weight (routers stay 16-bit)."""
    real_layers = g.layers * g.layer_scale
    moe_layers = g.moe_layers * g.layer_scale
    per_moe = g.layer_dense_params(moe=True) - g.hidden * g.num_experts  # the router apart
    per_dense = g.layer_dense_params(moe=False)
    params = moe_layers * per_moe + (real_layers - moe_layers) * per_dense + 2 * g.vocab * g.hidden
    routers = moe_layers * g.hidden * g.num_experts * 2
    return int(params * dense_bits / 8 + routers)


def kv_bytes_per_token(g: Geometry) -> int:
    """K and V of one token over every real layer (16-bit; MLA models are priced as their MHA geometry)."""
    return int(round(g.layers * g.layer_scale)) * 2 * g.kv_heads * g.head_dim * g.dtype_bytes


def plan(g: Geometry, device_bytes: int, *, context_tokens: int, batch: int = 1, forward_tokens: int = 1,
         dense_bits: float = 16.0, reserve_bytes: int = DEFAULT_RESERVE_BYTES) -> DevicePlan:
    """Spend ``device_bytes`` for ``batch`` requests of ``context_tokens`` each (prompt + depth + new tokens), the
    largest forward holding ``forward_tokens`` tokens (a prefill). A card too small for everything but the experts
    is refused in one line naming the smallest that fits."""
    dense = dense_bytes(g, dense_bits)
    kv = kv_bytes_per_token(g) * context_tokens * batch
    act = forward_tokens * batch * (ACTIVATION_HIDDEN_MULTIPLE * g.hidden * g.dtype_bytes + 4 * g.vocab)
    fixed = dense + kv + act + reserve_bytes
    if fixed > device_bytes:
        need = math.ceil(fixed / GIB)
        raise BudgetError(f"a {gib(device_bytes)} card does not hold {g.name}'s dense weights ({gib(dense)}), the KV "
                          f"cache of {batch} request(s) of {context_tokens} tokens ({gib(kv)}), activations "
                          f"({gib(act)}) and the {gib(reserve_bytes)} reserve; the smallest that fits is {need} GiB "
                          f"(or shorten the context, lower --dense-bits or --gpu-reserve)")
    return DevicePlan(device_bytes, dense, kv, act, reserve_bytes, device_bytes - fixed, g.all_expert_bytes,
                      context_tokens, batch)
