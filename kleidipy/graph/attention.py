"""Causal attention over the KV cache as compiled tiles, with one fixed order of operations: llama.cpp's attention
without flash attention (``mul_mat(k, q)`` -> ``soft_max_ext`` -> ``mul_mat(v, kq)``) as ggml-cpu computes it on Arm
(NEON, F16 or F32 cache), stated in :func:`attention`.

Both executions call :func:`attention`: the eager path (:mod:`kleidipy.runtime.layers`) over all heads, the
compiled graph (:mod:`kleidipy.graph.execute`) per worker over the heads it owns. The inner tiles are llvmlite IR
(numba does not vectorize these loops over 16 lanes of 16 cells into 512-bit registers by itself); the order of
every sum is the one stated, whatever the tile, so every path gives the same bits.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.numerics import fma32, round_f16_scalar
from kleidipy.core.vnni import F32, F32X16
from kleidipy.graph.ops import _load_cell, expf

#: lanes of ggml_vec_dot_f16 / ggml_vec_dot_f32 on NEON: GGML_F32_ARR (4) registers of 4 floats
LANES = 16
#: cells whose KQ lanes attention computes together (the order within each cell is the same for any block)
_BLOCK = 512


def attention_scratch_size(n_ctx: int, head_dim: int) -> int:
    """float32 elements of :func:`attention`'s scratch for one thread, for any n_kv <= n_ctx, with n16 = n_ctx
    rounded up to 16: V of one KV head as f32 in blocks (n16 * head_dim), K of one KV head as f32 in blocks or the
    KQ lanes of one row (the larger of n16 * head_dim and 16 * n_ctx), the scores of one row (n16), the KQV lanes
    (16 * head_dim) and the query (head_dim)."""
    n16 = -(-n_ctx // LANES) * LANES
    return n16 * head_dim + max(n16 * head_dim, LANES * n_ctx) + n16 + (LANES + 1) * head_dim


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


@intrinsic
def _kq_tiles(typingctx, qv, kt, row, bstride, k0, blocks, out, o0):  # pragma: no cover - compile time
    """out[o0 : o0 + 16·blocks] = the 16-lane dot (lanes c % 16 over the first d - d % 16 elements, fused
    multiply-adds in increasing c, reduced as :func:`_reduce_lanes`) of qv [d] (C-contiguous) with blocks of 16
    cells of K (F16 bits or float32): block ``blk``'s 16 cells of dimension c start at element
    ``k0 + blk·bstride + c·row`` of kt — the cache's K transposed (row = its row stride, bstride 16) or K of one
    head as f32 blocks (:func:`_load_blocks`: row 16, bstride 16·d). 16 cells per 512-bit vector, the 16 lanes in
    16 registers, each K element loaded (and widened) once per query row."""
    sig = types.void(qv, kt, types.int64, types.int64, types.int64, types.int64, out, types.int64)
    f16 = kt.dtype == types.uint16

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        b = builder
        q_p, kt_p, out_p = (vnni.array_ptr(context, b, signature.args[i], args[i]) for i in (0, 1, 6))
        row, bstride, k0, blocks_v, o0 = args[2], args[3], args[4], args[5], args[7]
        d = b.extract_value(context.make_array(signature.args[0])(context, b, args[0]).shape, 0)
        esize = 2 if f16 else 4
        cells = ir.VectorType(ir.IntType(16), 16) if f16 else F32X16
        acc = [cgutils.alloca_once(b, F32X16) for _ in range(LANES)]
        with cgutils.for_range(b, blocks_v) as blk:
            j = b.add(o0, b.mul(blk.index, vnni.i64(16)))
            kblk = b.add(k0, b.mul(blk.index, bstride))
            for a in acc:
                b.store(vnni.const_splat(F32X16, 0.0), a)
            with cgutils.for_range(b, b.udiv(d, vnni.i64(LANES))) as cb:
                for lane in range(LANES):
                    c = b.add(b.mul(cb.index, vnni.i64(LANES)), vnni.i64(lane))
                    at = b.mul(b.add(b.mul(c, row), kblk), vnni.i64(esize))
                    k = vnni.load(b, vnni.byte_ptr(b, kt_p, at), cells)
                    k = vnni.f16_bits_to_f32(b, k, True) if f16 else k
                    qc = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, q_p, b.mul(c, vnni.i64(4))), F32), F32X16)
                    b.store(vnni.fma(b, qc, k, b.load(acc[lane])), acc[lane])
            p = [b.load(a) for a in acc]
            v = [b.fadd(b.fadd(p[r], p[r + 8]), b.fadd(p[r + 4], p[r + 12])) for r in range(4)]
            total = b.fadd(b.fadd(v[0], v[1]), b.fadd(v[2], v[3]))
            vnni.store(b, total, vnni.byte_ptr(b, out_p, b.mul(j, vnni.i64(4))))
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _kq_transposed(qv, kt, jlo, jhi, kq, s):
    """KQ of one query row qv [d] over cells jlo..jhi-1 into s[jlo:jhi], K transposed in kt [d, >= jhi] (the
    cache's K of one head: F16 bits or float32): whole blocks of 16 cells by :func:`_kq_tiles`, the last cells with
    their 16 lanes in kq [16, >= jhi] (the same order). Loops run over slices from 0 so that numba's indices are
    provably non-negative and LLVM vectorizes them."""
    d = qv.shape[0]
    d16 = d - d % LANES
    size = kt.itemsize
    tiles = (jhi - jlo) // 16 if d16 > 0 and kt.strides[1] == size and kt.strides[0] % size == 0 else 0
    _kq_tiles(qv, kt, kt.strides[0] // size, LANES, jlo, tiles, s, jlo)
    rest = jlo + 16 * tiles
    kq[:, rest:jhi] = np.float32(0.0)
    for j0 in range(rest, jhi, _BLOCK):  # a block of cells at a time: its lanes stay in L1
        j1 = min(j0 + _BLOCK, jhi)
        for c in range(d16):
            qc = qv[c]
            lane = kq[c % LANES, j0:j1]
            krow = kt[c, j0:j1]
            for j in range(j1 - j0):
                lane[j] = fma32(qc, _load_cell(krow[j]), lane[j])
    _reduce_lanes(kq, rest, jhi, s[rest:jhi])
    sr = s[jlo:jhi]
    for j in range(jhi - jlo):
        if d16 < d:
            dot = np.float64(sr[j])
            for c in range(d16, d):
                dot += np.float64(qv[c] * _load_cell(kt[c, jlo + j]))
            sr[j] = np.float32(dot)


@numba.njit(cache=True, nogil=True, error_model="numpy")  # no ZeroDivisionError branch: loops vectorize
def _softmax(jlo, jhi, sc, f16, s):
    """Scores s[jlo:jhi] (KQ) -> scaled, softmax weights (rounded to F16 with ``f16``), in place."""
    n = jhi - jlo
    sr = s[jlo:jhi]
    mx = np.float32(-np.inf)
    for j in range(n):
        sr[j] = sr[j] * sc
        mx = max(mx, sr[j])
    # soft_max: e = expf(s - max); the f64 sum takes vaddvq_f32 of each 4 cells from cell 0 ((e0+e1)+(e2+e3)), masked
    # cells being 0 (llama.cpp pads n_kv to a multiple of 32 with masked cells, so no scalar tail)
    for j in range(n):
        sr[j] = expf(sr[j] - mx)
    total = 0.0
    for g in range(jlo - jlo % 4, jhi, 4):
        e0 = s[g] if g >= jlo else np.float32(0.0)
        e1 = s[g + 1] if g + 1 >= jlo and g + 1 < jhi else np.float32(0.0)
        e2 = s[g + 2] if g + 2 >= jlo and g + 2 < jhi else np.float32(0.0)
        e3 = s[g + 3] if g + 3 < jhi else np.float32(0.0)
        total += np.float64((e0 + e1) + (e2 + e3))
    inv = np.float32(1.0 / total)
    if f16:
        for j in range(n):
            sr[j] = round_f16_scalar(sr[j] * inv)
    else:
        for j in range(n):
            sr[j] = sr[j] * inv


@numba.njit(cache=True, nogil=True)
def _kqv(vh, jlo, jhi, s, acc, out):
    """out [d] = KQV of the weights s[jlo:jhi] over the V rows vh [n_ctx, d] of the cache; acc [16, d] is work
    space."""
    d = out.shape[0]
    # KQV: ggml_vec_dot over the cells of each output column: lane j % 16 accumulates w[j] * V[j, c] in increasing j
    # (masked cells' weights are 0: skipped), reduced by _reduce_lanes; the whole blocks of 16 cells between the first
    # and the last partial ones by _kqv_tiles (the same order per lane and column)
    acc[:] = np.float32(0.0)
    size = vh.itemsize
    tiled = d % LANES == 0 and vh.strides[1] == size and vh.strides[0] % size == 0
    a0 = min(jhi, (jlo + LANES - 1) // LANES * LANES) if tiled else jhi
    blocks = (jhi - a0) // LANES
    for j in range(jlo, a0):
        _kqv_cell(s[j], vh[j], acc[j % LANES])
    _kqv_tiles(s, vh, vh.strides[0] // size, LANES, a0, blocks, acc, 0)
    for j in range(a0 + LANES * blocks, jhi):
        _kqv_cell(s[j], vh[j], acc[j % LANES])
    _reduce_lanes(acc, 0, d, out)


@numba.njit(cache=True, nogil=True)
def _kqv_blocks(vb, origin, jlo, jhi, s, acc, out):
    """:func:`_kqv` over V of one head as f32 blocks vb [d/16, n, 16] (:func:`_load_blocks`; cell j at
    ``j - origin``): the same lanes and order."""
    acc[:] = np.float32(0.0)
    a0 = min(jhi, (jlo + LANES - 1) // LANES * LANES)
    blocks = (jhi - a0) // LANES
    for j in range(jlo, a0):
        _kqv_cell_blocks(s[j], vb, j - origin, acc[j % LANES])
    _kqv_tiles(s, vb, LANES, vb.shape[1] * LANES, a0, blocks, acc, origin)
    for j in range(a0 + LANES * blocks, jhi):
        _kqv_cell_blocks(s[j], vb, j - origin, acc[j % LANES])
    _reduce_lanes(acc, 0, out.shape[0], out)


@numba.njit(cache=True, nogil=True, inline="always")
def _kqv_cell_blocks(wj, vb, cell, a):
    """:func:`_kqv_cell` with V as f32 blocks: a[c] = fma(w_j, V[j, c], a[c]) for every column c."""
    for cb in range(vb.shape[0]):
        for lane in range(LANES):
            a[cb * LANES + lane] = fma32(wj, vb[cb, cell, lane], a[cb * LANES + lane])


@numba.njit(cache=True, nogil=True, inline="always")
def _kqv_cell(wj, vrow, a):
    """One cell of KQV: a[c] = fma(w_j, V[j, c], a[c]) for every column c."""
    for c in range(a.shape[0]):
        a[c] = fma32(wj, _load_cell(vrow[c]), a[c])


@intrinsic
def _kqv_tiles(typingctx, w, vh, row, cstride, j0, blocks, acc, v0):  # pragma: no cover - compile time
    """KQV over cells j0 .. j0 + 16·blocks (j0 a multiple of 16): acc[l, c] = fma(w[j], V[j, c], acc[l, c]) for the
    cells j = l (mod 16) in increasing j; the 16 columns from c = 16·cb of cell j start at element
    ``(j - v0)·row + cb·cstride`` of vh (F16 bits or float32) — the cache's V rows (row = its row stride,
    cstride 16, v0 0) or V of one head as f32 blocks (:func:`_load_blocks`: row 16, cstride 16·n, v0 its first
    cell); d a multiple of 16. Per 16 columns the 16 lanes stay in 16 registers over all the blocks."""
    sig = types.void(w, vh, types.int64, types.int64, types.int64, types.int64, acc, types.int64)
    f16 = vh.dtype == types.uint16

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        b = builder
        w_p, v_p, acc_p = (vnni.array_ptr(context, b, signature.args[i], args[i]) for i in (0, 1, 6))
        row_v, cstride, j0_v, blocks_v, v0 = args[2], args[3], args[4], args[5], args[7]
        d = b.extract_value(context.make_array(signature.args[6])(context, b, args[6]).shape, 1)
        esize = 2 if f16 else 4
        cells = ir.VectorType(ir.IntType(16), 16) if f16 else F32X16
        lanes = [cgutils.alloca_once(b, F32X16) for _ in range(LANES)]
        with cgutils.for_range(b, b.udiv(d, vnni.i64(LANES))) as cb:
            col = b.mul(cb.index, vnni.i64(LANES))
            for lane, p in enumerate(lanes):  # acc[lane, col : col + 16]
                at = b.mul(b.add(b.mul(vnni.i64(lane), d), col), vnni.i64(4))
                b.store(vnni.load(b, vnni.byte_ptr(b, acc_p, at), F32X16), p)
            with cgutils.for_range(b, blocks_v) as blk:
                base = b.add(j0_v, b.mul(blk.index, vnni.i64(LANES)))
                for lane, p in enumerate(lanes):
                    j = b.add(base, vnni.i64(lane))
                    wj = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, w_p, b.mul(j, vnni.i64(4))), F32), F32X16)
                    at = b.mul(b.add(b.mul(b.sub(j, v0), row_v), b.mul(cb.index, cstride)), vnni.i64(esize))
                    v = vnni.load(b, vnni.byte_ptr(b, v_p, at), cells)
                    v = vnni.f16_bits_to_f32(b, v, True) if f16 else v
                    b.store(vnni.fma(b, wj, v, b.load(p)), p)
            for lane, p in enumerate(lanes):
                at = b.mul(b.add(b.mul(vnni.i64(lane), d), col), vnni.i64(4))
                vnni.store(b, b.load(p), vnni.byte_ptr(b, acc_p, at))
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _load_blocks(kt, vh, origin, hi, kb, vb):
    """Cells origin..hi-1 (origin a multiple of 16) of one KV head as float32 blocks, for the rows of a batch to
    share: K (kt [d, n_ctx]) as kb [n/16, d, 16] (block b: dimension c of cells origin + 16·b + 0..15, contiguous;
    cells from hi on 0) and V (vh [n_ctx, d]) as vb [d/16, n, 16] (cell j's columns 16·cb.. at vb[cb, j - origin]):
    the tiles then read 4 KB of K per block of cells and each 16 columns of V as one stream."""
    d = kt.shape[0]
    for blk in range((hi - origin + LANES - 1) // LANES):
        for c in range(d):
            src, dst = kt[c], kb[blk, c]
            for lane in range(LANES):
                j = origin + blk * LANES + lane
                dst[lane] = _load_cell(src[j]) if j < hi else np.float32(0.0)
    for j in range(origin, hi):
        src = vh[j]
        for cb in range(d // LANES):
            dst = vb[cb, j - origin]
            for lane in range(LANES):
                dst[lane] = _load_cell(src[cb * LANES + lane])


@numba.njit(cache=True, nogil=True)
def attention(q, kc, vc, start, m, n_kv, scale, window, f16, out, scratch, h0, h1):
    """Heads h0..h1-1 of causal attention of q [m, n_head, d] (after RoPE; row i at position p = start + i) over
    the first n_kv cells of one cache layer, K transposed kc [n_head_kv, d, n_ctx] and V vc [n_head_kv, n_ctx, d]
    (uint16 F16 bits, or float32; :func:`store_kv`), into out
    [m, n_head*d]. Head h reads KV head h // (n_head / n_head_kv) (GQA). ``window`` > 0 also masks cell j when
    ``p - j >= window`` (LLAMA_SWA_TYPE_STANDARD). ``scratch``: float32, :func:`attention_scratch_size` elements,
    one per thread. Numerics (llama.cpp without flash attention, ggml-cpu on NEON), per row and head:

    * with ``f16``, q is rounded to F16 (ggml converts the f32 operand to the F16 cache's vec_dot type);
    * ``s[j] = dot(q, K[j])`` for unmasked j (j <= p, and in the window): 16 lanes, lane l the sum of the products
      of the d = l (mod 16) elements from +0 in increasing d with a fused multiply-add (exact products with F16
      operands; ggml's vfmaq_f32 for F32), reduced by halves (lanes l + l+8, then + l+4) and then pairwise
      ((v0+v1) + (v2+v3), vaddvq_f32); the d % 16 last products added in f64;
    * ``s[j] * scale`` in f32; masked cells are -inf (their weight is 0);
    * softmax: max over the row, ``e[j] = expf(s[j] - max)``, the sum in f64 of ``(e0+e1)+(e2+e3)`` (f32) per 4
      cells from cell 0 with masked cells 0, ``w[j] = e[j] * (float)(1/sum)``; with ``f16`` w is rounded to F16;
    * ``out[i, h*d + c]``: the same 16-lane dot over the cells j (lane j % 16, fused multiply-add, in increasing j)
      of ``w[j] * V[j, c]``, reduced the same way.
    """
    n_head = q.shape[1]
    d = q.shape[2]
    group = n_head // kc.shape[0]
    sc = np.float32(scale)
    # scratch (attention_scratch_size): V blocks, K blocks or the KQ lanes, scores, KQV lanes, query
    n16 = -(-n_kv // LANES) * LANES
    vb = scratch[: (d // LANES) * n16 * LANES].reshape(d // LANES, n16, LANES)
    at = d * n16
    kb = scratch[at : at + n16 * d].reshape(n16 // LANES, d, LANES)
    kq = scratch[at : at + LANES * n_kv].reshape(LANES, n_kv)
    at += max(n16 * d, LANES * n_kv)
    s = scratch[at : at + n16]
    at += n16
    acc = scratch[at : at + LANES * d].reshape(LANES, d)
    at += LANES * d
    qv = scratch[at : at + d]
    # cells any row reads: from the first row's window start to the last row's position; a batch of rows reads
    # them from f32 blocks made once per KV head (from the 16-aligned origin), one row from the cache itself
    lo = max(0, start - window + 1) if window > 0 else 0
    hi = min(start + m, n_kv)
    origin = lo - lo % LANES
    blocked = m > 1 and d % LANES == 0
    loaded = -1
    for h in range(h0, h1):
        kvh = h // group
        if blocked and kvh != loaded:
            _load_blocks(kc[kvh], vc[kvh], origin, hi, kb, vb)
            loaded = kvh
        for i in range(m):
            p = start + i
            for c in range(d):
                qv[c] = round_f16_scalar(q[i, h, c]) if f16 else q[i, h, c]
            jlo = max(0, p - window + 1) if window > 0 else 0
            jhi = min(p + 1, n_kv)
            o = out[i, h * d : (h + 1) * d]
            if blocked:  # whole blocks of cells (those outside jlo..jhi-1 are computed and not read)
                b0, b1 = (jlo - origin) // LANES, (jhi - origin + LANES - 1) // LANES
                _kq_tiles(qv, kb, LANES, LANES * d, b0 * LANES * d, b1 - b0, s, origin + b0 * LANES)
                _softmax(jlo, jhi, sc, f16, s)
                _kqv_blocks(vb, origin, jlo, jhi, s, acc, o)
            else:
                _kq_transposed(qv, kc[kvh], jlo, jhi, kq, s)
                _softmax(jlo, jhi, sc, f16, s)
                _kqv(vc[kvh], jlo, jhi, s, acc, o)
