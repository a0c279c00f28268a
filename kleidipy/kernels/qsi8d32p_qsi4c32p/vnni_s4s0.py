"""The Q4_0 SME1 kernels (``…qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme_mopa`` GEMM, ``…qsi8d32p1x4_qsi4c32p4vlx4_1x4vl
_sme_dot`` GEMV) with AVX-512 VNNI, reading the packed bytes they read: the bits of
``jit.matmul_qsi8d32p_qsi4c32ps4s0sf16`` (:func:`compute_s4s0`, the same signature, callable from numba code).

Inputs: the LHS packed by ``lhs_quant_pack_qsi8d32p_f32_neon`` (§4.4: int8 of (r, k) at (k//4)·4mr + 4r + k%4
per group of mr rows, then fp16 scales block-major) and the RHS packed by
``rhs_pack_nxk_qsi4c32ps4s0sf16_qsu4c32s16s0_neon`` (per group of nr columns, a uint32 per (8-value packet p of
block b, column r) at 4·((4b + p)·nr + r), its byte j holding the signed (u XOR 8) nibbles of k = 8p + j (low)
and 8p + j + 4 (high); then fp16(d/16) block-major).

Arithmetic: as the SME1 kernels, per block an exact int32 ``dot_b = 16·Σ q_L·(u − 8)`` (they extract nibbles as
16·w), ``S_b = s_L·s_R + 0`` and ``acc = fma(f32(dot_b), S_b, acc)`` block after block, from +0 — or −0 for the
MOPA kernel (``first_block_fmul``: its first block is an FMUL).

How: the register tiles of :mod:`~kleidipy.kernels.qsi8d32p_qsi4c32p.vnni` (16 columns per vector, up to 4 rows
× 4 vectors) with a source of this layout: one 64-byte load of a packet gives two K groups of 16 columns, the
low nibbles shifted up, both masked to the high nibble and XORed with 0x80 (one ``vpternlog``): bytes 16·u, which
``vpdpbusd`` multiplies by the signed LHS bytes, the integer accumulator of a block starting at −128·Σ q_L.
Hand-written LLVM IR (:mod:`kleidipy.core.vnni`) because numba never emits ``vpdpbusd``.
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core import vnni
from kleidipy.core.vnni import I32X16, i64
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit
from kleidipy.kernels.qsi8d32p_qsi4c32p.vnni import (
    PANEL_COLS,
    PANEL_VECS,
    TILE_ROWS,
    VEC_COLS,
    Tile,
    lhs_terms,
    make_tile,
)

#: the host runs the tiles with AVX-512 VNNI (elsewhere :func:`compute_s4s0` runs their portable IR).
HAVE_VNNI = vnni.HAS_AVX512_VNNI
#: the ISA :func:`compute_s4s0` is compiled for (a global: no typing cost per call).
_ISA = vnni.HOST_ISA
#: the tiles prefetch the packed RHS this many packets (8 K values) ahead.
PREFETCH_PACKETS = 16
#: K groups (4 values) per packet: the low and the high nibbles
HALVES = 2
#: packets per 32-block
PACKETS = 4


def source_s4s0(tile: Tile, rhs, j0, contiguous: bool):
    """The packed RHS of the panel in the s4s0 layout, K groups taken per packet (per = 2: step p is packet p
    of the block, i = 0 its low nibbles, 1 its high nibbles): the codes as bytes 16·u, scales fp16 → float32.

    ``contiguous``: nr is a multiple of 64, the 4 vectors lie side by side in one group (vectors past n read
    the group's padding columns), prefetched ahead. Otherwise each vector is located on its own and vectors
    past n re-read the first one (their group may not exist).
    """
    b = tile.builder
    scale_region = b.mul(b.mul(tile.nr, tile.nb), i64(16))
    packet = b.mul(tile.nr, i64(4))  # bytes of one packet row of a group
    srow = b.mul(tile.nr, i64(2))  # bytes of one block's scales of a group
    bases = []
    for v in range(1 if contiguous else PANEL_VECS):
        col = b.add(j0, i64(VEC_COLS * v))
        col = b.select(b.icmp_signed("<", col, tile.n), col, j0)
        group = b.mul(b.udiv(col, tile.nr), tile.rstride)
        r = b.urem(col, tile.nr)
        data = b.add(group, b.mul(r, i64(4)))
        scale = b.add(b.add(group, scale_region), b.mul(r, i64(2)))
        bases.append((vnni.byte_ptr(b, rhs, data), vnni.byte_ptr(b, rhs, scale)))

    def base(v: int):
        """(data, scales) pointers of vector v's column 0."""
        if contiguous:
            return vnni.byte_ptr(b, bases[0][0], 64 * v), vnni.byte_ptr(b, bases[0][1], 32 * v)
        return bases[v]

    high = vnni.const_splat(I32X16, 0xF0F0F0F0)
    flip = vnni.const_splat(I32X16, 0x80808080)
    words = {}

    def codes(v: int, blk, step, i: int):
        if i == 0:
            ptr = vnni.byte_ptr(b, base(v)[0], b.mul(b.add(b.mul(blk, i64(PACKETS)), step), packet))
            if contiguous:
                vnni.prefetch(b, vnni.byte_ptr(b, ptr, b.mul(packet, tile.prefetch)))
            words[v] = vnni.load(b, ptr, I32X16)
        x = words[v] if i else b.shl(words[v], vnni.const_splat(I32X16, 4))
        return b.xor(b.and_(x, high), flip)

    def scales(v: int, blk):
        ptr = vnni.byte_ptr(b, base(v)[1], b.mul(blk, srow))
        if contiguous and v % 2 == 0:  # a line per 2 vectors: as far ahead (in blocks) as the codes
            ahead = b.udiv(tile.prefetch, i64(PACKETS))
            vnni.prefetch(b, vnni.byte_ptr(b, ptr, b.mul(srow, ahead)))
        return vnni.f16_to_f32(b, ptr, tile.native)

    return codes, scales, HALVES


#: tiles of exactly 1 .. 4 rows for nr a multiple of 64
_TILE = make_tile(None, lambda t, rhs, j0: source_s4s0(t, rhs, j0, True))
#: nr = 16 or 32 (SVL 128/256): one row (the GEMV) or 4 (tail rows repeat the last)
_TILE_1_SINGLE = make_tile(1, lambda t, rhs, j0: source_s4s0(t, rhs, j0, False))
_TILE_4_SINGLE = make_tile(TILE_ROWS, lambda t, rhs, j0: source_s4s0(t, rhs, j0, False))


@numba.njit(cache=True, nogil=True)
def _compute(isa, m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    """``jit.matmul_qsi8d32p_qsi4c32ps4s0sf16`` on the tiles compiled for ``isa`` (shapes the tiles do not take,
    nr not a multiple of 16 or k of 32, go to it)."""
    if m < 1 or n < 1 or k < 32 or k % 32 or nr < VEC_COLS or nr % VEC_COLS or mr < 1:
        return jit.matmul_qsi8d32p_qsi4c32ps4s0sf16(m, n, k, mr, nr, lhs, rhs, first_block_fmul)
    nb = k // 32
    if lhs.size < (m + mr - 1) // mr * mr * nb * 34 or rhs.size < (n + nr - 1) // nr * nr * nb * 18:
        raise ValueError("packed operand buffer too small for m, n, k")  # the tiles read without bounds checks
    ldo = (n + PANEL_COLS - 1) // PANEL_COLS * PANEL_COLS  # whole panels: tiles store 64 columns
    params = np.array([mr * nb * 34, mr, nb, nr * nb * 18, nr, n, ldo, PREFETCH_PACKETS], np.int64)  # vnni.PARAMS
    out = np.empty((m, ldo), np.float32)
    flat = out.reshape(-1)
    corr, sl = lhs_terms(isa, m, k, mr, lhs)
    for x in range(corr.size):  # −8·Σq → −128·Σq: the codes are 16·u
        corr[x] *= 16
    init = np.float32(-0.0) if first_block_fmul else np.float32(0.0)
    acc = np.empty(TILE_ROWS * PANEL_COLS, np.float32)
    for j0 in range(0, n, PANEL_COLS):  # the first row tile streams the panel from memory, the others from L2
        for i0 in range(0, m, TILE_ROWS):
            rows = min(TILE_ROWS, m - i0)
            if nr % PANEL_COLS == 0:
                _TILE(isa, params, lhs, corr, sl, rhs, flat, acc, i0, rows, j0, init)
            elif m == 1:
                _TILE_1_SINGLE(isa, params, lhs, corr, sl, rhs, flat, acc, i0, rows, j0, init)
            else:
                _TILE_4_SINGLE(isa, params, lhs, corr, sl, rhs, flat, acc, i0, rows, j0, init)
    if ldo != n:
        return np.ascontiguousarray(out[:, :n])
    return out


@numba.njit(cache=True, nogil=True)
def compute_s4s0(m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    """Unclamped float32 [m, n] of the SME1 kernels: LHS ``lhs_quant_pack_qsi8d32p_f32_neon`` (mr rows per group)
    × RHS ``qsi4c32ps4s0sf16`` (nr per group, from its first group used), contiguous uint8 — the bits of
    ``jit.matmul_qsi8d32p_qsi4c32ps4s0sf16`` with these arguments (``first_block_fmul``: the MOPA kernel)."""
    return _compute(_ISA, m, n, k, mr, nr, lhs, rhs, first_block_fmul)
