"""The F16-LHS Q4_0 GEMM (``matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa``) on x86 with AVX-512 and
F16C: the bits of :mod:`.jit` (and of KleidiAI's SME2 kernel), as register tiles of 4 rows × 64 columns; and its
LHS packer with ``vcvtps2ph``.

Per panel of 64 columns the weights are decoded once into float32 [k, 64] (``vcvtps2ph``/``vcvtph2ps`` give the F16
rounding of (u − 8)·d that the kernel's F16 ``fmul`` makes), then every tile of 4 rows runs the widening FMOPA's
step per K pair: x = a[2p]·w[2p] (exact in float32), pair = fma(a[2p+1], w[2p+1], x) — the one rounding of the
exact sum of both products — and acc = acc + pair, from +0. Hand-written LLVM IR (:mod:`kleidipy.core.vnni`)
because numba's loops neither keep a tile of accumulators in registers nor use 512-bit vectors.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.numerics import F16_BITS_TO_F32
from kleidipy.core.vnni import F32, F32X16, I16X16, I32X16, i64
from kleidipy.kernels.pack.qsi4c32p_jit import BLOCK_BYTES

#: the host runs the tiles (elsewhere the family runs the portable jit).
AVAILABLE = vnni.HAS_AVX512_VNNI and vnni.HAS_F16C
#: the ISA the conversions are compiled for (a global: no typing cost per call)
_ISA = vnni.HOST_ISA
#: columns of a panel (4 vectors of 16) and rows of a tile
PANEL_COLS, VEC_COLS, TILE_ROWS = 64, 16, 4
PANEL_VECS = PANEL_COLS // VEC_COLS


def runs(nr: int) -> bool:
    """Whether this host runs the tiles for a kernel of nr columns per group (a multiple of 16 at every SVL)."""
    return AVAILABLE and nr % VEC_COLS == 0


@intrinsic
def _decode_panel(typingctx, rhs, wc, j0, n, nb, nr):
    """``decode_panel(rhs, wc, j0, n, nb, nr)``: the weights of the 64 columns from j0 as float32 [k, 64] in wc —
    f16((u − 8)·d) of the ``qsi4c32ps1s0scalef16`` layout (per group of nr columns and block b: 16·nr bytes, the
    uint16 of column r and K quad o at 2·(o·nr + r), its nibble q the code of k = 4o + q; then every block's fp16
    scales, block-major). Columns past n decode column j0 again (their outputs are not kept)."""
    sig = types.void(rhs, wc, types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        b = builder
        rhs_p, wc_p, j0_v, n_v, nb_v, nr_v = vnni.intrinsic_args(context, builder, signature, args)
        group = b.mul(b.mul(nr_v, nb_v), i64(BLOCK_BYTES))
        scale_region = b.mul(b.mul(nr_v, nb_v), i64(16))
        bases = []
        for v in range(PANEL_VECS):
            col = b.add(j0_v, i64(VEC_COLS * v))
            col = b.select(b.icmp_signed("<", col, n_v), col, j0_v)
            start = b.mul(b.sdiv(col, nr_v), group)
            r2 = b.mul(b.srem(col, nr_v), i64(2))
            bases.append((b.add(start, r2), b.add(b.add(start, scale_region), r2)))
        block_data, two_nr = b.mul(nr_v, i64(16)), b.mul(nr_v, i64(2))  # a block's codes; its scales, or a K quad
        eight, low = vnni.const_splat(I32X16, 8), vnni.const_splat(I32X16, 15)
        with cgutils.for_range(b, nb_v) as loop:
            blk = loop.index
            row0 = b.mul(blk, i64(32 * PANEL_COLS * 4))  # wc byte offset of k = 32·blk
            for v, (data, scales) in enumerate(bases):
                at = vnni.byte_ptr(b, rhs_p, b.add(scales, b.mul(blk, two_nr)))
                d = vnni.f16_bits_to_f32(b, vnni.load(b, at, I16X16), True)
                data_b = b.add(data, b.mul(blk, block_data))
                for o in range(8):
                    at = vnni.byte_ptr(b, rhs_p, b.add(data_b, b.mul(two_nr, i64(o))))
                    words = b.zext(vnni.load(b, at, I16X16), I32X16)
                    for q in range(4):
                        codes = b.and_(b.lshr(words, vnni.const_splat(I32X16, 4 * q)), low)
                        w = vnni.round_f16(b, b.fmul(b.sitofp(b.sub(codes, eight), F32X16), d), True)
                        at = b.add(row0, i64(((4 * o + q) * PANEL_COLS + VEC_COLS * v) * 4))
                        vnni.store(b, w, vnni.byte_ptr(b, wc_p, at))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _tile(typingctx, a, wc, out, i0, rows, j0, k, ldo):
    """``tile(a, wc, out, i0, rows, j0, k, ldo)``: rows i0 .. i0 + rows − 1 (rows <= 4) of the float32 LHS a [m, k]
    × the decoded panel wc [k, 64] into out[(i0 + r)·ldo + j0 ...] (64 columns)."""
    sig = types.void(a, wc, out, types.int64, types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        b = builder
        a_p, wc_p, out_p, i0_v, rows_v, j0_v, k_v, ldo_v = vnni.intrinsic_args(context, builder, signature, args)
        row_bytes = b.mul(k_v, i64(4))
        last = b.sub(rows_v, i64(1))
        lhs = []
        for r in range(TILE_ROWS):  # rows past the tile's repeat its last one
            row = b.add(i0_v, b.select(b.icmp_signed("<", i64(r), rows_v), i64(r), last))
            lhs.append(vnni.byte_ptr(b, a_p, b.mul(row, row_bytes)))
        zero = vnni.const_splat(F32X16, 0.0)
        acc = [[cgutils.alloca_once_value(b, zero) for _ in range(PANEL_VECS)] for _ in range(TILE_ROWS)]
        with cgutils.for_range(b, b.sdiv(k_v, i64(2))) as loop:
            p = loop.index
            w_at = b.mul(p, i64(2 * PANEL_COLS * 4))
            w0 = [vnni.load(b, vnni.byte_ptr(b, wc_p, b.add(w_at, i64(64 * v))), F32X16) for v in range(PANEL_VECS)]
            w1 = [
                vnni.load(b, vnni.byte_ptr(b, wc_p, b.add(w_at, i64(PANEL_COLS * 4 + 64 * v))), F32X16)
                for v in range(PANEL_VECS)
            ]
            for r in range(TILE_ROWS):
                at = vnni.byte_ptr(b, lhs[r], b.mul(p, i64(8)))
                a0 = vnni.splat(b, vnni.load(b, at, F32), F32X16)
                a1 = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, at, 4), F32), F32X16)
                for v in range(PANEL_VECS):
                    pair = vnni.fma(b, a1, w1[v], b.fmul(a0, w0[v]))
                    b.store(b.fadd(b.load(acc[r][v]), pair), acc[r][v])
        for r in range(TILE_ROWS):
            with cgutils.if_likely(b, b.icmp_signed("<", i64(r), rows_v)):
                base = b.mul(b.add(b.mul(b.add(i0_v, i64(r)), ldo_v), j0_v), i64(4))
                for v in range(PANEL_VECS):
                    vnni.store(b, b.load(acc[r][v]), vnni.byte_ptr(b, out_p, b.add(base, i64(64 * v))))
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def lhs_pack(lhs, mr):
    """``lhs_pack_f16pmrx2`` of float32 rows [m, k] (k a multiple of 16) with ``vcvtps2ph``: the bytes of
    ``jit.lhs_pack_f16pmrx2`` (row r of group g, K pair p: its two halves as one uint32 at g·mr·k/2 + p·mr + r)."""
    m, k = lhs.shape
    out = np.zeros((m + mr - 1) // mr * mr * k, np.uint16)
    row = np.empty(k, np.uint16)
    pairs, words = row.view(np.uint32), out.view(np.uint32)
    for i in range(m):
        vnni.f32_to_f16_vectors(_ISA, lhs[i], 0, k // 16, row, 0)
        base = (i // mr) * mr * k // 2 + i % mr
        for p in range(k // 2):
            words[base + p * mr] = pairs[p]
    return out.view(np.uint8)


@numba.njit(cache=True, nogil=True)
def _lhs_rows(lhs, m, k, mr):
    """The packed F16 LHS (``lhs_pack_f16pmrx2``: per group of mr rows and K pair p, the rows' two halves) as
    float32 rows [m·k]."""
    halves = lhs.view(np.uint16)
    a = np.empty(m * k, np.float32)
    for i in range(m):
        base = (i // mr) * mr * k + 2 * (i % mr)
        for p in range(k // 2):
            a[i * k + 2 * p] = F16_BITS_TO_F32[halves[base + 2 * p * mr]]
            a[i * k + 2 * p + 1] = F16_BITS_TO_F32[halves[base + 2 * p * mr + 1]]
    return a


@numba.njit(cache=True, nogil=True)
def compute(m, n, k, mr, nr, lhs, rhs):
    """Unclamped float32 [m, n] of the packed LHS (mr rows per group) × the packed RHS (nr columns per group, a
    multiple of 16), k a multiple of 32: the bits of ``jit.matmul`` with these arguments."""
    a = _lhs_rows(lhs, m, k, mr)
    ldo = (n + PANEL_COLS - 1) // PANEL_COLS * PANEL_COLS  # whole panels: tiles store 64 columns
    out = np.empty((m, ldo), np.float32)
    flat = out.reshape(-1)
    wc = np.empty(k * PANEL_COLS, np.float32)
    for j0 in range(0, n, PANEL_COLS):
        _decode_panel(rhs, wc, j0, n, k // 32, nr)
        for i0 in range(0, m, TILE_ROWS):
            _tile(a, wc, flat, i0, min(TILE_ROWS, m - i0), j0, k, ldo)
    if ldo != n:
        return np.ascontiguousarray(out[:, :n])
    return out
