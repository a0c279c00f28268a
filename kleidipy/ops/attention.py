"""Causal attention over the KV cache as compiled tiles, with one fixed order of operations: llama.cpp's attention
without flash attention as ggml-cpu computes it on Arm (NEON, F16 or F32 cache), stated in :func:`attention`. Also
owns the layout of a layer of the KV cache (:func:`store_kv` writes it, :func:`cells` reads it).

The inner tiles are llvmlite IR: numba does not vectorize these loops over 16 lanes of 16 cells into 512-bit
registers by itself.

The cache layout and why: docs/attention.md."""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.node import P_GEMM_KXN, call_gemm_kxn
from kleidipy.core.numerics import fma32, round_f16_scalar
from kleidipy.core.vnni import F32, F32X16
from kleidipy.ops.elementwise import _load_cell, _store_cell, expf_ir, softcap_value

#: lanes of ggml_vec_dot_f16 / ggml_vec_dot_f32 on NEON: GGML_F32_ARR (4) registers of 4 floats
LANES = 16
#: cells whose KQ lanes attention computes together (the order within each cell is the same for any block)
_BLOCK = 512
#: query rows of a batch that share each K and V vector the tiles load (:func:`_kq_rows`, :func:`_kqv_rows`)
ROWS = 4
#: groups of 16 columns whose KQV sums :func:`_kqv_rows` keeps in flight together (ROWS x 4 of the 32 vector registers)
_COLUMN_BLOCKS = 4


def attention_scratch_size(n_ctx: int, head_dim: int) -> int:
    """float32 elements of :func:`attention`'s scratch for one thread, for any n_kv <= n_ctx, with n16 = n_ctx
    rounded up to 16: V of one KV head as f32 in blocks (n16 * head_dim), K of one KV head as f32 in blocks or the
    KQ lanes of one row (the larger of n16 * head_dim and 16 * n_ctx), and for :data:`ROWS` query rows their scores
    (n16 each), KQV lanes (16 * head_dim each) and queries (head_dim each)."""
    n16 = -(-n_ctx // LANES) * LANES
    return n16 * head_dim + max(n16 * head_dim, LANES * n_ctx) + ROWS * (n16 + (LANES + 1) * head_dim)


def cache_blocks(n_ctx: int) -> int:
    """Blocks of 16 cells of a cache of n_ctx cells (the layout: docs/attention.md)."""
    return -(-n_ctx // LANES)


def cells(a: np.ndarray) -> np.ndarray:
    """Cache cells as the compiled ops take them: F16 values as their uint16 bit patterns (a view), float32 as they
    are."""
    return a.view(np.uint16) if a.dtype == np.float16 else a


@numba.njit(cache=True, nogil=True)
def store_kv(k, v, kc, vc, start, m, h0, h1):
    """Write K and V of rows 0..m-1 (k, v [m, n_head_kv*head_dim] float32) into KV heads h0..h1-1 of one layer of
    the cache at positions start..start+m-1, kc [n_head_kv, nb, head_dim·16] and vc [n_head_kv, 16, nb·head_dim]
    (docs/attention.md): a uint16 array of F16 bits (the F16 cache, rounded to nearest even as numpy's astype) or
    float32."""
    d = kc.shape[2] // LANES
    for h in range(h0, h1):
        for t in range(m):
            p = start + t
            kb, lane, vrow = kc[h, p // LANES], p % LANES, _v_row(vc[h], p, d)
            for c in range(d):
                kb[c * LANES + lane] = _store_cell(kc, k[t, h * d + c])
                vrow[c] = _store_cell(vc, v[t, h * d + c])


@numba.njit(cache=True, nogil=True, inline="always")
def _v_row(vh, j, d):
    """Cell j's row of V of one head vh [16, nb·d] (the cache's layout)."""
    return vh[j % LANES, j // LANES * d : (j // LANES + 1) * d]


@numba.njit(cache=True, nogil=True, inline="always")
def _k_cell(kh, j, c):
    """Dimension c of cell j of K of one head kh [nb, d·16] (the cache's layout)."""
    return kh[j // LANES, c * LANES + j % LANES]


@numba.njit(cache=True, nogil=True)
def _reduce_lanes(p, a, b, out):
    """out[t] = GGML_F32x4_REDUCE of the 16 lanes p[:, a + t] (p [16, >= b]) for t < b - a: halves added lane-wise
    (registers 0+2 and 1+3, then 0+1), then vaddvq_f32, which is pairwise on AArch64 (FADDP twice:
    (v0+v1) + (v2+v3))."""
    p0, p1, p2, p3, p4, p5 = p[0, a:b], p[1, a:b], p[2, a:b], p[3, a:b], p[4, a:b], p[5, a:b]
    p6, p7, p8, p9, p10, p11 = p[6, a:b], p[7, a:b], p[8, a:b], p[9, a:b], p[10, a:b], p[11, a:b]
    p12, p13, p14, p15 = p[12, a:b], p[13, a:b], p[14, a:b], p[15, a:b]
    for t in range(b - a):
        v0 = (p0[t] + p8[t]) + (p4[t] + p12[t])
        v1 = (p1[t] + p9[t]) + (p5[t] + p13[t])
        v2 = (p2[t] + p10[t]) + (p6[t] + p14[t])
        v3 = (p3[t] + p11[t]) + (p7[t] + p15[t])
        out[t] = (v0 + v1) + (v2 + v3)


def _cells(f16: bool) -> tuple[ir.Value, ir.Type]:
    """For the row tiles: the element size and the vector type of a load of 16 K or V elements (F16 bits or
    float32)."""
    return vnni.i64(2 if f16 else 4), ir.VectorType(ir.IntType(16), 16) if f16 else F32X16


def _per_row_count(b: ir.IRBuilder, nr: ir.Value, emit: Callable[[list[ir.Value]], None]) -> None:
    """Emit a row tile once for each count of rows 1..ROWS (``emit(rows)``, rows the constant indices 0..count-1)
    and run the one for nr (1 <= nr <= ROWS): a group of 3 query heads (GQA 9/3) does not pay for a fourth."""
    for count in range(1, ROWS + 1):
        with b.if_then(b.icmp_signed("==", nr, vnni.i64(count))):
            emit([vnni.i64(t) for t in range(count)])


@intrinsic
def _kq_rows(typingctx, qv, k, c_stride, b_stride, b0, blocks, s, o0, nr):  # pragma: no cover - compile time
    """The KQ dot of :func:`attention` (16 lanes, fused multiply-adds in increasing dimension, reduced as
    :func:`_reduce_lanes`) for the nr <= ROWS query rows of qv [ROWS, d]
    (d a multiple of 16) at once, over blocks b0 .. b0 + blocks - 1 of 16 cells of K (F16 bits or float32: cell i of
    block b, dimension c is element ``b·b_stride + c·c_stride + i`` of k: c_stride 16, b_stride 16·d, for the cache's
    K of one head [nb, d·16] and its f32 copy [nb, d, 16] (:func:`_load_blocks`)), into s[t, o0 + 16·b
    ..] (s [ROWS, n16]). Each K vector is loaded (and widened) once for all the rows; lanes are taken four at a time
    (l, l+8, l+4, l+12: the first step of the reduction), so that few registers stay live. Each cell's dot reads
    that cell's K alone: cells of a block past the last one wanted may hold anything (their scores are not read)."""
    i64 = types.int64
    sig = types.void(qv, k, i64, i64, i64, i64, s, i64, i64)
    f16 = k.dtype == types.uint16

    def codegen(context, builder, signature, args):
        b = builder
        q_p, k_p, s_p = (vnni.array_ptr(context, b, signature.args[i], args[i]) for i in (0, 1, 6))
        c_stride, b_stride, b0, blocks_v, o0, nr = args[2], args[3], args[4], args[5], args[7], args[8]
        d = b.extract_value(context.make_array(signature.args[0])(context, b, args[0]).shape, 1)
        s_row = b.extract_value(context.make_array(signature.args[6])(context, b, args[6]).strides, 0)
        esize, cells = _cells(f16)

        def emit(rows: list[ir.Value]) -> None:
            acc = [[cgutils.alloca_once(b, F32X16) for _ in range(4)] for _ in rows]
            with cgutils.for_range(b, blocks_v) as blk:
                kblk = b.mul(b.add(b0, blk.index), b_stride)
                v = [[] for _ in rows]
                for r in range(4):
                    lanes = (r, r + 8, r + 4, r + 12)
                    for row in acc:
                        for a in row:
                            b.store(vnni.const_splat(F32X16, 0.0), a)
                    with cgutils.for_range(b, b.udiv(d, vnni.i64(LANES))) as cb:
                        for k, lane in enumerate(lanes):
                            c = b.add(b.mul(cb.index, vnni.i64(LANES)), vnni.i64(lane))
                            at = b.mul(b.add(kblk, b.mul(c, c_stride)), esize)
                            kv = vnni.load(b, vnni.byte_ptr(b, k_p, at), cells)
                            kv = vnni.f16_bits_to_f32(b, kv, True) if f16 else kv
                            for t in range(len(rows)):
                                at = b.mul(b.add(b.mul(rows[t], d), c), vnni.i64(4))
                                qc = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, q_p, at), F32), F32X16)
                                b.store(vnni.fma(b, qc, kv, b.load(acc[t][k])), acc[t][k])
                    for t in range(len(rows)):
                        p = [b.load(a) for a in acc[t]]
                        v[t].append(b.fadd(b.fadd(p[0], p[1]), b.fadd(p[2], p[3])))
                j = b.add(o0, b.mul(b.add(b0, blk.index), vnni.i64(LANES)))
                for t in range(len(rows)):
                    total = b.fadd(b.fadd(v[t][0], v[t][1]), b.fadd(v[t][2], v[t][3]))
                    at = b.add(b.mul(rows[t], s_row), b.mul(j, vnni.i64(4)))
                    vnni.store(b, total, vnni.byte_ptr(b, s_p, at))

        _per_row_count(b, nr, emit)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _kq_cells(qv, kh, jlo, jhi, kq, s):
    """KQ of one query row qv [d] over cells jlo..jhi-1 into s[jlo:jhi], K of one head in the cache's blocks kh
    [nb, d·16] (F16 bits or float32), cell by cell with their 16 lanes in kq [16, >= jhi] (the path for a head_dim
    that is not a multiple of 16; the row tiles :func:`_kq_rows` take the others, in the same order)."""
    d = qv.shape[0]
    d16 = d - d % LANES
    kq[:, jlo:jhi] = np.float32(0.0)
    for j0 in range(jlo, jhi, _BLOCK):  # a block of cells at a time: its lanes stay in L1
        j1 = min(j0 + _BLOCK, jhi)
        for c in range(d16):
            qc = qv[c]
            lane = kq[c % LANES, j0:j1]
            for j in range(j1 - j0):
                lane[j] = fma32(qc, _load_cell(_k_cell(kh, j0 + j, c)), lane[j])
    _reduce_lanes(kq, jlo, jhi, s[jlo:jhi])
    sr = s[jlo:jhi]
    for j in range(jhi - jlo):
        if d16 < d:
            dot = np.float64(sr[j])
            for c in range(d16, d):
                dot += np.float64(qv[c] * _load_cell(_k_cell(kh, jlo + j, c)))
            sr[j] = np.float32(dot)


@intrinsic
def _softmax(typingctx, jlo, jhi, sc, f16, s):  # pragma: no cover - compile time
    """Scores s[jlo:jhi] (KQ) -> scaled, softmax weights (rounded to F16 with ``f16``), in place, 16 cells at a time
    from cell jlo - jlo % 16 (s holds at least jhi rounded up to 16 cells; the other cells of those vectors are
    overwritten): ``s * sc``, the max, ``e = expf(s - max)`` (:func:`kleidipy.ops.elementwise.expf_ir`), the sum in
    f64 of ``(e0+e1)+(e2+e3)`` (f32) per 4 cells from cell 0 in increasing order, cells outside jlo..jhi-1 being 0
    (soft_max's vaddvq_f32 groups; llama.cpp pads n_kv to a multiple of 32 with masked cells, so no scalar tail), then
    ``e * (float)(1/sum)``."""
    sig = types.void(types.int64, types.int64, types.float32, types.boolean, s)

    def codegen(context, builder, signature, args):
        b = builder
        jlo, jhi, sc, f16 = args[:4]
        s_p = vnni.array_ptr(context, b, signature.args[4], args[4])
        i32x16 = ir.VectorType(ir.IntType(32), LANES)
        g0 = b.sub(jlo, b.srem(jlo, vnni.i64(LANES)))
        chunks = b.sdiv(b.add(b.sub(jhi, g0), vnni.i64(LANES - 1)), vnni.i64(LANES))
        lo, hi = (vnni.splat(b, b.trunc(v, ir.IntType(32)), i32x16) for v in (jlo, jhi))
        iota = ir.Constant(i32x16, [ir.Constant(ir.IntType(32), i) for i in range(LANES)])
        minus_inf = vnni.const_splat(F32X16, float("-inf"))
        zero = vnni.const_splat(F32X16, 0.0)

        def chunk(c: ir.Value) -> tuple[ir.Value, ir.Value]:
            """The address of chunk c and the mask of its cells in jlo..jhi-1."""
            first = b.add(g0, b.mul(c, vnni.i64(LANES)))
            idx = b.add(vnni.splat(b, b.trunc(first, ir.IntType(32)), i32x16), iota)
            inside = b.and_(b.icmp_signed(">=", idx, lo), b.icmp_signed("<", idx, hi))
            return vnni.byte_ptr(b, s_p, b.mul(first, vnni.i64(4))), inside

        top = cgutils.alloca_once_value(b, minus_inf)
        with cgutils.for_range(b, chunks) as c:
            at, inside = chunk(c.index)
            x = b.fmul(vnni.load(b, at, F32X16), vnni.splat(b, sc, F32X16))
            vnni.store(b, x, at)
            x = b.select(inside, x, minus_inf)
            b.store(b.select(b.fcmp_ordered(">", x, b.load(top)), x, b.load(top)), top)
        mx = vnni.splat(b, vnni.reduce_fmax(b, b.load(top)), F32X16)
        total = cgutils.alloca_once_value(b, ir.Constant(ir.DoubleType(), 0.0))
        with cgutils.for_range(b, chunks) as c:
            at, inside = chunk(c.index)
            e = b.select(inside, expf_ir(b, b.fsub(vnni.load(b, at, F32X16), mx)), zero)
            vnni.store(b, e, at)
            pairs = b.fadd(vnni.pick(b, e, e, list(range(0, 16, 2))), vnni.pick(b, e, e, list(range(1, 16, 2))))
            quads = b.fadd(vnni.pick(b, pairs, pairs, [0, 2, 4, 6]), vnni.pick(b, pairs, pairs, [1, 3, 5, 7]))
            quads = b.fpext(quads, ir.VectorType(ir.DoubleType(), 4))
            t = b.load(total)
            for g in range(4):
                t = b.fadd(t, b.extract_element(quads, ir.Constant(ir.IntType(32), g)))
            b.store(t, total)
        inv = vnni.splat(b, b.fptrunc(b.fdiv(ir.Constant(ir.DoubleType(), 1.0), b.load(total)), F32), F32X16)
        with cgutils.for_range(b, chunks) as c:
            at, _ = chunk(c.index)
            w = b.fmul(vnni.load(b, at, F32X16), inv)
            rounded = vnni.round_f16(b, w, True)
            vnni.store(b, b.select(f16, rounded, w), at)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _softcap(s, jlo, jhi, cap):
    """Scores s[jlo:jhi] soft-capped in place when ``cap`` > 0 (Gemma 2's attn_logit_softcapping, before the
    softmax: :func:`~kleidipy.ops.elementwise.softcap_value`); nothing otherwise."""
    if cap > 0:
        inv = np.float32(1.0) / cap
        for j in range(jlo, jhi):
            s[j] = softcap_value(s[j], inv, cap)


@numba.njit(cache=True, nogil=True)
def _kqv(vh, jlo, jhi, s, acc, out):
    """out [d] = KQV of the weights s[jlo:jhi] over V of one head in the cache's layout vh [16, nb·d], cell by cell
    (the path for a head_dim that is not a multiple of 16; the row tiles take the others); acc [16, d] is work
    space."""
    # KQV: ggml_vec_dot over the cells of each output column: lane j % 16 accumulates w[j] * V[j, c] in increasing j
    # (masked cells' weights are 0: skipped), reduced by _reduce_lanes
    acc[:] = np.float32(0.0)
    d = out.shape[0]
    for j in range(jlo, jhi):
        _kqv_cell(s[j], _v_row(vh, j, d), acc[j % LANES])
    _reduce_lanes(acc, 0, d, out)


@numba.njit(cache=True, nogil=True, inline="always")
def _kqv_cell(wj, vrow, a):
    """One cell of KQV: a[c] = fma(w_j, V[j, c], a[c]) for every column c."""
    for c in range(a.shape[0]):
        a[c] = fma32(wj, _load_cell(vrow[c]), a[c])


@intrinsic
def _kqv_rows(typingctx, w, v, l_stride, b_stride, base, j0, blocks, tail, acc, nr):  # pragma: no cover - compile time
    """:func:`_kqv`'s sums (the same lanes and order) for the nr <= ROWS rows of weights w [ROWS, >= j0 +
    16·blocks + tail] at once: acc[t, l, c] = fma(w[t, j], V[j, c], acc[t, l, c]) for cells j = j0 + 16·blk + l in
    increasing j (j0 a multiple of 16, d of 16; blk < blocks, and blk = blocks too for the lanes l < tail: the cells
    after the whole blocks), V[j, c] being element ``base + l·l_stride + blk·b_stride + c`` of v (F16 bits or
    float32) — V of one head in the cache, lane-major [16, nb·d]: base j0/16·d, l_stride nb·d, b_stride d; or its f32
    copy vb [16, nb, d] from cell ``origin`` (:func:`_load_blocks`): base (j0 - origin)/16·d. One lane and up to
    :data:`_COLUMN_BLOCKS` groups of 16 columns at a time: each V vector is loaded (and widened) once for all the
    rows and each weight broadcast once for all the columns, with ROWS x 4 sums in flight (one group of 16 columns
    at a time left the loop waiting on the latency of each row's fused multiply-add: 2.5x slower)."""
    i64 = types.int64
    sig = types.void(w, v, i64, i64, i64, i64, i64, i64, acc, i64)
    f16 = v.dtype == types.uint16

    def codegen(context, builder, signature, args):
        b = builder
        w_p, v_p, acc_p = (vnni.array_ptr(context, b, signature.args[i], args[i]) for i in (0, 1, 8))
        l_stride, b_stride, base, j0, blocks_v, tail, nr = args[2], args[3], args[4], args[5], args[6], args[7], args[9]
        d = b.extract_value(context.make_array(signature.args[8])(context, b, args[8]).shape, 2)
        w_row = b.extract_value(context.make_array(signature.args[0])(context, b, args[0]).strides, 0)
        esize, cells = _cells(f16)
        wide = vnni.i64(LANES * _COLUMN_BLOCKS)
        whole = b.mul(b.udiv(d, wide), wide)  # (columns in groups of _COLUMN_BLOCKS, then one block at a time)

        def emit(rows: list[ir.Value]) -> None:
            sums = [[cgutils.alloca_once(b, F32X16) for _ in range(_COLUMN_BLOCKS)] for _ in rows]

            def columns(lane: ir.Value, n_blocks: ir.Value, col: ir.Value, width: int) -> None:
                """The sums of ``width`` groups of 16 columns from column ``col`` of lane ``lane``, over its
                blocks."""
                starts = [b.add(b.mul(b.add(b.mul(r, vnni.i64(LANES)), lane), d), col) for r in rows]  # acc[r, l, c]
                acc_at = [[b.mul(b.add(at, vnni.i64(LANES * g)), vnni.i64(4)) for g in range(width)] for at in starts]
                for ps, ats in zip(sums, acc_at, strict=True):
                    for p, at in zip(ps, ats, strict=False):
                        b.store(vnni.load(b, vnni.byte_ptr(b, acc_p, at), F32X16), p)
                stream = b.add(b.add(base, b.mul(lane, l_stride)), col)
                with cgutils.for_range(b, n_blocks) as blk:
                    j = b.add(b.add(j0, b.mul(blk.index, vnni.i64(LANES))), lane)
                    first = b.add(stream, b.mul(blk.index, b_stride))
                    vs = []
                    for g in range(width):
                        vv = vnni.load(b, vnni.byte_ptr(b, v_p, b.mul(b.add(first, vnni.i64(LANES * g)), esize)), cells)
                        vs.append(vnni.f16_bits_to_f32(b, vv, True) if f16 else vv)
                    for r, ps in zip(rows, sums, strict=True):
                        wat = b.add(b.mul(r, w_row), b.mul(j, vnni.i64(4)))
                        wj = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, w_p, wat), F32), F32X16)
                        for p, vv in zip(ps, vs, strict=False):
                            b.store(vnni.fma(b, wj, vv, b.load(p)), p)
                for ps, ats in zip(sums, acc_at, strict=True):
                    for p, at in zip(ps, ats, strict=False):
                        vnni.store(b, b.load(p), vnni.byte_ptr(b, acc_p, at))

            with cgutils.for_range(b, vnni.i64(LANES)) as lane:
                n_blocks = b.add(blocks_v, b.zext(b.icmp_signed("<", lane.index, tail), blocks_v.type))
                with cgutils.for_range(b, b.udiv(d, wide)) as cg:
                    columns(lane.index, n_blocks, b.mul(cg.index, wide), _COLUMN_BLOCKS)
                with cgutils.for_range(b, b.udiv(b.sub(d, whole), vnni.i64(LANES))) as cb:
                    columns(lane.index, n_blocks, b.add(whole, b.mul(cb.index, vnni.i64(LANES))), 1)

        _per_row_count(b, nr, emit)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _load_blocks(kh, vh, origin, hi, kb, vb):
    """Cells origin..hi-1 (origin a multiple of 16) of one KV head of the cache (kh [nb, d·16], vh [16, nb·d]) as
    float32 in the same layout, for the rows of a batch to share: kb [n/16, d, 16] (cells from hi on 0) and vb [16,
    n/16, d] (cell j's row at vb[j % 16, (j - origin) // 16]; rows from hi on not written)."""
    d = kb.shape[1]
    first = origin // LANES
    for blk in range((hi - origin + LANES - 1) // LANES):
        src, dst = kh[first + blk], kb[blk]
        for c in range(d):
            for lane in range(LANES):
                j = origin + blk * LANES + lane
                dst[c, lane] = _load_cell(src[c * LANES + lane]) if j < hi else np.float32(0.0)
    for j in range(origin, hi):
        src, dst = _v_row(vh, j, d), vb[j % LANES, (j - origin) // LANES]
        for c in range(d):
            dst[c] = _load_cell(src[c])


@numba.njit(cache=True, nogil=True)
def _attend_rows(q, h, i0, nr, p0, n_kv, window, sc, cap, f16, kb, vb, origin, s, acc, qv, out):
    """Rows i0 .. i0 + nr - 1 (nr <= ROWS; row i at position p0 + i) of head h of :func:`attention` over K and V
    of its KV head as f32 blocks from ``origin`` (:func:`_load_blocks`), :data:`ROWS` rows at a time: KQ of every
    block any of them reads (cells outside a row's range are computed and not read), each row's softmax, then KQV:
    each row's cells before the first whole block all rows read, those blocks for all the rows together, then each
    row's cells after them — per lane in increasing cell order, as :func:`_kqv`."""
    d = q.shape[2]
    for t in range(nr):
        for c in range(d):
            qv[t, c] = round_f16_scalar(q[i0 + t, h, c]) if f16 else q[i0 + t, h, c]
    lo_first = max(0, p0 + i0 - window + 1) if window > 0 else 0
    lo_last = max(0, p0 + i0 + nr - 1 - window + 1) if window > 0 else 0
    hi_first, hi_last = min(p0 + i0 + 1, n_kv), min(p0 + i0 + nr, n_kv)
    b0, b1 = (lo_first - origin) // LANES, (hi_last - origin + LANES - 1) // LANES
    _kq_rows(qv, kb, LANES, LANES * d, b0, b1 - b0, s, origin, nr)
    shared_lo = -(-lo_last // LANES) * LANES  # the whole blocks of cells every row reads
    shared_hi = max(shared_lo, hi_first - hi_first % LANES)
    acc[:nr] = np.float32(0.0)
    for t in range(nr):
        jlo = max(0, p0 + i0 + t - window + 1) if window > 0 else 0
        jhi = min(p0 + i0 + t + 1, n_kv)
        _softcap(s[t], jlo, jhi, cap)
        _softmax(jlo, jhi, sc, f16, s[t])
        for j in range(jlo, min(shared_lo, jhi)):
            _kqv_cell(s[t, j], vb[j % LANES, (j - origin) // LANES], acc[t, j % LANES])
    nb = vb.shape[1]
    blocks = (shared_hi - shared_lo) // LANES
    _kqv_rows(s, vb, nb * d, d, (shared_lo - origin) // LANES * d, shared_lo, blocks, 0, acc, nr)
    for t in range(nr):
        jlo = max(0, p0 + i0 + t - window + 1) if window > 0 else 0
        jhi = min(p0 + i0 + t + 1, n_kv)
        for j in range(max(shared_hi, jlo), jhi):
            _kqv_cell(s[t, j], vb[j % LANES, (j - origin) // LANES], acc[t, j % LANES])
        _reduce_lanes(acc[t], 0, d, out[i0 + t, h * d : (h + 1) * d])


@numba.njit(cache=True, nogil=True)
def _attend_heads(q, h0, nr, p, n_kv, window, sc, cap, f16, kh, vh, s, acc, qv, out):
    """Heads h0 .. h0 + nr - 1 (nr <= ROWS, of one KV head: kh [nb, d·16] its K, vh [16, nb·d] its V, in the cache;
    d a multiple of 16) of :func:`attention`'s one row (q [1, n_head, d], at position p), each K and V vector loaded
    once for all of them: KQ of the blocks of cells up to the row's end (cells before its window or after its end
    computed, not read), each head's softmax, then KQV: the cells before the first whole block, then the whole blocks
    and the cells after them for all the heads together — per lane in increasing cell order, as :func:`_kqv`."""
    d = q.shape[2]
    for t in range(nr):
        for c in range(d):
            qv[t, c] = round_f16_scalar(q[0, h0 + t, c]) if f16 else q[0, h0 + t, c]
    jlo = max(0, p - window + 1) if window > 0 else 0
    jhi = min(p + 1, n_kv)
    b0, b1 = jlo // LANES, -(-jhi // LANES)
    _kq_rows(qv, kh, LANES, LANES * d, b0, b1 - b0, s, 0, nr)
    shared_lo = min(jhi, -(-jlo // LANES) * LANES)  # the whole blocks of cells KQV takes for all the heads
    shared_hi = max(shared_lo, jhi - jhi % LANES)
    acc[:nr] = np.float32(0.0)
    for t in range(nr):
        _softcap(s[t], jlo, jhi, cap)
        _softmax(jlo, jhi, sc, f16, s[t])
        for j in range(jlo, shared_lo):
            _kqv_cell(s[t, j], _v_row(vh, j, d), acc[t, j % LANES])
    nb = vh.shape[1] // d
    blocks = (shared_hi - shared_lo) // LANES
    _kqv_rows(s, vh, nb * d, d, shared_lo // LANES * d, shared_lo, blocks, jhi - shared_hi, acc, nr)
    for t in range(nr):
        _reduce_lanes(acc[t], 0, d, out[0, (h0 + t) * d : (h0 + t + 1) * d])


@numba.njit(cache=True, nogil=True)
def attention(q, kc, vc, start, m, n_kv, scale, window, f16, out, scratch, h0, h1, g0, gstep, cap=0.0):
    """Heads h0..h1-1, of them the groups of ROWS rows g0, g0 + gstep, g0 + 2·gstep, ... (all rows: 0, 1), of causal
    attention of q [m, n_head, d] (after RoPE; row i at position p = start + i) over
    the first n_kv cells of one cache layer, K kc [n_head_kv, nb, d·16] and V vc [n_head_kv, 16, nb·d] (the layout
    of docs/attention.md; uint16 F16 bits, or float32; :func:`store_kv`), into out
    [m, n_head*d]. Head h reads KV head h // (n_head / n_head_kv) (GQA). ``window`` > 0 also masks cell j when
    ``p - j >= window`` (LLAMA_SWA_TYPE_STANDARD). ``scratch``: float32, :func:`attention_scratch_size` elements,
    one per thread. Numerics (llama.cpp without flash attention, ggml-cpu on NEON), per row and head:

    * with ``f16``, q is rounded to F16 (ggml converts the f32 operand to the F16 cache's vec_dot type);
    * ``s[j] = dot(q, K[j])`` for unmasked j (j <= p, and in the window): 16 lanes, lane l the sum of the products
      of the d = l (mod 16) elements from +0 in increasing d with a fused multiply-add (exact products with F16
      operands; ggml's vfmaq_f32 for F32), reduced by halves (lanes l + l+8, then + l+4) and then pairwise
      ((v0+v1) + (v2+v3), vaddvq_f32); the d % 16 last products added in f64;
    * with ``cap`` > 0 (Gemma 2's attention logit soft-capping, llama.cpp's kq_scaled_1, kq_tanh, kq_scaled_2):
      ``s[j] = tanhf(s[j] * (float)(1/cap)) * cap`` (:func:`~kleidipy.ops.elementwise.softcap_value`);
    * ``s[j] * scale`` in f32; masked cells are -inf (their weight is 0);
    * softmax: max over the row, ``e[j] = expf(s[j] - max)``, the sum in f64 of ``(e0+e1)+(e2+e3)`` (f32) per 4
      cells from cell 0 with masked cells 0, ``w[j] = e[j] * (float)(1/sum)``; with ``f16`` w is rounded to F16;
    * ``out[i, h*d + c]``: the same 16-lane dot over the cells j (lane j % 16, fused multiply-add, in increasing j)
      of ``w[j] * V[j, c]``, reduced the same way.
    """
    if q.shape[2] % LANES == 0:
        attention_tiled(q, kc, vc, start, m, n_kv, scale, window, f16, out, scratch, h0, h1, g0, gstep, cap)
    else:
        attention_rows(q, kc, vc, start, m, n_kv, scale, window, f16, out, scratch, h0, h1, g0, gstep, cap)


def attention_for(head_dim: int) -> Callable[..., None]:
    """The function of :func:`attention`'s path for a head_dim, called from Python (the op-by-op execution), so that
    a first run compiles only that path."""
    return attention_tiled if head_dim % LANES == 0 else attention_rows


@numba.njit(cache=True, nogil=True)
def _scratch_views(scratch, n_kv, d):  # pragma: no cover - compiled
    """attention_scratch_size's parts: V blocks, K blocks or the KQ lanes, and per row scores, KQV lanes, query."""
    n16 = -(-n_kv // LANES) * LANES
    vb = scratch[: n16 * d].reshape(LANES, n16 // LANES, d)
    at = d * n16
    kb = scratch[at : at + n16 * d].reshape(n16 // LANES, d, LANES)
    kq = scratch[at : at + LANES * n_kv].reshape(LANES, n_kv)
    at += max(n16 * d, LANES * n_kv)
    s = scratch[at : at + ROWS * n16].reshape(ROWS, n16)
    at += ROWS * n16
    acc = scratch[at : at + ROWS * LANES * d].reshape(ROWS, LANES, d)
    at += ROWS * LANES * d
    qv = scratch[at : at + ROWS * d].reshape(ROWS, d)
    return vb, kb, kq, s, acc, qv


@numba.njit(cache=True, nogil=True)
def attention_tiled(q, kc, vc, start, m, n_kv, scale, window, f16, out, scratch, h0, h1, g0, gstep, cap=0.0):
    """:func:`attention` for a head_dim that is a multiple of 16: one row (decode) reads the cache itself, the heads
    of each KV head together; a batch of rows reads the cells any row reads (from the first row's window start to the
    last row's position) from f32 blocks made once per KV head (from the 16-aligned origin), ROWS rows at a time."""
    group = q.shape[1] // kc.shape[0]
    sc, cp = np.float32(scale), np.float32(cap)
    vb, kb, _, s, acc, qv = _scratch_views(scratch, n_kv, q.shape[2])
    if m == 1:
        h = h0
        while h < h1 and g0 == 0:
            kvh = h // group
            nr = min(ROWS, h1 - h, (kvh + 1) * group - h)
            _attend_heads(q, h, nr, start, n_kv, window, sc, cp, f16, kc[kvh], vc[kvh], s, acc, qv, out)
            h += nr
        return
    lo = max(0, start - window + 1) if window > 0 else 0
    hi = min(start + m, n_kv)
    origin = lo - lo % LANES
    loaded = -1
    for h in range(h0, h1):
        kvh = h // group
        if kvh != loaded:
            _load_blocks(kc[kvh], vc[kvh], origin, hi, kb, vb)
            loaded = kvh
        for i0 in range(g0 * ROWS, m, gstep * ROWS):
            _attend_rows(q, h, i0, min(ROWS, m - i0), start, n_kv, window, sc, cp, f16, kb, vb, origin, s, acc, qv, out)


@numba.njit(cache=True, nogil=True)
def attention_rows(q, kc, vc, start, m, n_kv, scale, window, f16, out, scratch, h0, h1, g0, gstep, cap=0.0):
    """:func:`attention` for any head_dim: row by row, head by head, from the cache."""
    d = q.shape[2]
    group = q.shape[1] // kc.shape[0]
    sc, cp = np.float32(scale), np.float32(cap)
    _, _, kq, s, acc, qv = _scratch_views(scratch, n_kv, d)
    for h in range(h0, h1):
        kvh = h // group
        for i in range(m):
            if (i // ROWS) % gstep != g0:
                continue
            p = start + i
            for c in range(d):
                qv[0, c] = round_f16_scalar(q[i, h, c]) if f16 else q[i, h, c]
            jlo = max(0, p - window + 1) if window > 0 else 0
            jhi = min(p + 1, n_kv)
            _kq_cells(qv[0], kc[kvh], jlo, jhi, kq, s[0])
            _softcap(s[0], jlo, jhi, cp)
            _softmax(jlo, jhi, sc, f16, s[0])
            _kqv(vc[kvh], jlo, jhi, s[0], acc[0], out[i, h * d : (h + 1) * d])


#: query rows whose KQV one call of the KV-cache GEMM takes (:func:`attention_kv_gemm`): a causal batch's later rows
#: read more cells, so blocks of rows skip the cells no row of theirs reads
KV_GEMM_ROWS = 32


@numba.njit(cache=True, nogil=True)
def attention_kv_gemm(q, kc, vc, start, m, n_kv, scale, window, out, h0, h1, params, cap=0.0):
    """Heads h0..h1-1 of :func:`attention` over an F16 cache (kc, vc uint16 bits) as llama.cpp master computes a batch
    (m > 1) where its kernel table has a GEMM for the F16 KV cache (kleidiai.cpp takes the KQV MUL_MAT): KQ, the
    soft-cap and the softmax as :func:`attention` does them (q rounded to F16, the same lanes), the weights kept in
    f32 (ggml no longer converts the KQV's src1 to F16), then per head the table's GEMM, ``params`` a
    :class:`~kleidipy.core.node.NodeKernel` record with its :data:`~kleidipy.core.node.GEMM_KXN` routine, of the
    weights (0 at each row's masked cells) by V of its KV head as K x N float32 (the exact F16 values:
    ``transpose_f32kxn_f16nxk``), into out [m, n_head·d] (C-contiguous rows).

    llama.cpp multiplies over all of its n_kv cells (padded to 256) from cell 0; the kernel sums K pairs (2p, 2p+1)
    into an accumulator that starts at the zero bias, and a pair of zero weights leaves it as it is (+0 stays +0, any
    other sum unchanged). So each block of :data:`KV_GEMM_ROWS` rows multiplies only from the pair of the first cell
    any of its rows reads to the last such cell: the same bits."""
    d = q.shape[2]
    group = q.shape[1] // kc.shape[0]
    sc, cp = np.float32(scale), np.float32(cap)
    w = np.empty(KV_GEMM_ROWS * n_kv, np.float32)
    s = np.empty(-(-n_kv // LANES) * LANES, np.float32)
    kq = np.empty((LANES, n_kv), np.float32)
    qv = np.empty(d, np.float32)
    vt = np.empty((n_kv, d), np.float32)
    ld = out.shape[1]
    loaded = -1
    for h in range(h0, h1):
        kvh = h // group
        if kvh != loaded:
            for j in range(n_kv):
                row = _v_row(vc[kvh], j, d)
                for c in range(d):
                    vt[j, c] = _load_cell(row[c])
            loaded = kvh
        for i0 in range(0, m, KV_GEMM_ROWS):
            i1 = min(m, i0 + KV_GEMM_ROWS)
            lo = max(0, start + i0 - window + 1) if window > 0 else 0
            lo -= lo % 2  # (from a whole K pair)
            hi = min(start + i1, n_kv)
            wb = w[: (i1 - i0) * (hi - lo)].reshape(i1 - i0, hi - lo)
            wb[:] = np.float32(0.0)
            for i in range(i0, i1):
                p = start + i
                for c in range(d):
                    qv[c] = round_f16_scalar(q[i, h, c])
                jlo = max(0, p - window + 1) if window > 0 else 0
                jhi = min(p + 1, n_kv)
                _kq_cells(qv, kc[kvh], jlo, jhi, kq, s)
                _softcap(s, jlo, jhi, cp)
                _softmax(jlo, jhi, sc, False, s)
                wb[i - i0, jlo - lo : jhi - lo] = s[jlo:jhi]
            at = out.ctypes.data + (i0 * ld + h * d) * 4
            v_at = vt.ctypes.data + lo * d * 4
            call_gemm_kxn(params[P_GEMM_KXN], params.ctypes.data, i1 - i0, d, hi - lo, wb.ctypes.data, v_at, at, ld)
