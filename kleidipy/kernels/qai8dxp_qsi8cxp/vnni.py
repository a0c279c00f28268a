"""AVX-512 VNNI host execution of the Q8_0 kernels' int8 layouts: the SME/SME2 ones
(``…qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme{,2}_mopa``, ``…qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme{,2}_dot``) and the NEON ones
(``…qai8dxp{4x4,1x4}_qsi8cxp4x4_{16x4,1x4}_neon_dotprod``, ``…qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod``,
``…qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm``): :func:`matmul` runs the layouts :func:`is_vnni_layout` accepts with
``vpdpbusd``, the bits of :func:`kleidipy.kernels.qai8dxp_qsi8cxp.jit.matmul_qai8dxp` (the family's tile chain,
``ukernels.matmul_tiled``, takes it on a host with AVX-512 VNNI). Hand-written LLVM IR (:mod:`kleidipy.core.vnni`)
because numba does not emit ``vpdpbusd`` from Python loops.

Layouts read (k_int = roundup(k, 32)): the LHS group of mr rows holds the int8 of (row r, k) at
(k//kbl)·mr·kbl + r·kbl + k%kbl, then mr int32 −zp, mr f32 recips; the RHS group of nr columns holds the int8 of
(column c, k) at (k//kr)·nr·kr + c·kr + k%kr, then nr int32 row sums, nr f32 scales, nr f32 biases.

How: each RHS byte is flipped to the unsigned w + 128 (XOR 0x80) and ``vpdpbusd`` multiplies it by signed LHS
bytes: Σ q·(w + 128) = Σ q·w + 128·Σq, so the int32 sum gets −128·Σq of the row (over k_int, as the kernels' dot
runs over the padded K too). Everything is int32 arithmetic modulo 2^32, like the kernels' wrapping MLA, so
acc = Σ q·w + (−zp)·rowsum exactly, whatever the order of the terms; then F = f32(acc), S = f32(scale·recip) and
the recipe's ``fma(S, F, bias)`` or ``f32(F·S) + bias``.

* SME layouts (kr = kbl = 4, nr % 16 == 0): 16 columns of one K group of 4 per 512-bit vector, the LHS group's
  4 bytes broadcast; register tiles of rows × 4 vectors (64 columns).
* NEON layouts (nr = 4, kr = 4 or 8): one 64-byte load of a group's data is a block of 16 K values of its 4
  columns, lane L holding column ``(4L // kr) % 4`` and the K group of 4 ``(L // kr)·(kr/4) + L % (kr/4)``. A
  row's LHS vector for the block is the block's mr·16 LHS bytes (every row of its group) put in that order by
  one ``vpermd``; one accumulator per (row, group) sums each column in 4 lanes, added up by lane shuffles after
  the K loop. Register tiles: 4 rows × 4 groups (16 columns), swept over panels of columns whose packed RHS stays
  in L2. A lone row (the GEMV) reads the 4 groups one after the other — one memory stream; side by side they were
  4 short streams that ran at half the bandwidth from memory — with 4 accumulator chains per group and its LHS
  vectors permuted once per call (:func:`gemv_lhs`).
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni, vnni_columns
from kleidipy.core.vnni import F32, F32X16, I8X64, I32, I32X16, I64, i64

#: the host runs these tiles (the family's tile chain takes them then).
HAVE_VNNI = vnni.HAS_AVX512_VNNI

KR = 4
VEC_COLS = 16
TILE_VECS = 4
TILE_COLS = VEC_COLS * TILE_VECS
#: rows of the GEMM register tile (4 × 4 int32 accumulators; 6 rows measured slower: address registers spill).
GEMM_ROWS = 4
#: NEON layouts: columns of an RHS group (nr), the kr values, K values in one 64-byte load of a group (a block)
NEON_NR = 4
NEON_KRS = (4, 8)
BLOCK_K = 64 // NEON_NR
#: RHS groups of a NEON tile (16 columns)
NEON_GROUPS = VEC_COLS // NEON_NR
#: accumulators of a one-row NEON tile's K loop per group (vpdpbusd's latency)
GEMV_CHAINS = 4
#: bytes of packed RHS per panel of columns the row tiles sweep (it stays in L2)
PANEL_BYTES = 1 << 19


def int8_weights(b: ir.IRBuilder, src: ir.Value) -> ir.Value:
    """The 64 int8 RHS bytes at src (16 columns × a K group of 4) as the unsigned bytes w + 128 of an i32x16."""
    return b.bitcast(b.xor(vnni.load(b, src, I8X64), vnni.const_splat(I8X64, 0x80)), I32X16)


def make_sme_tile(rows_max: int, group_bytes: int = KR, weights: Callable = int8_weights):
    """Intrinsic ``tile(geo, lhs, corr, rhs, out, i0, rows, j0, fma_bias)``: rows i0 … i0 + rows − 1 (at most
    ``rows_max``; the tile computes repeats of the last row for the others) × the 64 columns from j0 of an SME
    layout whose column holds ``group_bytes`` bytes per K group of 4 (4: int8; 2: the int4 family's nibbles), read
    by ``weights(builder, ptr)`` as the unsigned bytes w + z of 16 columns (z = 128 for int8).
    geo = (mr, nr, n, k_int); corr[i] = −z·Σq of row i. The RHS is read as one stream per 64 columns, left to the
    hardware prefetcher: a software prefetch 24 K groups ahead made a cold one-row tile (the GEMV) slower on this
    project's machine (49152 × 576 int8: ~26 GB/s with it, ~32 without)."""

    @intrinsic
    def tile(typingctx, geo, lhs, corr, rhs, out, i0, rows, j0, fma_bias):
        sig = types.void(geo, lhs, corr, rhs, out, types.int64, types.int64, types.int64, types.boolean)

        def codegen(context, builder, signature, args):
            vnni.require_vnni()
            (mr, nr, n, k_int), lhs_p, corr_p, rhs_p, out_p, i0_v, rows_v, j0_v, fma_v = vnni.intrinsic_args(
                context, builder, signature, args
            )
            b = builder
            lhs_params = b.mul(mr, k_int)
            data_bytes = b.udiv(b.mul(nr, b.mul(k_int, i64(group_bytes))), i64(KR))
            row_ptrs = []
            for r in range(rows_max):
                i = b.add(i0_v, b.select(b.icmp_signed("<", i64(r), rows_v), i64(r), b.sub(rows_v, i64(1))))
                g, ri = b.udiv(i, mr), b.urem(i, mr)
                base = b.add(b.mul(g, b.mul(mr, b.add(k_int, i64(8)))), b.mul(ri, i64(KR)))
                row_ptrs.append((vnni.byte_ptr(b, lhs_p, base), i))
            col_ptrs = []
            for v in range(TILE_VECS):
                col = b.add(j0_v, i64(VEC_COLS * v))
                col = b.select(b.icmp_signed("<", col, n), col, j0_v)  # vectors past n re-read the first
                group = vnni.byte_ptr(b, rhs_p, b.mul(b.udiv(col, nr), b.add(data_bytes, b.mul(nr, i64(12)))))
                c = b.urem(col, nr)
                params = vnni.byte_ptr(b, group, b.add(data_bytes, b.mul(c, i64(4))))
                col_ptrs.append((vnni.byte_ptr(b, group, b.mul(c, i64(group_bytes))), params))
            iacc = [[cgutils.alloca_once(b, I32X16) for _ in range(TILE_VECS)] for _ in row_ptrs]
            for r, (_, i) in enumerate(row_ptrs):
                c = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, corr_p, b.mul(i, i64(4))), I32), I32X16)
                for v in range(TILE_VECS):
                    b.store(c, iacc[r][v])
            lstep, rstep = b.mul(mr, i64(KR)), b.mul(nr, i64(group_bytes))
            with cgutils.for_range(b, b.udiv(k_int, i64(KR))) as loop:
                roff, loff = b.mul(loop.index, rstep), b.mul(loop.index, lstep)
                w = []
                for ptr, _ in col_ptrs:
                    w.append(weights(b, vnni.byte_ptr(b, ptr, roff)))
                for r, (ptr, _) in enumerate(row_ptrs):
                    q = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, loff), I32), I32X16)
                    for v in range(TILE_VECS):
                        b.store(vnni.dpbusd(b, b.load(iacc[r][v]), w[v], q, True), iacc[r][v])
            cols = [
                [
                    vnni.load(b, vnni.byte_ptr(b, par, b.mul(nr, i64(4 * f))), ty)
                    for f, ty in enumerate((I32X16, F32X16, F32X16))
                ]
                for _, par in col_ptrs
            ]
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


_tile_gemv = make_sme_tile(1)
_tile_gemm = make_sme_tile(GEMM_ROWS)


@numba.njit(cache=True, nogil=True)
def _matmul_sme(m, n, k_int, mr, nr, lhs_i8, rhs_u8, fma_bias, out):
    geo = (np.int64(mr), np.int64(nr), np.int64(n), np.int64(k_int))
    corr = vnni.neg_block_sums(
        vnni.VNNI512,
        lhs_i8.view(np.uint8),
        m,
        mr,
        mr * (k_int + 8),
        np.int64(1),
        np.int64(0),
        k_int // KR,
        np.int64(128),
    )
    for j0 in range(0, n, TILE_COLS):
        for i0 in range(0, m, GEMM_ROWS):
            rows = min(GEMM_ROWS, m - i0)
            if rows == 1:
                _tile_gemv(geo, lhs_i8, corr, rhs_u8, out, i0, 1, j0, fma_bias)
            else:
                _tile_gemm(geo, lhs_i8, corr, rhs_u8, out, i0, rows, j0, fma_bias)


# --------------------------------------------------------------------------------------------- NEON layouts


@numba.njit(cache=True, nogil=True)
def _lane_k_group(lane, kr):
    """K group of 4 (in its block of BLOCK_K) of 32-bit lane ``lane`` of a 64-byte load of a NEON group's data."""
    return (lane // kr) * (kr // KR) + lane % (kr // KR)


def group_params(builder, groups: list, data_bytes, field: int, ty: ir.Type):
    """The 16 values (4 per group, NEON_NR-wide fields after a group's data) of parameter ``field`` (0 row sums,
    1 scales, 2 biases) of 4 groups, as one 16-lane vector."""
    quarter = ir.VectorType(ty, NEON_NR)
    parts = [
        vnni.load(builder, vnni.byte_ptr(builder, g, builder.add(data_bytes, i64(4 * NEON_NR * field))), quarter)
        for g in groups
    ]
    return vnni.concat(builder, parts)


def lhs_rows(b, rows: int, lhs_p, table_p, index_p, i0):
    """Per row i0 + r of a tile, from the row table of :func:`neon_rows`: (pointer to its group in the packed
    LHS, the vpermd index of its lanes, its byte offset among the group's mr int32/f32 parameters)."""
    out = []
    for r in range(rows):
        entry = vnni.byte_ptr(b, table_p, b.mul(b.add(i0, i64(r)), i64(16)))
        base, sel = vnni.load(b, entry, I64), vnni.load(b, vnni.byte_ptr(b, entry, 8), I64)
        index = vnni.load(b, vnni.byte_ptr(b, index_p, sel), I32X16)
        out.append((vnni.byte_ptr(b, lhs_p, base), index, b.udiv(sel, i64(VEC_COLS))))
    return out


def lhs_block(b, row, mr, block):
    """A row's LHS vector for K block ``block``: lane L holds the 4 int8 of K group 4·block + _lane_k_group(L, kr),
    the block's mr·16 bytes (every row of the group) permuted by the row's index."""
    ptr, index, _ = row
    src = vnni.byte_ptr(b, ptr, b.mul(block, b.mul(mr, i64(BLOCK_K))))
    return vnni.permute(b, vnni.masked_load(b, src, I32X16, b.mul(mr, i64(4))), index)


def _neon_weights(b, ptr, block):
    """The 64 RHS bytes of K block ``block`` of a group as the unsigned bytes w + 128 of an i32x16."""
    return int8_weights(b, vnni.byte_ptr(b, ptr, b.mul(block, i64(64))))


def _neon_params(b, gptrs, data_bytes):
    """The row sums, scales and biases of the 16 columns of 4 RHS groups."""
    return [group_params(b, gptrs, data_bytes, f, ty) for f, ty in enumerate((I32, F32, F32))]


def _neon_store(b, params, accs, zp, corr, i, geo, j0, fma, out_p, kr):
    """Row i's 16 columns from j0 into out (when i < m, columns < n): its 4 group accumulators summed per column,
    plus corr (−128·Σq) and −zp·rowsum, scaled by scale·recip (recip the f32 after the mr int32 at zp) and
    biased by the recipe. params: :func:`_neon_params`; geo = (m, n, mr)."""
    m, n, mr = geo
    sums, scale, bias = params
    o = vnni.splat(b, vnni.load(b, zp, I32), I32X16)
    rc = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, zp, b.mul(mr, i64(4))), F32), F32X16)
    f = b.sitofp(b.add(b.add(vnni_columns.sum_columns(b, accs, kr), corr), b.mul(o, sums)), F32X16)
    s = b.fmul(scale, rc)
    res = b.select(fma, vnni.fma(b, s, f, bias), b.fadd(b.fmul(f, s), bias))
    with b.if_then(b.and_(b.icmp_signed("<", i, m), b.icmp_signed("<", j0, n))):
        dst = b.mul(b.add(b.mul(i, n), j0), i64(4))
        vnni.masked_store(b, res, vnni.byte_ptr(b, out_p, dst), b.sub(n, j0))


def _make_neon_tile(kr: int):
    """Intrinsic ``tile(geo, lhs, table, index, corr, rhs, out, i0, j0, fma_bias)``: rows i0 … i0 + GEMM_ROWS − 1
    (rows past m, as :func:`neon_rows` gives them, are computed and not stored) × the 16 columns from j0 of the
    packed LHS and RHS. geo = (m, n, k_int, mr)."""

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
            data_bytes = b.mul(k_int, i64(NEON_NR))
            (gptrs,) = vnni.group_bases(b, rhs_p, j0_v, n, b.add(data_bytes, i64(NEON_NR * 12)), 1, NEON_NR)
            lrows = lhs_rows(b, GEMM_ROWS, lhs_p, table_p, index_p, i0_v)
            zero = vnni.const_splat(I32X16, 0)
            iacc = [[cgutils.alloca_once_value(b, zero) for _ in gptrs] for _ in lrows]
            with cgutils.for_range(b, b.udiv(k_int, i64(BLOCK_K))) as loop:
                w = [_neon_weights(b, ptr, loop.index) for ptr in gptrs]
                for r, row in enumerate(lrows):
                    q = lhs_block(b, row, mr, loop.index)
                    for g in range(NEON_GROUPS):
                        b.store(vnni.dpbusd(b, b.load(iacc[r][g]), w[g], q, True), iacc[r][g])
            params = _neon_params(b, gptrs, data_bytes)
            for r, (ptr, _, param) in enumerate(lrows):
                i = b.add(i0_v, i64(r))
                zp = vnni.byte_ptr(b, ptr, b.add(b.mul(mr, k_int), param))
                c = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, corr_p, b.mul(i, i64(4))), I32), I32X16)
                accs = [b.load(a) for a in iacc[r]]
                _neon_store(b, params, accs, zp, c, i, (m, n, mr), j0_v, fma_v, out_p, kr)
            return context.get_dummy_value()

        return sig, codegen

    return tile


def _make_neon_gemv_tile(kr: int):
    """Intrinsic ``tile(geo, qvec, corr, rhs, out, j0, fma_bias)``: a lone row (from :func:`gemv_lhs`) × the 16
    columns from j0. It reads its 4 RHS groups one after the other — one memory stream, which the hardware
    prefetcher follows (4 streams of one group each ran at half the bandwidth from memory) — each with
    GEMV_CHAINS accumulators over the K blocks (int32 wrapping sums: any order gives the same bits).
    geo = (n, k_int)."""

    @intrinsic
    def tile(typingctx, geo, qvec, corr, rhs, out, j0, fma_bias):
        sig = types.void(geo, qvec, corr, rhs, out, types.int64, types.boolean)

        def codegen(context, builder, signature, args):
            vnni.require_vnni()
            (n, k_int), q_p, corr_p, rhs_p, out_p, j0_v, fma_v = vnni.intrinsic_args(context, builder, signature, args)
            b = builder
            data_bytes = b.mul(k_int, i64(NEON_NR))
            (gptrs,) = vnni.group_bases(b, rhs_p, j0_v, n, b.add(data_bytes, i64(NEON_NR * 12)), 1, NEON_NR)
            blocks = b.udiv(k_int, i64(BLOCK_K))
            whole = b.udiv(blocks, i64(GEMV_CHAINS))
            zero = vnni.const_splat(I32X16, 0)

            def step(ptr, acc, block):
                q = vnni.load(b, vnni.byte_ptr(b, q_p, b.mul(block, i64(64))), I32X16)
                b.store(vnni.dpbusd(b, b.load(acc), _neon_weights(b, ptr, block), q, True), acc)

            accs = []
            for ptr in gptrs:
                chains = [cgutils.alloca_once_value(b, zero) for _ in range(GEMV_CHAINS)]
                with cgutils.for_range(b, whole) as loop:
                    for c, acc in enumerate(chains):
                        step(ptr, acc, b.add(b.mul(loop.index, i64(GEMV_CHAINS)), i64(c)))
                with cgutils.for_range(b, b.sub(blocks, b.mul(whole, i64(GEMV_CHAINS)))) as tail:
                    step(ptr, chains[0], b.add(b.mul(whole, i64(GEMV_CHAINS)), tail.index))
                total = b.load(chains[0])
                for acc in chains[1:]:
                    total = b.add(total, b.load(acc))
                accs.append(total)
            zp = vnni.byte_ptr(b, q_p, b.mul(k_int, i64(4)))
            c = vnni.splat(b, vnni.load(b, corr_p, I32), I32X16)
            params = _neon_params(b, gptrs, data_bytes)
            _neon_store(b, params, accs, zp, c, i64(0), (i64(1), n, i64(1)), j0_v, fma_v, out_p, kr)
            return context.get_dummy_value()

        return sig, codegen

    return tile


#: NEON tiles per kr: 1 row × 16 columns (a lone row: the GEMV), GEMM_ROWS rows × 16 columns
_NEON_GEMV = {kr: _make_neon_gemv_tile(kr) for kr in NEON_KRS}
_NEON_GEMM = {kr: _make_neon_tile(kr) for kr in NEON_KRS}
_neon_gemv_kr4, _neon_gemv_kr8 = _NEON_GEMV[4], _NEON_GEMV[8]
_neon_gemm_kr4, _neon_gemm_kr8 = _NEON_GEMM[4], _NEON_GEMM[8]


@intrinsic
def _neon_row_sums(typingctx, geo, lhs, table, index, corr):
    """corr[i] = −128·Σq of row i < ``rows`` over k_int (wrapping): −32·Σ of the bytes of its LHS vectors, in
    which every K group sits in 4 lanes. geo = (rows, k_int, mr)."""
    sig = types.void(geo, lhs, table, index, corr)

    def codegen(context, builder, signature, args):
        vnni.require_vnni()
        (rows, k_int, mr), lhs_p, table_p, index_p, corr_p = vnni.intrinsic_args(context, builder, signature, args)
        b = builder
        ones = vnni.const_splat(I32X16, 0x01010101)
        with cgutils.for_range(b, rows) as loop:
            (row,) = lhs_rows(b, 1, lhs_p, table_p, index_p, loop.index)
            total = cgutils.alloca_once_value(b, vnni.const_splat(I32X16, 0))
            with cgutils.for_range(b, b.udiv(k_int, i64(BLOCK_K))) as blocks:
                b.store(vnni.dpbusd(b, b.load(total), ones, lhs_block(b, row, mr, blocks.index), True), total)
            s = b.mul(vnni.reduce_add(b, b.load(total)), ir.Constant(I32, -32))
            vnni.store(b, s, vnni.byte_ptr(b, corr_p, b.mul(loop.index, i64(4))))
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def neon_rows(m, k_int, mr, kbl, kr, lhs_i8):
    """What the NEON tiles read per LHS row, for rows padded to a multiple of GEMM_ROWS (the padding rows repeat
    row m − 1): the row table (byte offset of its group, byte offset of its vpermd index), the vpermd index of
    each row of a group — lane L of row r's vector for a K block is word index[r, L] of the block's mr·16 bytes
    (int8 (r, k) at (k//kbl)·mr·kbl + r·kbl + k%kbl): its K group _lane_k_group(L, kr) — and −128·Σq."""
    index = np.empty((mr, VEC_COLS), np.int32)
    for r in range(mr):
        for lane in range(VEC_COLS):
            kk = KR * _lane_k_group(lane, kr)
            index[r, lane] = ((kk // kbl) * mr * kbl + r * kbl + kk % kbl) // 4
    rows = (m + GEMM_ROWS - 1) // GEMM_ROWS * GEMM_ROWS
    table = np.empty((rows, 2), np.int64)
    for i in range(rows):
        row = min(i, m - 1)
        table[i, 0] = row // mr * mr * (k_int + 8)
        table[i, 1] = row % mr * 4 * VEC_COLS
    corr = np.empty(rows, np.int32)
    _neon_row_sums((np.int64(rows), np.int64(k_int), np.int64(mr)), lhs_i8, table, index, corr)
    return table, index, corr


@numba.njit(cache=True, nogil=True)
def gemv_lhs(k_int, mr, table, index, lhs_i8):
    """Row 0's LHS vectors as the one-row tile reads them, one per K block (lane L of block blk: word
    index[r, L] of the block's mr·16 bytes, r its row in its group — what :func:`lhs_block` computes), then its
    −zp (int32) and recip (f32 bits)."""
    words = lhs_i8.view(np.int32)
    base, r = table[0, 0] // 4, table[0, 1] // (4 * VEC_COLS)
    qvec = np.empty(k_int + 2, np.int32)
    for blk in range(k_int // BLOCK_K):
        for lane in range(VEC_COLS):
            qvec[blk * VEC_COLS + lane] = words[base + blk * mr * 4 + index[r, lane]]
    params = base + mr * k_int // 4
    qvec[k_int] = words[params + r]
    qvec[k_int + 1] = words[params + mr + r]
    return qvec


@numba.njit(cache=True, nogil=True)
def _matmul_neon(m, n, k_int, mr, kbl, kr, lhs_i8, rhs_u8, fma_bias, out):
    table, index, corr = neon_rows(m, k_int, mr, kbl, kr, lhs_i8)
    if m == 1:
        qvec, gemv_geo = gemv_lhs(k_int, mr, table, index, lhs_i8), (np.int64(n), np.int64(k_int))
        for j0 in range(0, n, VEC_COLS):
            if kr == 4:
                _neon_gemv_kr4(gemv_geo, qvec, corr, rhs_u8, out, j0, fma_bias)
            else:
                _neon_gemv_kr8(gemv_geo, qvec, corr, rhs_u8, out, j0, fma_bias)
        return
    geo = (np.int64(m), np.int64(n), np.int64(k_int), np.int64(mr))
    panel = max(1, PANEL_BYTES // (TILE_COLS * k_int)) * TILE_COLS
    for j0 in range(0, n, panel):  # a panel of columns whose RHS stays in L2 across the row tiles
        j1 = min(n, j0 + panel)
        for i0 in range(0, m, GEMM_ROWS):
            for jj in range(j0, j1, VEC_COLS):
                if kr == 4:
                    _neon_gemm_kr4(geo, lhs_i8, table, index, corr, rhs_u8, out, i0, jj, fma_bias)
                else:
                    _neon_gemm_kr8(geo, lhs_i8, table, index, corr, rhs_u8, out, i0, jj, fma_bias)


# --------------------------------------------------------------------------------------------- entry points


@numba.njit(cache=True, nogil=True)
def matmul(m, n, k_int, mr, nr, kbl, kr, lhs_i8, rhs_u8, fma_bias, out):
    """out[m, n] (C-contiguous, unclamped) of an int8 layout :func:`is_vnni_layout` accepts."""
    if nr == NEON_NR:
        _matmul_neon(m, n, k_int, mr, kbl, kr, lhs_i8, rhs_u8, fma_bias, out)
    else:
        _matmul_sme(m, n, k_int, mr, nr, lhs_i8, rhs_u8, fma_bias, out)


@numba.njit(cache=True, nogil=True)
def is_vnni_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
    """The RHS data layout of ``rhs_pack_nxk_qsi8cxp_qsi8cx_neon`` (int8 (c, k) at (k//kr)·nr·kr + c·kr + k%kr,
    kr = blen; probed at its first two chunks and last entry) with an LHS the tiles read: the SME layouts
    (kr = kbl = 4, nr % 16 == 0) or the NEON ones (nr = 4, kr 4 or 8; kbl 4, 8 or 16 and mr ≤ 4, so that a K
    block of BLOCK_K values of an LHS group is at most 64 contiguous bytes)."""
    if nibble_factor != 0 or k_hi.size != 0 or k_lo.size != nr * k_int:
        return False
    sme = kbl == KR and blen == KR and nr % VEC_COLS == 0
    neon = nr == NEON_NR and (blen == 4 or blen == 8) and kbl % KR == 0 and BLOCK_K % kbl == 0 and mr <= 4
    if not (sme or neon):
        return False
    chunk = nr * blen
    for e in range(min(k_lo.size, 2 * chunk)):
        if k_lo[e] != (e // chunk) * blen + e % blen:
            return False
    return k_lo[k_lo.size - 1] == k_int - 1
