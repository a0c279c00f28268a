"""Numba code of the Q4_0 family (``qsi8d32p`` LHS × ``qsi4c32p`` RHS): the LHS quantize+pack, the RHS pack
(the three layouts), the matmul cores and GET_ROWS, each reading and writing the same packed bytes as the numpy
reference in ``kleidipy/kernels/qsi8d32p_qsi4c32p.py``.

Layout identifiers (one per packed format; the kernels module maps packers to them):

* LHS ``LHS_QSI8D32P``: ``lhs_quant_pack_qsi8d32p_f32`` (and ``…4x8sb…``): per block, mr fp16 scales then
  mr × 32 int8 in chunks of kbl = kr/sr values per row.
* LHS ``LHS_QSI8D32P_NEON``: ``lhs_quant_pack_qsi8d32p_f32_neon``: all int8 in chunks of kr values per row,
  then all fp16 scales block-major.
* RHS ``RHS_SCALEF16``: ``qsi4c32pscalef16`` (NEON): per block, nr fp16 d then 32/kr segments of nr × kr/2
  bytes (GGML qs XOR 0x88: signed nibbles of k and k+16).
* RHS ``RHS_S1S0``: ``qsi4c32ps1s0scalef16`` (SME2): uint16 of 4 unsigned codes per (K group of 4, column),
  then fp16 d block-major.
* RHS ``RHS_S4S0``: ``qsi4c32ps4s0sf16`` (SME1): uint32 per (8-value packet, column), byte j = signed nibbles of
  k = 8p+j (low) and 8p+j+4 (high); then fp16(d/16) block-major (the kernel's dot is 16 × the true dot).

The matmul arithmetic (spec §5.2): per block an exact int32 dot ``a``, ``S = f32(s_L·s_R) + 0`` (FMLALB/FCVTL
products are exact; a −0 product becomes +0), then ``acc = fma(f32(a), S, acc)`` block after block from
``acc = +0`` — or from ``acc = −0`` for the MOPA kernels, whose first block is an FMUL (fma(x, y, −0) rounds
exactly as x·y and keeps a −0 product).
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.numerics import F16_BITS_TO_F32, f32_to_f16_bits_scalar, fma32, round_away_scalar, round_even_scalar
from kleidipy.kernels.pack.qsi4c32p_jit import RHS_S4S0, RHS_SCALEF16, rhs_block_map, rhs_data_offset, rhs_scale

LHS_QSI8D32P = 0
LHS_QSI8D32P_NEON = 1

#: Columns decoded together by the GEMM loop nest (a multiple of nr is used, at least nr).
PANEL_COLS = 64
#: Up to this many LHS rows, the GEMV loop nest (no decode pass) is used.
FEW_ROWS = 2


# --------------------------------------------------------------------------------------------- LHS


@numba.njit(cache=True, nogil=True, inline="always")
def _lhs_offsets(layout, mr, nb, base, b, r):
    """Byte offsets of block b's int8 data (row 0 of the group at ``base``) and of row r's fp16 scale."""
    if layout == LHS_QSI8D32P:
        return base + b * mr * 34 + 2 * mr, base + b * mr * 34 + 2 * r
    return base + b * mr * 32, base + mr * nb * 32 + 2 * (b * mr + r)


@numba.njit(cache=True, nogil=True)
def lhs_quant_pack_qsi8d32p(lhs, mr, kbl, row_offset, layout, ties_even):
    """Quantize float32 rows lhs [m, k] per 32-block and pack them (first row at position ``row_offset``).

    amax = max|x|, sf = f32(amax/127), inv = f32(1/sf) (0 if sf is 0), q = round(f32(x·inv)) (roundf, or
    ties-to-even when ``ties_even``), stored scale fp16(sf). ``kbl`` is the chunk of K values per row.
    """
    m, k = lhs.shape
    nb = k // 32
    groups = (row_offset + m + mr - 1) // mr
    stride = mr * nb * 34
    out = np.zeros(groups * stride, np.uint8)
    out_i8 = out.view(np.int8)
    sf = np.empty(nb, np.float32)
    sf_bits = sf.view(np.uint32)
    qrow = np.empty(32, np.int8)
    zero = np.float32(0.0)
    for i in range(m):
        x = lhs[i]
        x_bits = x.view(np.uint32)
        pr = row_offset + i
        base = (pr // mr) * stride
        r = pr % mr
        for b in range(nb):
            k0 = b * 32
            # amax: the largest |x| bit pattern (ordered as the floats; no NaN here), an integer max that
            # vectorises; sf[b] holds amax until it is replaced by the scale
            amax_bits = np.uint32(0)
            for t in range(32):
                amax_bits = max(amax_bits, x_bits[k0 + t] & np.uint32(0x7FFFFFFF))
            sf_bits[b] = amax_bits
            s = np.float32(sf[b] / np.float32(127.0))
            inv = np.float32(np.float32(1.0) / s) if s != zero else zero
            sf[b] = s
            for t in range(32):
                v = np.float32(x[k0 + t] * inv)
                qrow[t] = np.int8(round_even_scalar(v) if ties_even else round_away_scalar(v))
            data, _ = _lhs_offsets(layout, mr, nb, base, b, r)
            for c in range(32 // kbl):
                dst = data + c * mr * kbl + r * kbl
                for t in range(kbl):
                    out_i8[dst + t] = qrow[c * kbl + t]
        for b in range(nb):
            h = f32_to_f16_bits_scalar(sf_bits[b])
            _, so = _lhs_offsets(layout, mr, nb, base, b, r)
            out[so] = np.uint8(h & 0xFF)
            out[so + 1] = np.uint8(h >> 8)
    return out


@numba.njit(cache=True, nogil=True)
def _unpack_lhs(m, k, mr, kbl, lhs, layout):
    """int8 values q [m, k] and float32 scales [m, k/32] of a packed LHS."""
    nb = k // 32
    stride = mr * nb * 34
    lhs_i8 = lhs.view(np.int8)
    q = np.empty((m, k), np.int8)
    scale = np.empty((m, nb), np.float32)
    for i in range(m):
        base = (i // mr) * stride
        r = i % mr
        for b in range(nb):
            data, so = _lhs_offsets(layout, mr, nb, base, b, r)
            scale[i, b] = F16_BITS_TO_F32[np.int64(lhs[so]) | (np.int64(lhs[so + 1]) << 8)]
            for c in range(32 // kbl):
                src = data + c * mr * kbl + r * kbl
                for t in range(kbl):
                    q[i, b * 32 + c * kbl + t] = lhs_i8[src + t]
    return q, scale


# --------------------------------------------------------------------------------------------- RHS decode


@numba.njit(cache=True, nogil=True)
def _decode_rhs_panel(rhs, layout, nr, kr, nb, col0, ncols, b, w_t, scale):
    """Values of block b for columns col0 .. col0+ncols-1 (col0 a multiple of nr) into w_t [32, ncols]
    (K-major), their stored scales into scale [ncols]."""
    inner, k_lo, k_hi, flip = rhs_block_map(layout, kr)
    for gc in range(0, ncols, nr):
        g = (col0 + gc) // nr
        cols = min(nr, ncols - gc)
        data = rhs_data_offset(layout, nr, nb, g, b)
        for o in range(16 // inner):
            if nr >= 4 * inner:  # wide groups (SME): the column loop innermost, contiguous stores
                for t in range(inner):
                    lo_row = w_t[k_lo[o * inner + t], gc : gc + cols]
                    hi_row = w_t[k_hi[o * inner + t], gc : gc + cols]
                    src = data + o * nr * inner + t
                    for r in range(cols):
                        byte = np.int32(rhs[src + r * inner])
                        lo_row[r] = ((byte & 15) ^ flip) - 8
                        hi_row[r] = ((byte >> 4) ^ flip) - 8
            else:  # narrow groups (NEON nr=4): each column's run of inner bytes innermost
                for r in range(cols):
                    src = data + (o * nr + r) * inner
                    for t in range(inner):
                        byte = np.int32(rhs[src + t])
                        w_t[k_lo[o * inner + t], gc + r] = ((byte & 15) ^ flip) - 8
                        w_t[k_hi[o * inner + t], gc + r] = ((byte >> 4) ^ flip) - 8
        for r in range(cols):
            scale[gc + r] = rhs_scale(rhs, layout, nr, nb, g, b, r)


# --------------------------------------------------------------------------------------------- matmul


@numba.njit(cache=True, nogil=True, inline="always")
def _accumulate(acc, dot, dot_multiplier, s_l, s_r):
    """One block of the §5.2 recipe: fma(f32(a), f32(s_L·s_R) + 0, acc)."""
    s = np.float32(s_l * s_r) + np.float32(0.0)
    return fma32(np.float32(dot * dot_multiplier), s, acc)


@numba.njit(cache=True, nogil=True)
def _matmul_panels(q, lhs_scale, n, nr, kr, rhs, rhs_layout, out):
    """GEMM loop nest: per panel of columns and block, decode the RHS once (K-major), then int32 dots of every
    row vectorised across columns, then the float recipe."""
    m, k = q.shape
    nb = k // 32
    dot_multiplier = 16 if rhs_layout == RHS_S4S0 else 1
    panel = max(nr, (PANEL_COLS // nr) * nr)
    w_t = np.empty((32, panel), np.int32)
    rhs_scale = np.empty(panel, np.float32)
    dots = np.empty(panel, np.int32)
    for col0 in range(0, n, panel):
        ncols = min(panel, n - col0)
        for b in range(nb):
            _decode_rhs_panel(rhs, rhs_layout, nr, kr, nb, col0, ncols, b, w_t, rhs_scale)
            for i in range(m):
                dots[:ncols] = 0
                for t in range(32):
                    qv = np.int32(q[i, b * 32 + t])
                    for j in range(ncols):
                        dots[j] += qv * w_t[t, j]
                acc = out[i, col0 : col0 + ncols]
                for j in range(ncols):
                    acc[j] = _accumulate(acc[j], dots[j], dot_multiplier, lhs_scale[i, b], rhs_scale[j])


@numba.njit(cache=True, nogil=True)
def _matmul_rows(q, lhs_scale, n, nr, kr, rhs, rhs_layout, out):
    """GEMV loop nest: per row and block, the LHS values laid out like the RHS bytes, then every group's packed
    bytes are multiplied in place (vectorised, no decode pass) and summed per column."""
    m, k = q.shape
    nb = k // 32
    dot_multiplier = 16 if rhs_layout == RHS_S4S0 else 1
    inner, k_lo, k_hi, flip = rhs_block_map(rhs_layout, kr)
    span = nr * inner  # bytes of one o-slice of a group's block
    q_lo = np.empty(16 * nr, np.int32)
    q_hi = np.empty(16 * nr, np.int32)
    partial = np.empty(span, np.int32)
    for i in range(m):
        for b in range(nb):
            for o in range(16 // inner):
                for r in range(nr):
                    for t in range(inner):
                        p = (o * nr + r) * inner + t
                        q_lo[p] = q[i, b * 32 + k_lo[o * inner + t]]
                        q_hi[p] = q[i, b * 32 + k_hi[o * inner + t]]
            for g in range((n + nr - 1) // nr):
                data = rhs_data_offset(rhs_layout, nr, nb, g, b)
                partial[:] = 0
                for o in range(16 // inner):
                    src = data + o * span
                    for j in range(span):
                        byte = np.int32(rhs[src + j])
                        lo = ((byte & 15) ^ flip) - 8
                        hi = ((byte >> 4) ^ flip) - 8
                        partial[j] += lo * q_lo[o * span + j] + hi * q_hi[o * span + j]
                for r in range(min(nr, n - g * nr)):
                    dot = np.int32(0)
                    for t in range(inner):
                        dot += partial[r * inner + t]
                    s_r = rhs_scale(rhs, rhs_layout, nr, nb, g, b, r)
                    col = g * nr + r
                    out[i, col] = _accumulate(out[i, col], dot, dot_multiplier, lhs_scale[i, b], s_r)


@numba.njit(cache=True, nogil=True)
def _matmul(m, n, k, mr, kbl, nr, kr, lhs, rhs, lhs_layout, rhs_layout, first_block_fmul):
    """Unclamped float32 [m, n] of packed LHS × packed RHS (the §5.2 recipe, blocks in order)."""
    q, lhs_scale = _unpack_lhs(m, k, mr, kbl, lhs, lhs_layout)
    zero = np.float32(0.0)
    out = np.empty((m, n), np.float32)
    out[:, :] = -zero if first_block_fmul else zero
    if m <= FEW_ROWS:
        _matmul_rows(q, lhs_scale, n, nr, kr, rhs, rhs_layout, out)
    else:
        _matmul_panels(q, lhs_scale, n, nr, kr, rhs, rhs_layout, out)
    return out


@numba.njit(cache=True, nogil=True)
def matmul_qsi8d32p_qsi4c32pscalef16(m, n, k, mr, nr, kr, sr, lhs, rhs):
    """NEON kernels (dotprod / i8mm): ``lhs_quant_pack_qsi8d32p_f32`` LHS × ``qsi4c32pscalef16`` RHS."""
    return _matmul(m, n, k, mr, kr // sr, nr, kr, lhs, rhs, LHS_QSI8D32P, RHS_SCALEF16, False)


@numba.njit(cache=True, nogil=True)
def matmul_qsi8d32p_qsi4c32ps4s0sf16(m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    """SME1 kernels: ``lhs_quant_pack_qsi8d32p_f32_neon`` LHS (kr 4) × ``qsi4c32ps4s0sf16`` RHS."""
    return _matmul(m, n, k, mr, 4, nr, 4, lhs, rhs, LHS_QSI8D32P_NEON, RHS_S4S0, first_block_fmul)
