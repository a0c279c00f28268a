"""Numba executions of the exact-weight family ``qsi8d32p × qai8c16p``: the RHS packer, the matmul compute loop and
GET_ROWS, each bit for bit its numpy statement in :mod:`kleidipy.kernels.qsi8d32p_qai8c16p.ukernels` (layout and
float recipe documented there). The LHS is the Q4_1 family's packer and its numba code."""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.numerics import fma_f32_scalar
from kleidipy.kernels.qsi8d32p_qai4c32p.jit import TILE_N, _unpack_lhs, block_dots, tile_buffers

BL = 16  # values per RHS block
RHS_BLOCK_BYTES = 24  # per column: 16 int8 codes, f32 offset, f32 scale


@numba.njit(cache=True, nogil=True)
def rhs_pack(codes, zero, scale, bias, nr, chunk):
    """``rhs_pack_nxk_qai8c16p_qai8c16_f32_f32_f32_neon``: codes int8 [n, k], zero/scale f32 [n, k/16], bias [n]."""
    n, k = codes.shape
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    groups = (n + nr - 1) // nr
    out = np.zeros(groups * stride, np.uint8)
    out_i8 = out.view(np.int8)
    out_f32 = out.view(np.float32)
    for j in range(n):
        g, c = divmod(j, nr)
        for b in range(nb):
            base = g * stride + b * nr * RHS_BLOCK_BYTES
            for t in range(BL):
                out_i8[base + ((t // chunk) * nr + c) * chunk + t % chunk] = codes[j, b * BL + t]
            out_f32[(base + BL * nr) // 4 + c] = zero[j, b]
            out_f32[(base + (BL + 4) * nr) // 4 + c] = scale[j, b]
        out_f32[(g * stride + nb * nr * RHS_BLOCK_BYTES) // 4 + c] = bias[j]
    return out


@numba.njit(inline="always", cache=True)
def _rhs_column(rhs_i8, rhs_f32, group_off, nr, nb, chunk, c, w, zero, scale):
    """Column c of the RHS group at ``group_off``: codes into w [k], offsets and scales into zero/scale [nb]."""
    for b in range(nb):
        base = group_off + b * nr * RHS_BLOCK_BYTES
        for t in range(BL):
            w[b * BL + t] = rhs_i8[base + ((t // chunk) * nr + c) * chunk + t % chunk]
        zero[b] = rhs_f32[(base + BL * nr) // 4 + c]
        scale[b] = rhs_f32[(base + (BL + 4) * nr) // 4 + c]


@numba.njit(cache=True, nogil=True)
def get_rows(rhs, rows, k, nr, chunk):
    """GET_ROWS: float32 [len(rows), k] = f32(scale·code) + offset, read straight from the packed RHS."""
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    rhs_i8 = rhs.view(np.int8)
    rhs_f32 = rhs.view(np.float32)
    out = np.empty((rows.size, k), np.float32)
    w = np.empty(k, np.int32)
    zero = np.empty(nb, np.float32)
    scale = np.empty(nb, np.float32)
    for i in range(rows.size):
        g, c = divmod(rows[i], nr)
        _rhs_column(rhs_i8, rhs_f32, g * stride, nr, nb, chunk, c, w, zero, scale)
        for b in range(nb):
            for t in range(BL):
                out[i, b * BL + t] = scale[b] * np.float32(w[b * BL + t]) + zero[b]
    return out


@numba.njit(cache=True, nogil=True)
def gemv(n, k, nr, kbl, lhs, rhs):
    """One row (m == 1) straight from the packed columns: per group and 16-block the row's 16 values spread to the
    block's byte order once (:func:`matmul`'s float steps, the same bits), no transposed tile."""
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    block_bytes = nr * RHS_BLOCK_BYTES
    rhs_i8 = rhs.view(np.int8)
    rhs_f32 = rhs.view(np.float32)
    q, _, recip = _unpack_lhs(1, k, 1, kbl, lhs)
    spread = np.empty((nb, BL * nr), np.int32)  # spread[b, j]: the row's value multiplied by the block's byte j
    qsum = np.zeros(nb, np.int32)
    for b in range(nb):
        for j in range(BL * nr):
            spread[b, j] = q[0, b * BL + (j // (kbl * nr)) * kbl + j % kbl]
        for t in range(BL):
            qsum[b] += q[0, b * BL + t]
    out = np.empty((1, n), np.float32)
    dots = np.empty(nr, np.int32)
    for g in range((n + nr - 1) // nr):
        acc = np.zeros(nr, np.float32)
        for b in range(nb):
            base = g * stride + b * block_bytes
            for c in range(nr):
                d = 0
                for h in range(BL // kbl):
                    o = h * kbl * nr + c * kbl
                    for t in range(kbl):
                        d += spread[b, o + t] * np.int32(rhs_i8[base + o + t])
                dots[c] = d
            rc, s = recip[0, b // 2], np.float32(qsum[b])
            for c in range(nr):
                zero = rhs_f32[(base + BL * nr) // 4 + c]
                a = fma_f32_scalar(rhs_f32[(base + (BL + 4) * nr) // 4 + c] * rc, np.float32(dots[c]), acc[c])
                acc[c] = fma_f32_scalar(zero * rc, s, a) if zero != 0 else a
        for c in range(min(nr, n - g * nr)):
            out[0, g * nr + c] = acc[c] + rhs_f32[(g * stride + nb * block_bytes) // 4 + c]
    return out


@numba.njit(cache=True, nogil=True)
def matmul(m, n, k, mr, nr, kbl, lhs, rhs):
    """Both kernels: float32 [m, n], unclamped (lhs/rhs: writable C-contiguous uint8). Columns go in tiles of
    TILE_N, decoded once and transposed so that the integer dots and the float steps run across the tile; LHS rows
    go 4 at a time (zero rows pad m); one row takes :func:`gemv`. A block whose offset is ±0 skips its offset step
    (the same bits)."""
    if m == 1 and mr == 1:
        return gemv(n, k, nr, kbl, lhs, rhs)
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    rhs_i8 = rhs.view(np.int8)
    rhs_f32 = rhs.view(np.float32)
    q_m, _, recip = _unpack_lhs(m, k, mr, kbl, lhs)
    q, w_t, zero, scale, bias, dot, acc = tile_buffers(m, k, nb, q_m)
    qsum = np.zeros((q.shape[0], nb), np.int32)
    for i in range(m):
        for b in range(nb):
            s = 0
            for t in range(b * BL, (b + 1) * BL):
                s += q[i, t]
            qsum[i, b] = s
    out = np.empty((m, n), np.float32)
    for j0 in range(0, n, TILE_N):
        cols = min(TILE_N, n - j0)
        for c in range(cols):
            g, gc = divmod(j0 + c, nr)
            _rhs_column(rhs_i8, rhs_f32, g * stride, nr, nb, kbl, gc, w_t[:, c], zero[:, c], scale[:, c])
            bias[c] = rhs_f32[(g * stride + nb * nr * RHS_BLOCK_BYTES) // 4 + gc]
        for i0 in range(0, m, 4):
            rows = min(4, m - i0)
            acc[:, :cols] = 0
            for b32 in range(nb // 2):  # the LHS blocks, each two of the RHS's
                for b in range(2 * b32, 2 * b32 + 2):
                    block_dots(q, i0, rows, w_t, b * BL, (b + 1) * BL, cols, dot)
                    for r in range(rows):
                        rc, s = recip[i0 + r, b32], np.float32(qsum[i0 + r, b])
                        for c in range(cols):
                            a = fma_f32_scalar(scale[b, c] * rc, np.float32(dot[r, c]), acc[r, c])
                            if zero[b, c] != 0:
                                a = fma_f32_scalar(zero[b, c] * rc, s, a)
                            acc[r, c] = a
            for r in range(rows):
                for c in range(cols):
                    out[i0 + r, j0 + c] = acc[r, c] + bias[c]
    return out
