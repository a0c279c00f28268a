"""Numba code of the Q4_0 RHS layouts (:mod:`kleidipy.kernels.pack.qsi4c32p`): the three packers' bytes from GGML
Q4_0 blocks, where each value and scale sits in them, and GET_ROWS from them.

Layout identifiers: ``RHS_SCALEF16`` (``qsi4c32pscalef16``, NEON: per block, nr fp16 d then 32/kr segments of
nr × kr/2 bytes, GGML qs XOR 0x88), ``RHS_S1S0`` (``qsi4c32ps1s0scalef16``, SME2: a uint16 of 4 unsigned codes per
(K group of 4, column), then fp16 d block-major) and ``RHS_S4S0`` (``qsi4c32ps4s0sf16``, SME1: a uint32 per (8-value
packet, column), then fp16(d/16) block-major).
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.numerics import F16_BITS_TO_F32, f32_to_f16_bits_scalar

RHS_SCALEF16 = 0
RHS_S1S0 = 1
RHS_S4S0 = 2

#: Q4_0 block: 2 bytes fp16 d + 16 bytes of codes.
BLOCK_BYTES = 18


# --------------------------------------------------------------------------------------------- RHS layouts
# In every layout the data of (group g, block b) is 16·nr contiguous bytes; byte p = (o·nr + r)·inner + t
# (o < 16/inner) belongs to column r and holds two values of the block: k_lo[o·inner + t] in its low nibble and
# k_hi[o·inner + t] in its high nibble. A nibble holds the GGML code u XOR flip, the value (u − 8): flip 8 for
# the signed (XOR 0x88) layouts, 0 for the unsigned SME2 codes.


@numba.njit(cache=True, nogil=True)
def rhs_block_map(layout, kr):
    """(inner, k_lo [16], k_hi [16], flip) of a packed RHS layout (see the comment above)."""
    if layout == RHS_SCALEF16:
        inner = kr // 2
    elif layout == RHS_S1S0:
        inner = 2
    else:
        inner = 4
    k_lo = np.empty(16, np.int64)
    k_hi = np.empty(16, np.int64)
    for o in range(16 // inner):
        for t in range(inner):
            if layout == RHS_SCALEF16:  # segment o of kr/2 bytes: GGML qs bytes, elements j and j+16
                lo, hi = o * inner + t, o * inner + t + 16
            elif layout == RHS_S1S0:  # uint16 of K group o: nibbles 2t, 2t+1
                lo, hi = 4 * o + 2 * t, 4 * o + 2 * t + 1
            else:  # uint32 of packet o: elements 8o+t and 8o+t+4
                lo, hi = 8 * o + t, 8 * o + t + 4
            k_lo[o * inner + t] = lo
            k_hi[o * inner + t] = hi
    flip = 0 if layout == RHS_S1S0 else 8
    return inner, k_lo, k_hi, flip


@numba.njit(cache=True, nogil=True, inline="always")
def rhs_data_offset(layout, nr, nb, g, b):
    base = g * nr * nb * BLOCK_BYTES
    if layout == RHS_SCALEF16:
        return base + b * nr * BLOCK_BYTES + 2 * nr
    return base + b * nr * 16


@numba.njit(cache=True, nogil=True, inline="always")
def rhs_scale_offset(layout, nr, nb, g, b, r):
    """Byte offset of the fp16 scale of column r of group g, block b: per block before its data (NEON), or
    all blocks' scales block-major after the group's data (SME)."""
    base = g * nr * nb * BLOCK_BYTES
    if layout == RHS_SCALEF16:
        return base + b * nr * BLOCK_BYTES + 2 * r
    return base + nr * nb * 16 + 2 * (b * nr + r)


@numba.njit(cache=True, nogil=True, inline="always")
def rhs_scale(rhs, layout, nr, nb, g, b, r):
    """Stored scale (float32) of column r of group g, block b."""
    so = rhs_scale_offset(layout, nr, nb, g, b, r)
    return F16_BITS_TO_F32[np.int64(rhs[so]) | (np.int64(rhs[so + 1]) << 8)]


# --------------------------------------------------------------------------------------------- RHS pack


@numba.njit(cache=True, nogil=True)
def rhs_pack(blocks, nr, kr, layout):
    """A packed RHS layout from GGML Q4_0 blocks [n, nb, 18] (byte j of qs: element j low, j + 16 high).

    The NEON layout pads the last group with copies of row n-1; the SME ones with zeros. The SME1 layout
    stores fp16(f32(d)/16), the others d.
    """
    n, nb, _ = blocks.shape
    groups = (n + nr - 1) // nr
    inner, k_lo, k_hi, flip = rhs_block_map(layout, kr)
    out = np.zeros(groups * nr * nb * BLOCK_BYTES, np.uint8)
    scaled = np.empty(1, np.float32)
    scaled_bits = scaled.view(np.uint32)
    sixteenth = np.float32(0.0625)
    codes = np.empty(32, np.uint8)
    flips = np.uint8(flip)
    at = np.empty(16, np.int64)  # byte x = o·inner + t of a column's block data, relative to column 0's
    for x in range(16):
        at[x] = (x // inner) * nr * inner + x % inner
    for row in range(groups * nr if layout == RHS_SCALEF16 else n):
        src = min(row, n - 1)
        g = row // nr
        r = row % nr
        for b in range(nb):
            for j in range(16):
                byte = blocks[src, b, 2 + j]
                codes[j] = (byte & np.uint8(15)) ^ flips
                codes[j + 16] = (byte >> 4) ^ flips
            data = rhs_data_offset(layout, nr, nb, g, b) + r * inner
            for x in range(16):
                out[data + at[x]] = codes[k_lo[x]] | (codes[k_hi[x]] << np.uint8(4))
            so = rhs_scale_offset(layout, nr, nb, g, b, r)
            if layout == RHS_S4S0:
                scaled[0] = (
                    F16_BITS_TO_F32[np.int64(blocks[src, b, 0]) | (np.int64(blocks[src, b, 1]) << 8)] * sixteenth
                )
                h = f32_to_f16_bits_scalar(scaled_bits[0])
                out[so] = np.uint8(h & 0xFF)
                out[so + 1] = np.uint8(h >> 8)
            else:
                out[so] = blocks[src, b, 0]
                out[so + 1] = blocks[src, b, 1]
    return out


# --------------------------------------------------------------------------------------------- GET_ROWS


@numba.njit(cache=True, nogil=True)
def get_rows(rhs, rows, k, nr, kr, layout):
    """float32 [len(rows), k]: value·d of the selected output channels, read from a packed RHS."""
    nb = k // 32
    inner, k_lo, k_hi, flip = rhs_block_map(layout, kr)
    out = np.empty((rows.size, k), np.float32)
    for i in range(rows.size):
        g = rows[i] // nr
        r = rows[i] % nr
        for b in range(nb):
            d = rhs_scale(rhs, layout, nr, nb, g, b, r)
            data = rhs_data_offset(layout, nr, nb, g, b)
            for o in range(16 // inner):
                for t in range(inner):
                    byte = np.int32(rhs[data + (o * nr + r) * inner + t])
                    out[i, b * 32 + k_lo[o * inner + t]] = np.float32(((byte & 15) ^ flip) - 8) * d
                    out[i, b * 32 + k_hi[o * inner + t]] = np.float32(((byte >> 4) ^ flip) - 8) * d
    return out
