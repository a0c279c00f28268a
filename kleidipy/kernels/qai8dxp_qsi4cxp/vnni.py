"""AVX-512 VNNI host execution of the per-channel int4 kernels' layouts (``…qai8dxp…_qsi4cxp…``): the NEON ones
(``rhs_pack_nxk_qsi4cxp_qs4cxs1s0``, nr = 4, kr = 16, sr = 2: ``…1x4x32_neon_dotprod``, ``…{4,8}x4x32_neon_i8mm``) and
the SME2 ones (``rhs_pack_nxk_qsi4cxps1s0_qsu4cxs1s0_neon``, nr = 4·VL, kr = 4: ``…1vlx4vl_sme2_mopa``,
``…1x4vl_sme2_sdot``). :func:`tiles` runs a call of the portable
:func:`kleidipy.kernels.qai8dxp_qsi8cxp.jit.matmul_qai8dxp` (same arguments, same bits written to ``out``) with
``vpdpbusd`` when it is one of these layouts: the VNNI link of the family's tile chain (``ukernels.MATMUL_COMPUTE``).
Hand-written LLVM IR (:mod:`kleidipy.core.vnni`) because numba does not emit ``vpdpbusd`` (nor ``vpmultishiftqb``) from
Python loops.

The LHS is ``lhs_quant_pack_qai8dxp_f32``'s, as in the Q8_0 family (:mod:`kleidipy.kernels.qai8dxp_qsi8cxp.vnni`,
whose row tables, lane folds and epilogue these tiles reuse). The arithmetic is that family's int32 trick: the
RHS values W are made unsigned (W + c) for ``vpdpbusd``, whose accumulator starts at −c·Σq of the row (over
k_int, as the kernels' dot runs over the padded K too); everything is int32 modulo 2^32 like the kernels' MLA, so
acc = dot + (−zp)·rowsum exactly, then F = f32(acc), S = f32(scale·recip) and the recipe's ``fma(S, F, bias)`` or
``f32(F·S) + bias``.

* NEON layouts: the kernels read a nibble as the int8 16·w (``SHL #4`` for the low one, ``AND #0xF0`` for the
  high one), with row sums 16·Σw. The tiles do the same and flip the sign bit (XOR 0x80): the unsigned
  16·w + 128 of the Q8_0 trick, start −128·Σq. A 64-byte load of a group's data is a block of 32 K values of its
  4 columns: byte e holds column (e // 8) % 4 and K = 8·(e // 32) + e % 8 (low nibble), that + 16 (high). So the
  low nibbles of the load are exactly a 16-K block of the Q8_0 kr = 8 layout (K 0 … 15 of the 32) and the high
  nibbles the next one (K 16 … 31): the Q8_0 NEON tiles' LHS vectors (``vpermd`` of the block's LHS bytes), lane
  folds and register tiles (4 rows × 4 groups, or 1 × 4 for a lone row) apply with two ``vpdpbusd`` per load.
* SME2 layouts (kbl = 4, nr % 16 == 0): a (K group of 4, column) is one uint16 of four signed nibbles (LSB first,
  K order) at 2·(G·nr + c): 16 columns of a K group are 32 bytes, spread to bytes with ``vpmultishiftqb``
  (:func:`kleidipy.core.vnni.spread_nibbles`) and flipped to w + 8 (XOR 8), start −8·Σq; the LHS group's 4 bytes
  are broadcast. Register tiles: rows × 4 vectors (64 columns), as the Q8_0 SME tiles.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni, vnni_columns
from kleidipy.core.vnni import F32, F32X16, I8X64, I32, I32X16, i64
from kleidipy.kernels.qai8dxp_qsi8cxp.jit import RECIPE_FMA_BIAS
from kleidipy.kernels.qai8dxp_qsi8cxp.vnni import (
    BLOCK_K,
    GEMM_ROWS,
    KR,
    NEON_NR,
    PANEL_BYTES,
    TILE_COLS,
    VEC_COLS,
    group_params,
    lhs_block,
    lhs_rows,
    make_sme_tile,
    neon_rows,
)

#: software prefetch distance of the RHS streams of a one-row NEON tile, in 64-byte blocks
PREFETCH_BLOCKS = 8
#: the host runs these tiles (the family's tile chain takes them then).
HAVE_VNNI = vnni.HAS_AVX512_VNNI

#: NEON layout: the kernels' nibble weight (16·w), bytes per column run (kr/sr), K values per 64-byte load
NEON_NIBBLE_FACTOR = 16
NEON_BLEN = 8
NEON_BLOCK_K = 2 * BLOCK_K
#: SME2 layout: the nibble weight, bytes per column run (a K group of 4 in one uint16)
SME_NIBBLE_FACTOR = 1
SME_BLEN = KR // 2


# --------------------------------------------------------------------------------------------- SME2 layouts


def _nibble_weights(b, src):
    """The 32 bytes of nibble codes at src (16 columns × a K group of 4, a uint16 each) as the unsigned bytes
    w + 8 (the codes' signed nibbles with their top bit flipped)."""
    return b.xor(vnni.spread_nibbles(b, src, True), vnni.const_splat(I32X16, 0x08080808))


_sme_gemv = make_sme_tile(1, SME_BLEN, _nibble_weights)
_sme_gemm = make_sme_tile(GEMM_ROWS, SME_BLEN, _nibble_weights)


@numba.njit(cache=True, nogil=True)
def _matmul_sme(m, n, k_int, mr, nr, lhs_i8, fma_bias, rhs_u8, out):
    geo = (np.int64(mr), np.int64(nr), np.int64(n), np.int64(k_int))
    corr = vnni.neg_block_sums(
        vnni.VNNI512, lhs_i8.view(np.uint8), m, mr, mr * (k_int + 8), np.int64(1), np.int64(0), k_int // KR, np.int64(8)
    )
    for j0 in range(0, n, TILE_COLS):
        for i0 in range(0, m, GEMM_ROWS):
            rows = min(GEMM_ROWS, m - i0)
            if rows == 1:
                _sme_gemv(geo, lhs_i8, corr, rhs_u8, out, i0, 1, j0, fma_bias)
            else:
                _sme_gemm(geo, lhs_i8, corr, rhs_u8, out, i0, rows, j0, fma_bias)


# --------------------------------------------------------------------------------------------- NEON layouts


def _make_neon_tile(rows: int, groups: int, prefetch: bool):
    """Intrinsic ``tile(geo, lhs, table, index, corr, rhs, out, i0, j0, fma_bias)``: rows i0 … i0 + rows − 1 (rows
    past m, as :func:`neon_rows` gives them, are computed and not stored) × the NEON_NR·groups columns from j0
    (groups past n re-read the first). geo = (m, n, k_int, mr); table, index and corr (−128·Σq) are
    :func:`neon_rows`'s for kr = 8. ``prefetch``: software prefetch of the RHS streams (the one-row tile reads
    them from memory)."""

    @intrinsic
    def tile(typingctx, geo, lhs, table, index, corr, rhs, out, i0, j0, fma_bias):
        int64 = types.int64
        sig = types.void(geo, lhs, table, index, corr, rhs, out, int64, int64, types.boolean)

        def codegen(context, builder, signature, args):
            vnni.require_vnni()
            (m, n, k_int, mr), lhs_p, table_p, index_p, corr_p, rhs_p, out_p, i0_v, j0_v, fma_v = vnni.intrinsic_args(
                context, builder, signature, args
            )
            b = builder
            data_bytes = b.mul(b.udiv(k_int, i64(2)), i64(NEON_NR))
            first = b.udiv(j0_v, i64(NEON_NR))
            gptrs = []
            for g in range(groups):
                inside = b.icmp_signed("<", b.add(j0_v, i64(NEON_NR * g)), n)
                group = b.select(inside, b.add(first, i64(g)), first)
                gptrs.append(vnni.byte_ptr(b, rhs_p, b.mul(group, b.add(data_bytes, i64(NEON_NR * 12)))))
            lrows = lhs_rows(b, rows, lhs_p, table_p, index_p, i0_v)
            zero = vnni.const_splat(I32X16, 0)
            iacc = [[cgutils.alloca_once_value(b, zero) for _ in range(groups)] for _ in range(rows)]
            low_shift, high_mask = vnni.const_splat(I8X64, 4), vnni.const_splat(I8X64, 0xF0)
            flip = vnni.const_splat(I8X64, 0x80)
            ahead = i64(64 * PREFETCH_BLOCKS)
            with cgutils.for_range(b, b.udiv(k_int, i64(NEON_BLOCK_K))) as loop:
                step = b.mul(loop.index, i64(64))
                halves = []  # per group: (16·w_lo + 128, 16·w_hi + 128) as unsigned bytes
                for ptr in gptrs:
                    src = vnni.byte_ptr(b, ptr, step)
                    if prefetch:
                        vnni.prefetch(b, vnni.byte_ptr(b, src, ahead))
                    x = vnni.load(b, src, I8X64)
                    lo = b.xor(b.shl(x, low_shift), flip)
                    hi = b.xor(b.and_(x, high_mask), flip)
                    halves.append((b.bitcast(lo, I32X16), b.bitcast(hi, I32X16)))
                blk = b.mul(loop.index, i64(2))
                for r, row in enumerate(lrows):
                    q_lo = lhs_block(b, row, mr, blk)
                    q_hi = lhs_block(b, row, mr, b.add(blk, i64(1)))
                    for g, (lo, hi) in enumerate(halves):
                        acc = vnni.dpbusd(b, b.load(iacc[r][g]), lo, q_lo, True)
                        b.store(vnni.dpbusd(b, acc, hi, q_hi, True), iacc[r][g])
            quads = []
            for v in range(groups // NEON_NR):
                four = gptrs[NEON_NR * v : NEON_NR * (v + 1)]
                quads.append([group_params(b, four, data_bytes, f, ty) for f, ty in enumerate((I32, F32, F32))])
            for r, (ptr, _, param) in enumerate(lrows):
                i = b.add(i0_v, i64(r))
                zp = vnni.byte_ptr(b, ptr, b.add(b.mul(mr, k_int), param))
                o = vnni.splat(b, vnni.load(b, zp, I32), I32X16)
                rc = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, zp, b.mul(mr, i64(4))), F32), F32X16)
                c = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, corr_p, b.mul(i, i64(4))), I32), I32X16)
                for v, (sums, scale, bias) in enumerate(quads):
                    accs = [b.load(a) for a in iacc[r][NEON_NR * v : NEON_NR * (v + 1)]]
                    dot = vnni_columns.sum_columns(b, accs, NEON_BLEN)
                    f = b.sitofp(b.add(b.add(dot, c), b.mul(o, sums)), F32X16)
                    s = b.fmul(scale, rc)
                    res = b.select(fma_v, vnni.fma(b, s, f, bias), b.fadd(b.fmul(f, s), bias))
                    col = b.add(j0_v, i64(VEC_COLS * v))
                    with b.if_then(b.and_(b.icmp_signed("<", i, m), b.icmp_signed("<", col, n))):
                        dst = b.mul(b.add(b.mul(i, n), col), i64(4))
                        vnni.masked_store(b, res, vnni.byte_ptr(b, out_p, dst), b.sub(n, col))
            return context.get_dummy_value()

        return sig, codegen

    return tile


#: NEON tiles: 1 row × 16 columns (a lone row: the GEMV), GEMM_ROWS rows × 16 columns
_neon_gemv = _make_neon_tile(1, VEC_COLS // NEON_NR, True)
_neon_gemm = _make_neon_tile(GEMM_ROWS, VEC_COLS // NEON_NR, False)


@numba.njit(cache=True, nogil=True)
def _matmul_neon(m, n, k_int, mr, kbl, lhs_i8, fma_bias, rhs_u8, out):
    table, index, corr = neon_rows(m, k_int, mr, kbl, NEON_BLEN, lhs_i8)
    geo = (np.int64(m), np.int64(n), np.int64(k_int), np.int64(mr))
    panel = max(1, PANEL_BYTES // (TILE_COLS * k_int // 2)) * TILE_COLS
    for j0 in range(0, n, panel):  # a panel of columns whose RHS stays in L2 across the row tiles
        j1 = min(n, j0 + panel)
        for i0 in range(0, m, GEMM_ROWS):
            if m - i0 == 1:
                for jj in range(j0, j1, VEC_COLS):
                    _neon_gemv(geo, lhs_i8, table, index, corr, rhs_u8, out, i0, jj, fma_bias)
            else:
                for jj in range(j0, j1, VEC_COLS):
                    _neon_gemm(geo, lhs_i8, table, index, corr, rhs_u8, out, i0, jj, fma_bias)


# --------------------------------------------------------------------------------------------- entry points


@numba.njit(cache=True, nogil=True)
def _layout_matches(k_lo, k_hi, start, stop, nr, nibble_factor):
    """Whether bytes start … stop − 1 of a group's data hold the K indices (k_lo, k_hi) of the NEON layout
    (nibble_factor 16: t = (e // 32)·8 + e % 8, k_lo = 32·(t // 16) + t % 16, k_hi = k_lo + 16) or of the SME2
    one (1: k_lo = (e // 2nr)·4 + 2·(e % 2), k_hi = k_lo + 1)."""
    for e in range(start, stop):
        if nibble_factor == NEON_NIBBLE_FACTOR:
            t = (e // (NEON_NR * NEON_BLEN)) * NEON_BLEN + e % NEON_BLEN
            lo = 32 * (t // 16) + t % 16
            hi = lo + 16
        else:
            lo = (e // (SME_BLEN * nr)) * KR + 2 * (e % SME_BLEN)
            hi = lo + 1
        if k_lo[e] != lo or k_hi[e] != hi:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _is_vnni_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
    """This family's RHS data layouts with an LHS the tiles read: NEON (nibble factor 16, nr = 4, blen = 8, kbl
    4, 8 or 16 and mr ≤ 4, so that a block of BLOCK_K values of an LHS group is at most 64 contiguous bytes) or
    SME2 (nibble factor 1, blen = 2, nr % 16 == 0, kbl = 4); k_int a positive multiple of 32, nr·k_int/2 entries
    in k_lo and k_hi, probed against the layout's formula over their first two and last periods (NEON: 64 bytes,
    a block of 32 K; SME2: 4·nr bytes, two K groups of all nr columns)."""
    size = nr * k_int // 2
    if k_int <= 0 or k_int % 32 or k_lo.size != size or k_hi.size != size:
        return False
    if nibble_factor == NEON_NIBBLE_FACTOR:
        if not (nr == NEON_NR and blen == NEON_BLEN and kbl % KR == 0 and BLOCK_K % kbl == 0 and mr <= 4):
            return False
        period = 64
    elif nibble_factor == SME_NIBBLE_FACTOR:
        if not (blen == SME_BLEN and nr % VEC_COLS == 0 and kbl == KR):
            return False
        period = 2 * SME_BLEN * nr
    else:
        return False
    head = min(size, 2 * period)
    tail = max(head, size - period)
    return _layout_matches(k_lo, k_hi, 0, head, nr, nibble_factor) and _layout_matches(
        k_lo, k_hi, tail, size, nr, nibble_factor
    )


@numba.njit(cache=True, nogil=True)
def _matmul(m, n, k_int, mr, nr, kbl, nibble_factor, lhs_i8, rhs_u8, fma_bias, out):
    """out[m, n] (C-contiguous, unclamped) of a layout :func:`_is_vnni_layout` accepts."""
    if nibble_factor == NEON_NIBBLE_FACTOR:
        _matmul_neon(m, n, k_int, mr, kbl, lhs_i8, fma_bias, rhs_u8, out)
    else:
        _matmul_sme(m, n, k_int, mr, nr, lhs_i8, fma_bias, rhs_u8, out)


def tiles(m, n, k_int, lhs_i8, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out) -> bool:
    """Run a call of ``jit.matmul_qai8dxp`` on the VNNI tiles and return True if they take it (this family's NEON and
    SME2 layouts), else return False. Needs AVX-512 VNNI."""
    if _is_vnni_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
        _matmul(m, n, k_int, mr, nr, kbl, nibble_factor, lhs_i8, rhs_u8, recipe == RECIPE_FMA_BIAS, out)
        return True
    return False
