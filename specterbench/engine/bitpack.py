"""Bit packing: values of 1–8 bits stored 8 to ``bits`` bytes, and the storage a tensor really allocates.

:func:`pack_bits` and :func:`unpack_bits` are the packed codes every low-bit copy keeps (a draft's experts, a
quantized dense copy, a quantized target); 4 bits unpack by mask and shift, other widths by table gathers whose
table (:func:`unpack_table_bytes`) is charged to the copy that holds it.
"""

from __future__ import annotations

import functools

import torch


def storage_bytes(t: torch.Tensor | None) -> int:
    """Bytes of the storage behind ``t`` (what it really allocates, not its view's size)."""
    return 0 if t is None else t.untyped_storage().nbytes()


def pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Values ``0 ≤ q < 2**bits`` (uint8, any shape) packed 8 to ``bits`` bytes (little-endian bit order); uint8."""
    flat = q.reshape(-1).to(torch.uint8)
    if bits == 8:
        return flat.clone()
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    if bits == 4:  # value 2i in byte i's low nibble, 2i + 1 in its high one (what unpack_bits' fast path reads)
        pairs = flat.view(-1, 2)
        return pairs[:, 0] | (pairs[:, 1] << 4)
    v = flat.view(-1, 8).long()  # [M, 8]
    shifts = torch.arange(0, 8 * bits, bits, device=q.device)  # value j at bits·j of its word (8·bits bits)
    word = (v << shifts).sum(1)  # [M]: the bit fields do not overlap, so their sum is their OR
    bytes_ = torch.arange(0, 8 * bits, 8, device=q.device)  # byte i: bits 8i..8i+7
    return ((word.unsqueeze(1) >> bytes_) & 0xFF).to(torch.uint8).reshape(-1)  # [M·bits], little-endian


@functools.lru_cache(maxsize=None)
def _unpack_tables(bits: int, device: str) -> torch.Tensor:
    """``T[i, byte, j]``: the bits of value ``j`` (of 8) that byte ``i`` of a packed word holds, in place — so a
    word's values are ``Σ_i T[i, byte_i]``: ``bits`` gathers and adds instead of shifts per value. uint8
    [bits, 256, 8]."""
    t = torch.zeros(bits, 256, 8, dtype=torch.uint8)
    byte = torch.arange(256)
    for i in range(bits):
        for j in range(8):
            for bit in range(bits):
                pos = bits * j + bit  # the word's bit holding this value's bit
                if pos // 8 == i:
                    t[i, :, j] |= (((byte >> (pos % 8)) & 1) << bit).to(torch.uint8)
    return t.to(device)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first ``n`` values packed by :func:`pack_bits`, as uint8 [n]: 4 bits by mask and shift (3 launches), other
    widths by ``bits`` table gathers (:func:`_unpack_tables`)."""
    if bits == 8:
        return packed[:n]
    if bits == 4:  # value 2i in byte i's low nibble, 2i + 1 in its high one: a mask and a shift, no table
        return torch.stack((packed & 15, packed >> 4), -1).reshape(-1)[:n]
    b = packed.view(-1, bits).long()  # [M, bits] byte indices
    t = _unpack_tables(bits, str(packed.device))
    # index_select, not t[i][b[:, i]]: the same one gather, without advanced indexing's host-side dispatch
    out = t[0].index_select(0, b[:, 0])  # [M, 8]
    for i in range(1, bits):
        out += t[i].index_select(0, b[:, i])
    return out.reshape(-1)[:n]


def unpack_table_bytes(bits: int) -> int:
    return 0 if bits in (4, 8) else bits * 256 * 8  # 4 bits: nibbles, unpacked without a table


def packed_bytes(n: int, bits: int) -> int:
    """Bytes :func:`pack_bits` uses for ``n`` values."""
    return n if bits == 8 else -(-n // 8) * bits
