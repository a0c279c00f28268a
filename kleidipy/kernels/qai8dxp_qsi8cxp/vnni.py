"""AVX-512 VNNI host execution of the Q8_0 SME/SME2-layout kernels ``…qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme{,2}_mopa``
and ``…qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme{,2}_dot``: :func:`matmul_qai8dxp` is a drop-in for
:func:`kleidipy.kernels.qai8dxp_qsi8cxp.jit.matmul_qai8dxp` (same arguments, same bits written to ``out``) that
runs them with ``vpdpbusd`` and hands every other layout to that portable function.

Layouts read (kr = 4, sr = 1, k_int = roundup(k, 32)): the LHS group of mr rows holds the int8 of (row r, K
group t) at 4·(t·mr + r), then mr int32 −zp, mr f32 recips; the RHS group of nr columns (nr % 16 == 0) holds
the int8 of (K group t, column c) at 4·(t·nr + c), then nr int32 row sums, nr f32 scales, nr f32 biases.

How: 16 columns per 512-bit vector; each RHS byte is flipped to the unsigned w + 128 (XOR 0x80) and ``vpdpbusd``
multiplies it by the broadcast signed LHS bytes: Σ q·(w + 128) = Σ q·w + 128·Σq, so the int32 accumulator
starts at −128·Σq of the row (over k_int, as the kernels' dot runs over the padded K too). Everything is int32
arithmetic modulo 2^32, like the kernels' wrapping MLA, so acc = Σ q·w + (−zp)·rowsum exactly; then
F = f32(acc), S = f32(scale·recip) and the recipe's ``fma(S, F, bias)`` (GEMV) or ``f32(F·S) + bias`` (GEMM).
A register tile of rows × 4 vectors (64 columns) is generated in LLVM IR with :mod:`kleidipy.core.vnni`.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.vnni import F32, F32X16, I8X64, I32, I32X16, i64
from kleidipy.kernels.qai8dxp_qsi8cxp import jit as _portable
from kleidipy.kernels.qai8dxp_qsi8cxp.jit import RECIPE_FMA_BIAS

#: the host runs these kernels (else :func:`best_matmul_qai8dxp` returns the portable jit function).
HAVE_VNNI = vnni.HAS_AVX512_VNNI
#: the portable function, held here so that rebinding ``jit.matmul_qai8dxp`` to ours is safe.
PORTABLE_MATMUL = _portable.matmul_qai8dxp

KR = 4
VEC_COLS = 16
TILE_VECS = 4
TILE_COLS = VEC_COLS * TILE_VECS
#: rows of the GEMM register tile (4 × 4 int32 accumulators; 6 rows measured slower: address registers spill).
GEMM_ROWS = 4
#: software prefetch distance of the RHS stream of a one-row tile (GEMV), in K groups of 4.
PREFETCH_GROUPS = 24


def _make_tile(rows_max: int, prefetch: bool):  # noqa: ANN202
    """Intrinsic ``tile(geo, lhs, corr, rhs, out, i0, rows, j0, fma_bias)``: rows i0 … i0 + rows − 1 (at most
    ``rows_max``; the tile computes repeats of the last row for the others) × the 64 columns from j0.
    geo = (mr, nr, n, k_int); corr[i] = −128·Σq of row i. ``prefetch``: software prefetch of the RHS stream
    (the GEMV reads it from memory; a GEMM re-reads it from cache)."""

    @intrinsic
    def tile(typingctx, geo, lhs, corr, rhs, out, i0, rows, j0, fma_bias):
        sig = types.void(geo, lhs, corr, rhs, out, types.int64, types.int64, types.int64, types.boolean)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            vnni.require_vnni()
            (mr, nr, n, k_int), lhs_p, corr_p, rhs_p, out_p, i0_v, rows_v, j0_v, fma_v = vnni.intrinsic_args(
                context, builder, signature, args
            )
            b = builder
            lhs_params = b.mul(mr, k_int)
            rhs_params = b.mul(nr, k_int)
            row_ptrs = []
            for r in range(rows_max):
                i = b.add(i0_v, b.select(b.icmp_signed("<", i64(r), rows_v), i64(r), b.sub(rows_v, i64(1))))
                g, ri = b.udiv(i, mr), b.urem(i, mr)
                base = b.add(b.mul(g, b.mul(mr, b.add(k_int, i64(8)))), b.mul(ri, i64(4)))
                row_ptrs.append((vnni.byte_ptr(b, lhs_p, base), i))
            col_ptrs = []
            for v in range(TILE_VECS):
                col = b.add(j0_v, i64(VEC_COLS * v))
                col = b.select(b.icmp_signed("<", col, n), col, j0_v)  # vectors past n re-read the first
                base = b.add(b.mul(b.udiv(col, nr), b.mul(nr, b.add(k_int, i64(12)))), b.mul(b.urem(col, nr), i64(4)))
                col_ptrs.append(vnni.byte_ptr(b, rhs_p, base))
            iacc = [[cgutils.alloca_once(b, I32X16) for _ in range(TILE_VECS)] for _ in row_ptrs]
            for r, (_, i) in enumerate(row_ptrs):
                c = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, corr_p, b.mul(i, i64(4))), I32), I32X16)
                for v in range(TILE_VECS):
                    b.store(c, iacc[r][v])
            lstep, rstep = b.mul(mr, i64(KR)), b.mul(nr, i64(KR))
            ahead = b.mul(rstep, i64(PREFETCH_GROUPS))
            flip = vnni.const_splat(I8X64, 0x80)
            with cgutils.for_range(b, b.udiv(k_int, i64(KR))) as loop:
                roff, loff = b.mul(loop.index, rstep), b.mul(loop.index, lstep)
                w = []
                for ptr in col_ptrs:
                    src = vnni.byte_ptr(b, ptr, roff)
                    if prefetch:
                        vnni.prefetch(b, vnni.byte_ptr(b, src, ahead))
                    w.append(b.bitcast(b.xor(vnni.load(b, src, I8X64), flip), I32X16))
                for r, (ptr, _) in enumerate(row_ptrs):
                    q = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, loff), I32), I32X16)
                    for v in range(TILE_VECS):
                        b.store(vnni.dpbusd(b, b.load(iacc[r][v]), w[v], q, True), iacc[r][v])
            cols = []
            for ptr in col_ptrs:
                par = vnni.byte_ptr(b, ptr, rhs_params)
                cols.append(
                    [
                        vnni.load(b, vnni.byte_ptr(b, par, b.mul(nr, i64(4 * f))), ty)
                        for f, ty in enumerate((I32X16, F32X16, F32X16))
                    ]
                )
            for r, (ptr, _) in enumerate(row_ptrs):
                par = vnni.byte_ptr(b, ptr, lhs_params)
                off = vnni.splat(b, vnni.load(b, par, I32), I32X16)
                recip = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, par, b.mul(mr, i64(4))), F32), F32X16)
                for v, (sums, scale, bias) in enumerate(cols):
                    f = b.sitofp(b.add(b.load(iacc[r][v]), b.mul(off, sums)), F32X16)
                    s = b.fmul(scale, recip)
                    res = b.select(fma_v, vnni.fma(b, s, f, bias), b.fadd(b.fmul(f, s), bias))
                    col = b.add(j0_v, i64(VEC_COLS * v))
                    with b.if_then(b.and_(b.icmp_signed("<", i64(r), rows_v), b.icmp_signed("<", col, n))):
                        dst = b.mul(b.add(b.mul(b.add(i0_v, i64(r)), n), col), i64(4))
                        vnni.masked_store(b, res, vnni.byte_ptr(b, out_p, dst), b.sub(n, col))
            return context.get_dummy_value()

        return sig, codegen

    return tile


_tile_gemv = _make_tile(1, True)
_tile_gemm = _make_tile(GEMM_ROWS, False)


@numba.njit(cache=True, nogil=True)
def _matmul(m, n, k_int, mr, nr, lhs_i8, rhs_u8, fma_bias, out):
    geo = (np.int64(mr), np.int64(nr), np.int64(n), np.int64(k_int))
    corr = vnni.neg_block_sums(vnni.VNNI512, lhs_i8, m, mr, mr * (k_int + 8), 1, 0, k_int // KR, 128)
    for j0 in range(0, n, TILE_COLS):
        for i0 in range(0, m, GEMM_ROWS):
            rows = min(GEMM_ROWS, m - i0)
            if rows == 1:
                _tile_gemv(geo, lhs_i8, corr, rhs_u8, out, i0, 1, j0, fma_bias)
            else:
                _tile_gemm(geo, lhs_i8, corr, rhs_u8, out, i0, rows, j0, fma_bias)


@numba.njit(cache=True, nogil=True)
def _is_sme_int8_layout(k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
    """The RHS data layout of ``rhs_pack_nxk_qsi8cxp_qsi8cx_neon`` at kr = 4 (int8 (t, c) at 4·(t·nr + c) + e,
    k_lo = 4t + e) with an LHS of kr/sr = 4 and nr % 16 == 0 (probed at its first and last entries)."""
    if nibble_factor != 0 or k_hi.size != 0 or kbl != KR or blen != KR or nr % VEC_COLS != 0:
        return False
    if k_lo.size != nr * k_int:
        return False
    for e in range(2 * KR):
        if k_lo[e] != e % KR:
            return False
    return k_lo[KR * nr] == KR and k_lo[k_lo.size - 1] == k_int - 1


def matmul_qai8dxp(
    m: int,
    n: int,
    k_int: int,
    lhs_i8: np.ndarray,
    lhs_i32: np.ndarray,
    lhs_f32: np.ndarray,
    rhs_u8: np.ndarray,
    mr: int,
    kbl: int,
    nr: int,
    blen: int,
    nibble_factor: int,
    k_lo: np.ndarray,
    k_hi: np.ndarray,
    recipe: int,
    out: np.ndarray,
) -> None:
    """:func:`jit.matmul_qai8dxp` (same arguments; writes the unclamped float32 [m, n] into ``out``, C-contiguous):
    the VNNI kernel for the int8 kr = 4, nr % 16 == 0 layout of the SME/SME2 kernels, the portable jit for every
    other layout. Needs AVX-512 VNNI (see :func:`best_matmul_qai8dxp`)."""
    if _is_sme_int8_layout(k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
        _matmul(m, n, k_int, mr, nr, lhs_i8, rhs_u8, recipe == RECIPE_FMA_BIAS, out)
    else:
        PORTABLE_MATMUL(
            m, n, k_int, lhs_i8, lhs_i32, lhs_f32, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out
        )


def best_matmul_qai8dxp() -> Callable[..., None]:
    """The fastest ``matmul_qai8dxp`` this host runs (the portable jit one without AVX-512 VNNI)."""
    return matmul_qai8dxp if HAVE_VNNI else PORTABLE_MATMUL
