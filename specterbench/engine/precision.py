"""The target's precision: its routed experts (and optionally its dense part) quantized as users run them.

Most users of a 24 GB card run an MoE model with quantized experts (HQQ 2-3 bit in mixtral-offloading, 4-bit GPTQ or
AWQ elsewhere). ``--expert-bits 16|8|4|3|2`` quantizes the *target's* routed experts group-wise with the draft
work's formats (:class:`~specterbench.engine.draft.QuantSpec`: the project's ``int`` quantizer by default, fp16 scale
and a ``bits``-bit zero per group), and ``--dense-bits 16|8|4`` its attention, shared experts, dense MLPs and head.

- **The reference is the quantized model itself**: the dense weights are replaced by their quantized values before
  the engine is built and the experts are packed by the engine's store, so the reference pass, every strategy and
  every draft see the same model, and lossless checks keep their meaning (a lossless strategy must reproduce the
  quantized model's tokens).
- **Budgets are fractions of the stored expert bytes**: one expert is billed at its packed bytes (codes plus
  per-group scale and zero, :meth:`QuantSpec.tensor_bytes`), in the cache, on the link ledger and in the modeled
  clock's prices (the geometry's bits per weight).
- **A self-draft must sit below the target**: a speculative strategy whose draft has as many bits as the target's
  experts (or more) refuses in one line.

Where the weights live: the target's experts are stored packed — host RAM holds each expert's
:class:`~specterbench.engine.packing.PackedWeight` tensors (codes, fp16 scale and packed zero per group: exactly
:meth:`Precision.expert_bytes`), built layer by layer by :class:`~specterbench.engine.store.ExpertStore`; the cache's
slots hold the same tensors (:class:`~specterbench.engine.pool.SlotPool` in mode ``packed``) and a fetch copies them,
so allocated, copied and ledgered bytes are the billed ones. The dense part's quantized values stay in the compute
dtype (priced at their packed bytes with their format's kernel).

Prices: each of the target's experts runs from its packed slot, dequantized into one reused scratch and multiplied by
a 16-bit GEMM, and is priced so (:meth:`specterbench.engine.costs.CostModel.target_read`: the packed bytes plus the
scratch's write and read, launches counted on that path); the dense weights with their format's kernel
(:func:`specterbench.engine.lowbit.kernel_for`), at their stored bytes over 16-bit, as drafts' are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from specterbench.engine.dense_copy import dense_linears
from specterbench.engine.draft import QuantSpec
from specterbench.engine.geometry import Geometry
from specterbench.engine.lowbit import kernel_for
from specterbench.engine.quant_spec import roundtrip
from specterbench.engine.seam import find_moe_blocks, router_of
from specterbench.errors import UsageError

EXPERT_BITS = (16, 8, 4, 3, 2)
DENSE_BITS = (16, 8, 4)
TARGET_QUANTIZERS = ("int", "hqq", "bnb")
DEFAULT_GROUP = 128  # GPTQ/AWQ's group; HQQ's configs in mixtral-offloading use 16-64
DENSE_GROUP = 64


#: precision names users know, where they map cleanly onto a bit width of this project's group-wise int format
#: (the group is ``--expert-group``; the row states the bits per weight that result, scales and zeros included)
NAMES = {"bf16": 16, "fp16": 16, "f16": 16, "16bit": 16, "q8": 8, "int8": 8, "q4": 4, "int4": 4, "q3": 3, "int3": 3,
         "q2": 2, "int2": 2}
#: names with no clean mapping, and the nearest setting (llama.cpp's k-quants mix widths and super-blocks)
NEAREST = {"q4_k_m": "4 with --expert-group 32 (4.62 bits per weight; Q4_K_M is about 4.85)",
           "q4_k_s": "4 with --expert-group 32 (4.62 bits per weight; Q4_K_S is about 4.58)",
           "q4_0": "4 with --expert-group 32 (4.62 bits per weight; Q4_0 is 4.5, symmetric)",
           "q8_0": "8 with --expert-group 32 (8.75 bits per weight; Q8_0 is 8.5, symmetric)",
           "q5_k_m": "none (5 bits is not a width here): 4 or 8", "q6_k": "none (6 bits is not a width here): 8",
           "fp8": "8 (int8 per group; fp8's own format is not modeled)"}


def _bits(value, allowed: tuple[int, ...], flag: str) -> int:
    name = str(value).strip().lower()
    if name in NEAREST:
        raise UsageError(f"{flag} {value!r} has no clean mapping onto this project's formats; the nearest is "
                         f"{flag} {NEAREST[name]}")
    if name in NAMES and NAMES[name] in allowed:
        return NAMES[name]
    try:
        n = int(value)
        ok = str(value).strip().lstrip("+").isdigit() or isinstance(value, int)
    except (TypeError, ValueError):
        n, ok = None, False
    if not ok or n not in allowed:
        names = ", ".join(n for n, b in NAMES.items() if b in allowed and not n.startswith(("f", "16")))
        raise UsageError(f"unknown precision {flag} {value!r}: use one of {', '.join(map(str, allowed))} "
                         f"(16: unquantized) or a name: {names}")
    return n


@dataclass(frozen=True, slots=True)
class Precision:
    """How the target's weights are stored: routed experts at ``expert_bits`` (group ``group``, ``quantizer``) and
    the dense part at ``dense_bits`` (the ``int`` quantizer, group 64); 16 means unquantized (bf16)."""

    expert_bits: int = 16
    dense_bits: int = 16
    quantizer: str = "int"
    group: int = DEFAULT_GROUP

    def __post_init__(self):
        _bits(self.expert_bits, EXPERT_BITS, "--expert-bits")
        _bits(self.dense_bits, DENSE_BITS, "--dense-bits")
        if self.quantizer not in TARGET_QUANTIZERS:
            raise UsageError(f"unknown expert quantizer {self.quantizer!r}; use one of {', '.join(TARGET_QUANTIZERS)}")
        _ = self.expert_spec, self.dense_spec  # a format that cannot hold the bits (bnb at 3 bits) refuses here

    @classmethod
    def parse(cls, expert_bits=16, dense_bits=16, quantizer: str = "int", group=DEFAULT_GROUP) -> "Precision":
        """From command-line text: one-line UsageErrors for an unknown precision or a format that cannot hold it."""
        try:
            g = int(group)
        except (TypeError, ValueError):
            raise UsageError(f"--expert-group {group!r} must be an integer (e.g. 64 or 128)") from None
        return cls(_bits(expert_bits, EXPERT_BITS, "--expert-bits"), _bits(dense_bits, DENSE_BITS, "--dense-bits"),
                   str(quantizer), g)

    @property
    def quantized(self) -> bool:
        return self.expert_bits < 16 or self.dense_bits < 16

    @property
    def expert_spec(self) -> QuantSpec | None:
        if self.expert_bits == 16:
            return None
        try:
            return QuantSpec(bits=self.expert_bits, blocksize=self.group, quantizer=self.quantizer,
                             quant_type="nf4")
        except UsageError as err:
            raise UsageError(f"--expert-bits {self.expert_bits} with quantizer {self.quantizer!r}: {err}") from None

    @property
    def dense_spec(self) -> QuantSpec | None:
        return None if self.dense_bits == 16 else QuantSpec(bits=self.dense_bits, blocksize=DENSE_GROUP,
                                                             quantizer="int")

    @property
    def dense_ratio(self) -> float:
        """The dense weights' bytes over 16-bit (1.0 unquantized)."""
        spec = self.dense_spec
        return 1.0 if spec is None else spec.bits_per_weight() / 16

    @property
    def expert_kernel(self):
        """The low-bit kernel the target's experts run with (:func:`specterbench.engine.lowbit.kernel_for`)."""

        return None if self.expert_spec is None else kernel_for(self.expert_spec)

    @property
    def dense_kernel(self):
        """The low-bit kernel the target's dense weights run with; None at 16 bits."""

        return None if self.dense_spec is None else kernel_for(self.dense_spec)

    def label(self) -> str:
        """``bf16``, ``experts int4/g128 (4.16 bpw)``, ``experts int2/g32 (2.75 bpw) + dense int8/g64``: what rows
        and cells carry, the experts' bits per weight with their scales and zeros included."""
        if not self.quantized:
            return "bf16"
        spec = self.expert_spec
        parts = [f"experts {spec.label()} ({spec.bits_per_weight(cols=DEFAULT_GROUP * 32):.2f} bpw)" if spec
                 else "experts bf16"]
        if self.dense_spec:
            parts.append(f"dense {self.dense_spec.label()}")
        return " + ".join(parts)

    def expert_bytes(self, gate_up_shape, down_shape, dtype_bytes: int = 2) -> int:
        """Stored bytes of one expert with weights of these shapes ([2I, H], [H, I]): packed codes plus group
        metadata as the draft work's packing stores them (:meth:`QuantSpec.weight_bytes`); 16-bit unquantized."""
        spec = self.expert_spec
        if spec is None:
            return (_numel(gate_up_shape) + _numel(down_shape)) * dtype_bytes
        return spec.weight_bytes(tuple(gate_up_shape)) + spec.weight_bytes(tuple(down_shape))

    def expert_bits_per_weight(self, hidden: int, intermediate: int) -> float:
        """Stored bits per weight of one expert of ``hidden`` x ``intermediate`` (gate_up [2I, H], down [H, I])."""
        gu, dn = (2 * intermediate, hidden), (hidden, intermediate)
        return 8 * self.expert_bytes(gu, dn) / (_numel(gu) + _numel(dn))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


BF16 = Precision()


def _numel(shape) -> int:
    rows, cols = shape
    return rows * cols


def priced_geometry(geometry: Geometry, precision: Precision) -> Geometry:
    """``geometry`` with the target's stored bits per weight: what one expert copy moves and what a kernel reads."""
    if not precision.quantized:
        return geometry
    bpw = precision.expert_bits_per_weight(geometry.hidden, geometry.expert_intermediate)
    return dataclasses.replace(geometry, expert_bits_per_weight=None if precision.expert_bits == 16 else bpw,
                               precision=precision.label())


@torch.no_grad()
def quantize_model(model, precision: Precision) -> None:
    """Replace the target's dense weights by their quantized values, in place, before an engine is built on it: with
    ``dense_bits`` < 16, every dense ``nn.Linear`` (routers and embeddings stay 16-bit). The routed experts are not
    touched here: the engine built with ``precision`` packs them into its store as it takes each layer over
    (:class:`~specterbench.engine.store.ExpertStore`)."""

    dense = precision.dense_spec
    if dense is not None:
        routers = {id(m) for block in find_moe_blocks(model) for m in router_of(block).modules()}
        for m in dense_linears(model):
            if id(m) not in routers:  # routers decide the routing: they stay 16-bit, as in every low-bit recipe
                m.weight.data = roundtrip(m.weight.data.float(), dense).to(m.weight.dtype)


def check_draft_below(precision: Precision, draft: QuantSpec, strategy: str) -> None:
    """A self-draft must be cheaper than the target it drafts for: its bits below the target experts' bits."""
    if precision.expert_bits < 16 and draft.bits >= precision.expert_bits:
        raise UsageError(f"{strategy}: its draft ({draft.label()}) is not below the target's {precision.expert_bits}-"
                         f"bit experts; set {strategy}.bits to fewer than {precision.expert_bits} bits or run the "
                         f"target at more --expert-bits")
