"""Numba executions of the Q4_1 family ``qsi8d32p × qai4c32p``: the NEON and SME2 RHS packers, the matmul compute
loops and GET_ROWS.

Each function matches its numpy statement in :mod:`kleidipy.kernels.qsi8d32p_qai4c32p.ukernels` bit for bit; the
layouts and the float recipe are documented there (the LHS quantize+pack is
:mod:`~kleidipy.kernels.qsi8d32p_qai4c32p.vnni_pack`'s). Packed RHS blocks of both layouts are read through one
per-column decoder: ``neon`` selects the NEON layout (nibble pair (t, t+16) XOR 0x88, kernel weight
16·(u−8), chunks of kr/sr bytes) or the SME2 one (nibble pair (2j, 2j+1), weight u−8, chunks of 2 bytes).
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.numerics import fma_f32_scalar

BL = 32
LHS_BLOCK_BYTES = 40  # per row: 32 int8, f32 row sum, f32 recip
RHS_BLOCK_BYTES = 24  # per column: 16 bytes of nibbles, f32 zero, f32 scale
SME_CHUNK = 2  # bytes per column per K quad in the SME2 layout (one uint16)
SME_LHS_KBL = 4  # kr/sr of the SME2 kernels
TILE_N = 64  # columns per compute tile of the matmul loop


# --------------------------------------------------------------------------------------------- LHS


@numba.njit(cache=True, nogil=True)
def _unpack_lhs(m, k, mr, kbl, lhs):
    """Packed LHS -> int8 q [m, k], f32 row sums and recips [m, nb]."""
    nb = k // BL
    stride = mr * nb * LHS_BLOCK_BYTES
    lhs_i8 = lhs.view(np.int8)
    lhs_f32 = lhs.view(np.float32)
    q = np.empty((m, k), np.int8)
    row_sum = np.empty((m, nb), np.float32)
    recip = np.empty((m, nb), np.float32)
    for r in range(m):
        g, ri = divmod(r, mr)
        for b in range(nb):
            base = g * stride + b * mr * LHS_BLOCK_BYTES
            for t in range(BL):
                q[r, b * BL + t] = lhs_i8[base + (t // kbl) * mr * kbl + ri * kbl + t % kbl]
            row_sum[r, b] = lhs_f32[(base + BL * mr) // 4 + ri]
            recip[r, b] = lhs_f32[(base + (BL + 4) * mr) // 4 + ri]
    return q, row_sum, recip


# --------------------------------------------------------------------------------------------- RHS


@numba.njit(inline="always", cache=True)
def _code(codes, row, e, high_first):
    """Unsigned 4-bit code of element e of ``row`` (``high_first``: s0s1 input, even element in the high nibble)."""
    byte = np.int64(codes[row, e // 2])
    if (e % 2 == 0) == high_first:
        return byte >> 4
    return byte & 0x0F


@numba.njit(cache=True, nogil=True)
def _byte_offsets(nr, chunk):
    """Offset in a packed RHS block of column c's byte j (j < 16): chunks of ``chunk`` bytes, columns interleaved."""
    offsets = np.empty((nr, BL // 2), np.int64)
    for c in range(nr):
        for j in range(BL // 2):
            offsets[c, j] = ((j // chunk) * nr + c) * chunk + j % chunk
    return offsets


@numba.njit(cache=True, nogil=True)
def rhs_pack(codes, high_first, zero, scale, bias, has_bias, n, k, nr, chunk, neon):
    """The qai4c32p RHS packers (NEON when ``neon``, else SME2 nrx4); codes uint8 [n, k/2], zero/scale [n, nb]."""
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    groups = (n + nr - 1) // nr
    out = np.zeros(groups * stride, np.uint8)
    out_f32 = out.view(np.float32)
    offsets = _byte_offsets(nr, chunk)
    for g in range(groups):
        for c in range(nr):
            row = min(g * nr + c, n - 1)
            for b in range(nb):
                base = g * stride + b * nr * RHS_BLOCK_BYTES
                for j in range(BL // 2):
                    if neon:
                        lo = _code(codes, row, b * BL + j, high_first)
                        hi = _code(codes, row, b * BL + j + BL // 2, high_first)
                        byte = (lo | hi << 4) ^ 0x88
                    else:
                        lo = _code(codes, row, b * BL + 2 * j, high_first)
                        hi = _code(codes, row, b * BL + 2 * j + 1, high_first)
                        byte = lo | hi << 4
                    out[base + offsets[c, j]] = byte
                s = scale[row, b] * np.float32(0.0625) if neon else scale[row, b]
                out_f32[(base + 16 * nr) // 4 + c] = zero[row, b]
                out_f32[(base + 20 * nr) // 4 + c] = s
            if has_bias and (neon or g * nr + c < n):
                out_f32[(g * stride + nb * nr * RHS_BLOCK_BYTES) // 4 + c] = bias[row]
    return out


@numba.njit(inline="always", cache=True)
def _rhs_column(rhs, rhs_f32, group_off, nr, nb, offsets, neon, c, w, zero, scale):
    """Decode column c of the RHS group at ``group_off`` into kernel weights w [k] and stored zero/scale [nb]
    (``offsets`` from :func:`_byte_offsets`)."""
    for b in range(nb):
        base = group_off + b * nr * RHS_BLOCK_BYTES
        for j in range(BL // 2):
            byte = np.int64(rhs[base + offsets[c, j]])
            if neon:  # signed nibble in the high half of an int8: 16·(u − 8)
                w[b * BL + j] = np.int8((byte & 0x0F) << 4)
                w[b * BL + j + BL // 2] = np.int8(byte & 0xF0)
            else:
                w[b * BL + 2 * j] = np.int8(byte & 0x0F) - 8
                w[b * BL + 2 * j + 1] = np.int8(byte >> 4) - 8
        zero[b] = rhs_f32[(base + 16 * nr) // 4 + c]
        scale[b] = rhs_f32[(base + 20 * nr) // 4 + c]


@numba.njit(cache=True, nogil=True)
def get_rows(rhs, rows, k, nr, chunk, neon):
    """GET_ROWS: float32 [len(rows), k] = f32(scale·w) + zero, read straight from the packed RHS."""
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    rhs_f32 = rhs.view(np.float32)
    out = np.empty((rows.size, k), np.float32)
    offsets = _byte_offsets(nr, chunk)
    w = np.empty(k, np.int8)
    zero = np.empty(nb, np.float32)
    scale = np.empty(nb, np.float32)
    for i in range(rows.size):
        g, c = divmod(rows[i], nr)
        _rhs_column(rhs, rhs_f32, g * stride, nr, nb, offsets, neon, c, w, zero, scale)
        for b in range(nb):
            for t in range(BL):
                out[i, b * BL + t] = scale[b] * np.float32(w[b * BL + t]) + zero[b]
    return out


# --------------------------------------------------------------------------------------------- matmul


@numba.njit(cache=True, nogil=True)
def tile_buffers(m, k, nb, q_m):
    """The portable loops' work arrays: the LHS codes q_m [m, k] padded with zero rows to whole groups of 4 (int32),
    and for a tile of TILE_N columns its transposed weights, per-block zero points (or offsets) and scales, its
    bias, the integer dots and the accumulators of 4 rows."""
    q = np.zeros(((m + 3) // 4 * 4, k), np.int32)
    q[:m] = q_m
    cols = np.empty((nb, TILE_N), np.float32), np.empty((nb, TILE_N), np.float32), np.empty(TILE_N, np.float32)
    return q, np.empty((k, TILE_N), np.int32), *cols, np.empty((4, TILE_N), np.int32), np.empty((4, TILE_N), np.float32)


@numba.njit(inline="always", cache=True)
def block_dots(q, i0, rows, w_t, t0, t1, cols, dot):
    """dot[r, c] = Σ q[i0 + r, t]·w_t[t, c] over t0 ≤ t < t1 for the 4 rows at i0 (row 0 only when rows == 1) and the
    first ``cols`` columns: the integer dots of the portable loops, 4 rows sharing each weight load."""
    dot[:, :cols] = 0
    for t in range(t0, t1):
        q0, q1, q2, q3 = q[i0, t], q[i0 + 1, t], q[i0 + 2, t], q[i0 + 3, t]
        if rows == 1:  # GEMV
            for c in range(cols):
                dot[0, c] += q0 * w_t[t, c]
            continue
        for c in range(cols):
            wv = w_t[t, c]
            dot[0, c] += q0 * wv
            dot[1, c] += q1 * wv
            dot[2, c] += q2 * wv
            dot[3, c] += q3 * wv


@numba.njit(cache=True, nogil=True)
def matmul(m, n, k, mr, nr, kbl, chunk, lhs, rhs, neon, first_block_fmul):
    """The compute loop of every kernel (lhs/rhs: writable C-contiguous uint8; ``chunk`` as in :func:`_byte_offsets`).

    Columns go in tiles of TILE_N, decoded once and transposed so that the integer dots and the float steps run
    across the tile's columns; LHS rows go 4 at a time (zero rows pad m)."""
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    rhs_f32 = rhs.view(np.float32)
    q_m, row_sum, recip = _unpack_lhs(m, k, mr, kbl, lhs)
    q, w_t, zero, scale, bias, dot, acc = tile_buffers(m, k, nb, q_m)
    out = np.empty((m, n), np.float32)
    offsets = _byte_offsets(nr, chunk)
    for j0 in range(0, n, TILE_N):
        cols = min(TILE_N, n - j0)
        for c in range(cols):
            g, gc = divmod(j0 + c, nr)
            _rhs_column(rhs, rhs_f32, g * stride, nr, nb, offsets, neon, gc, w_t[:, c], zero[:, c], scale[:, c])
            bias[c] = rhs_f32[(g * stride + nb * nr * RHS_BLOCK_BYTES) // 4 + gc]
        for i0 in range(0, m, 4):
            rows = min(4, m - i0)
            acc[:, :cols] = 0
            for b in range(nb):
                block_dots(q, i0, rows, w_t, b * BL, (b + 1) * BL, cols, dot)
                for r in range(rows):
                    rs, rc = row_sum[i0 + r, b], recip[i0 + r, b]
                    if first_block_fmul and b == 0:
                        for c in range(cols):
                            acc[r, c] = fma_f32_scalar(scale[b, c] * rc, np.float32(dot[r, c]), zero[b, c] * rs)
                    else:
                        for c in range(cols):
                            zero_term = fma_f32_scalar(zero[b, c], rs, acc[r, c])
                            acc[r, c] = fma_f32_scalar(scale[b, c] * rc, np.float32(dot[r, c]), zero_term)
            for r in range(rows):
                for c in range(cols):
                    out[i0 + r, j0 + c] = acc[r, c] + bias[c]
    return out


@numba.njit(cache=True, nogil=True)
def matmul_neon(m, n, k, mr, nr, kbl, lhs, rhs):
    """The four NEON kernels (i8mm / dotprod, GEMM / GEMV): float32 [m, n], unclamped."""
    return matmul(m, n, k, mr, nr, kbl, kbl, lhs, rhs, True, False)


@numba.njit(cache=True, nogil=True)
def matmul_sme2(m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    """The two SME2 kernels: float32 [m, n], unclamped (``first_block_fmul``, the MOPA kernel's: the first block's
    zero term is an FMUL)."""
    return matmul(m, n, k, mr, nr, SME_LHS_KBL, SME_CHUNK, lhs, rhs, False, first_block_fmul)
