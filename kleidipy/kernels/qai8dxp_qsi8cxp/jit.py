"""Numba code of the two ``qai8dxp`` families (Q8_0 ``qsi8cxp`` and per-channel int4 ``qsi4cxp``).

It owns the jit execution of: the LHS quantize+pack ``lhs_quant_pack_qai8dxp_f32``, the three RHS packers
(``qsi8cxp_qsi8cx_neon``, ``qsi4cxp_qs4cxs1s0``, ``qsi4cxps1s0_qsu4cxs1s0_neon``), llama.cpp's Q8_0 per-channel
re-quantization and the matmul kernels of both families, and :func:`with_tiles`, the one way a family's tile chain
(``neon``, ``sme``, ``sme2``, ``vnni`` of both families, composed in their ``ukernels``) serves :func:`matmul_qai8dxp`'s
calls. Every function is bit-exact with the numpy reference of ``kleidipy.kernels.qai8dxp_qsi8cxp.ukernels`` /
``qai8dxp_qsi4cxp`` (same bytes in, same bytes out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numba
import numpy as np

from kleidipy.core.numerics import fma_f32_scalar, round_away_scalar

#: float epilogues of the kernels (see ``Recipe`` in kleidipy.kernels.qai8dxp_qsi8cxp.ukernels)
RECIPE_FMUL_FADD = 0
RECIPE_FMA_BIAS = 1

#: rows of LHS broadcast at once by the matmul kernel (each costs one group's data size of scratch)
_ROW_BLOCK = 4
#: int32 lanes the matmul kernel accumulates a group's products in (rounded to a multiple of nr·blen)
_DOT_WIDTH = 256


# --------------------------------------------------------------------------------------------- LHS


@numba.njit(cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz"})
def _row_min_max(x):
    """min and max of a finite float32 row (exact in any order; the fastmath flags only let it vectorise)."""
    mn = x[0]
    mx = x[0]
    for v in x:
        mn = min(mn, v)
        mx = max(mx, v)
    return mn, mx


@numba.njit(cache=True, nogil=True)
def lhs_quant_pack_qai8dxp(lhs, mr, kbl, row_offset, k_int, out):
    """Quantize rows of ``lhs`` (float32 [m, k]) asymmetrically per row and write them into ``out``.

    Row i goes to position ``row_offset + i`` of the group sequence; a group of mr rows is
    mr·(k_int + 8) bytes: int8 data in kbl-chunks, then mr int32 ``-zero_point``, then mr f32 ``1/scale``.
    """
    m, k = lhs.shape
    stride = mr * (k_int + 8)
    out_i8 = out.view(np.int8)
    out_i32 = out.view(np.int32)
    out_f32 = out.view(np.float32)
    qrow = np.empty(k_int, np.int8)
    f0 = np.float32(0.0)
    qmin = np.float32(-128.0)
    qmax = np.float32(127.0)
    for i in range(m):
        x = lhs[i]
        mn, mx = _row_min_max(x)
        rmin = f0 if f0 < mn else mn
        rmax = f0 if f0 > mx else mx
        scale = np.float32(1.0) if rmin == rmax else np.float32(np.float32(255.0) / np.float32(rmax - rmin))
        recip = np.float32(np.float32(1.0) / scale) if scale != f0 else f0
        dmin = np.float32(rmin * scale)
        dmax = np.float32(rmax * scale)
        err = np.float32(np.float32(qmin + dmin) + np.float32(qmax + dmax))
        zp = np.float32(qmin - dmin) if err > f0 else np.float32(qmax - dmax)
        zp = max(zp, qmin)
        zp = min(zp, qmax)
        nzp = np.int32(np.rint(zp))
        for j in range(k):
            q = np.int32(round_away_scalar(np.float32(x[j] * scale))) + nzp
            qrow[j] = max(min(q, 127), -128)
        qrow[k:] = qrow[k - 1]
        pos = row_offset + i
        base = (pos // mr) * stride
        r = pos % mr
        for c in range(k_int // kbl):  # (element loops: a slice copy compiles numba's shape-error message, ~2 s)
            dst = base + c * mr * kbl + r * kbl
            for t in range(kbl):
                out_i8[dst + t] = qrow[c * kbl + t]
        out_i32[(base + mr * k_int) // 4 + r] = -nzp
        out_f32[(base + mr * k_int + 4 * mr) // 4 + r] = recip


# --------------------------------------------------------------------------------------------- RHS


@numba.njit(cache=True, nogil=True)
def _load_weights(rows, codes_u4, src, k, w):
    """Signed weights of source row ``src`` into w (int8, zero past k): int8 rows as they are, or unsigned
    4-bit codes (element k in nibble k%2 of byte k//2) minus the zero point 8."""
    if codes_u4:
        for kk in range(k):
            w[kk] = ((np.int32(rows[src, kk >> 1]) >> ((kk & 1) * 4)) & 15) - 8
    else:
        for kk in range(k):
            w[kk] = rows[src, kk]
    w[k:] = 0


@numba.njit(cache=True, nogil=True)
def rhs_pack_per_channel(
    rows,
    codes_u4,
    k,
    scale,
    bias,
    has_bias,
    nr,
    blen,
    k_lo,
    k_hi,
    sum_multiplier,
    scale_multiplier,
    zero_padding,
    out,
):
    """Pack n output channels into groups of nr columns: data, then nr int32 row sums, nr f32 scales,
    nr f32 biases.

    The data layout is given by ``k_lo``/``k_hi`` (the K index held by each byte of a group's data, as in
    ``RhsDataLayout``; byte e belongs to column (e // blen) % nr): an int8 value, or two nibbles w & 15 when
    ``k_hi`` is not empty. Row sums are ``sum_multiplier``·Σw, scales are multiplied by ``scale_multiplier``
    when it is not 0. Padding columns copy column n−1, or stay all 0 with ``zero_padding``.
    """
    n = rows.shape[0]
    data = k_lo.size
    nibbles = k_hi.size > 0
    k_int = data * 2 // nr if nibbles else data // nr
    period = nr * blen
    chunks = data // period
    stride = data + 12 * nr
    out_i32 = out.view(np.int32)
    out_f32 = out.view(np.float32)
    w = np.empty(k_int, np.int8)
    for g in range((n + nr - 1) // nr):
        base = g * stride
        for col in range(nr):
            if g * nr + col >= n and zero_padding:
                continue
            src = min(g * nr + col, n - 1)
            _load_weights(rows, codes_u4, src, k, w)
            for c in range(chunks):
                e0 = c * period
                for b in range(blen):
                    lo = w[k_lo[e0 + b]]
                    if nibbles:
                        out[base + e0 + col * blen + b] = (lo & 15) | ((w[k_hi[e0 + b]] & 15) << 4)
                    else:
                        out[base + e0 + col * blen + b] = np.uint8(lo & 255)
            rsum = np.int64(0)
            for kk in range(k):
                rsum += w[kk]
            params = (base + data) // 4
            out_i32[params + col] = np.int32(rsum * sum_multiplier)
            sc = scale[src]
            out_f32[params + nr + col] = np.float32(sc * scale_multiplier) if scale_multiplier != 0 else sc
            out_f32[params + 2 * nr + col] = bias[src] if has_bias else np.float32(0.0)


@numba.njit(cache=True, nogil=True)
def int8_k_lo(k_int, nr, kr):
    """K index of every byte of a ``rhs_pack_nxk_qsi8cxp_qsi8cx_neon`` group's data: (e // (nr·kr))·kr + e % kr
    (int8 (col, k) at (k // kr)·nr·kr + col·kr + k % kr)."""
    e = np.arange(nr * k_int)
    return (e // (nr * kr)) * kr + e % kr


# --------------------------------------------------------------------------------------------- Q8_0


@numba.njit(cache=True, nogil=True)
def _quantize_row(v, q):
    """One row's per-channel int8: returns scale = f32(max|v| / 127), writes q = clamp(lround(f32(v·f32(1/scale))),
    ±127)."""
    amax = np.float32(0.0)
    for j in range(v.size):
        amax = max(amax, abs(v[j]))
    sc = np.float32(amax / np.float32(127.0)) if amax > 0 else np.float32(0.0)
    inv = np.float32(np.float32(1.0) / sc) if sc > 0 else np.float32(0.0)
    for j in range(v.size):
        r = np.int64(round_away_scalar(np.float32(v[j] * inv)))
        q[j] = max(min(r, 127), -127)
    return sc


@numba.njit(cache=True, nogil=True)
def requantize_q8_0(blocks, f16_table, q, scale):
    """llama.cpp's Q8_0 → per-channel int8: v = f32(d)·qs (exact), then :func:`_quantize_row`."""
    n, nb = blocks.shape[0], blocks.shape[1]
    v = np.empty(nb * 32, np.float32)
    for row in range(n):
        for b in range(nb):
            d = f16_table[np.int64(blocks[row, b, 0]) | (np.int64(blocks[row, b, 1]) << 8)]
            for j in range(32):
                v[b * 32 + j] = np.float32(d * np.float32(np.int8(blocks[row, b, 2 + j])))
        scale[row] = _quantize_row(v, q[row])


@numba.njit(cache=True, nogil=True)
def quantize_per_channel(v, q, scale):
    """Finite float32 rows v [n, k] → per-channel int8 q and f32 scale (:func:`_quantize_row`), as
    ``ukernels.quantize_per_channel``."""
    for row in range(v.shape[0]):
        scale[row] = _quantize_row(v[row], q[row])


# --------------------------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def _group_dot_i8(rhs_i8, rbase, lb, rows, data, width, bufs):
    """bufs[r, q] = Σ_s lb[r, s + q]·rhs[rbase + s + q] (s in steps of width; int32, wrapping) for the
    ``rows`` broadcast LHS rows over one group's int8 data (four rows share each RHS load)."""
    bufs[:rows] = 0
    for s in range(0, data, width):
        cnt = min(width, data - s)
        b = rhs_i8[rbase + s : rbase + s + cnt]
        if rows == _ROW_BLOCK:
            a0, a1, a2, a3 = lb[0, s : s + cnt], lb[1, s : s + cnt], lb[2, s : s + cnt], lb[3, s : s + cnt]
            c0, c1, c2, c3 = bufs[0], bufs[1], bufs[2], bufs[3]
            for q in range(cnt):
                w = np.int16(b[q])
                c0[q] += np.int16(a0[q]) * w
                c1[q] += np.int16(a1[q]) * w
                c2[q] += np.int16(a2[q]) * w
                c3[q] += np.int16(a3[q]) * w
        else:
            for r in range(rows):
                a = lb[r, s : s + cnt]
                c = bufs[r]
                for q in range(cnt):
                    c[q] += np.int16(a[q]) * np.int16(b[q])


@numba.njit(cache=True, nogil=True)
def _group_dot_i4(rhs_u8, rbase, lb_lo, lb_hi, rows, data, width, bufs):
    """As _group_dot_i8 for bytes of two signed nibbles: low nibble × lb_lo + high nibble × lb_hi."""
    bufs[:rows] = 0
    for s in range(0, data, width):
        cnt = min(width, data - s)
        b = rhs_u8[rbase + s : rbase + s + cnt]
        for r in range(rows):
            a_lo = lb_lo[r, s : s + cnt]
            a_hi = lb_hi[r, s : s + cnt]
            c = bufs[r]
            for q in range(cnt):
                byte = np.int16(b[q])
                c[q] += (((byte & 15) ^ 8) - 8) * np.int16(a_lo[q]) + (((byte >> 4) ^ 8) - 8) * np.int16(a_hi[q])


@numba.njit(cache=True, nogil=True)
def matmul_qai8dxp(
    m, n, k_int, lhs_i8, lhs_i32, lhs_f32, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out
):
    """dst[m, n] (unclamped) of a qai8dxp kernel from its packed buffers.

    Byte e of a packed RHS group's data belongs to column (e // blen) % nr and multiplies the LHS value of K
    index k_lo[e] (int8 data), or holds two signed nibbles multiplying k_lo[e] and k_hi[e] (int4 data, each
    nibble weighing ``nibble_factor``: 16 for the NEON ``<<4`` format, 1 for the SME2 one). Each LHS row is
    broadcast once into that byte order, so a group is one long elementwise product. The int32 accumulator
    gets −zp·Σw (integer MLA, wrapping), then F = f32(acc), S = f32(scale·recip) and ``recipe`` gives
    f32(f32(F·S) + bias) or fma(S, F, bias).
    """
    nibbles = nibble_factor != 0
    data = k_lo.size
    period = nr * blen
    width = period * max(1, _DOT_WIDTH // period)
    gstride = data + 12 * nr
    lstride = mr * (k_int + 8)
    lpos_lo = np.empty(data, np.int64)
    lpos_hi = np.empty(data if nibbles else 0, np.int64)
    for e in range(data):
        lpos_lo[e] = (k_lo[e] // kbl) * mr * kbl + k_lo[e] % kbl
        if nibbles:
            lpos_hi[e] = (k_hi[e] // kbl) * mr * kbl + k_hi[e] % kbl
    lb_lo = np.empty((_ROW_BLOCK, data), np.int8)
    lb_hi = np.empty((_ROW_BLOCK, data if nibbles else 0), np.int8)
    bufs = np.empty((_ROW_BLOCK, width), np.int32)
    rhs_i8 = rhs_u8.view(np.int8)
    rhs_i32 = rhs_u8.view(np.int32)
    rhs_f32 = rhs_u8.view(np.float32)
    for i0 in range(0, m, _ROW_BLOCK):
        rows = min(_ROW_BLOCK, m - i0)
        for ii in range(rows):
            lbase = ((i0 + ii) // mr) * lstride + ((i0 + ii) % mr) * kbl
            for e in range(data):
                lb_lo[ii, e] = lhs_i8[lbase + lpos_lo[e]]
            for e in range(lpos_hi.size):
                lb_hi[ii, e] = lhs_i8[lbase + lpos_hi[e]]
        for g in range((n + nr - 1) // nr):
            rbase = g * gstride
            params = (rbase + data) // 4
            if nibbles:
                _group_dot_i4(rhs_u8, rbase, lb_lo, lb_hi, rows, data, width, bufs)
            else:
                _group_dot_i8(rhs_i8, rbase, lb_lo, rows, data, width, bufs)
            for ii in range(rows):
                i = i0 + ii
                pl = (i // mr) * lstride // 4 + mr * k_int // 4 + i % mr
                off = np.int64(lhs_i32[pl])
                recip = lhs_f32[pl + mr]
                for col in range(min(nr, n - g * nr)):
                    dot = np.int64(0)
                    for rep in range(0, width, period):
                        for b in range(blen):
                            dot += bufs[ii, rep + col * blen + b]
                    if nibbles:
                        dot *= nibble_factor
                    acc = np.float32(np.int32(dot + off * np.int64(rhs_i32[params + col])))
                    sc = np.float32(rhs_f32[params + nr + col] * recip)
                    bias = rhs_f32[params + 2 * nr + col]
                    if recipe == RECIPE_FMA_BIAS:
                        out[i, g * nr + col] = fma_f32_scalar(sc, acc, bias)
                    else:
                        out[i, g * nr + col] = np.float32(np.float32(acc * sc) + bias)


def with_tiles(tiles: Sequence[Callable[..., bool]], fallback: Callable[..., None]) -> Callable[..., None]:
    """A :func:`matmul_qai8dxp` (same arguments; writes the unclamped float32 [m, n] into ``out``, C-contiguous) that
    runs a family's tile chain: the first of ``tiles`` that takes a call, else ``fallback`` (a :func:`matmul_qai8dxp`
    too). Each ``tiles(m, n, k_int, lhs_i8, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out)``
    computes the call and returns True, or returns False having written nothing (a layout or recipe it does not
    have)."""

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
        for tile in tiles:
            if tile(m, n, k_int, lhs_i8, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out):
                return
        fallback(
            m, n, k_int, lhs_i8, lhs_i32, lhs_f32, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out
        )

    return matmul_qai8dxp
