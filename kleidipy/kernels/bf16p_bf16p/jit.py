"""Numba code of the BF16 family: its packers and the BFMOPA/BFMMLA/BFDOT kernels.

Each function mirrors a numpy reference in ``ukernels.py`` beside it bit for bit. The BF16 arithmetic is the
FPCR.EBF = 0 ``BFDotAdd`` described there: every product and sum is rounded to odd in float32, denormal inputs and
results are flushed to zero, NaN results are the default NaN.
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.numerics import bf16_round, bf16_value, bfdotadd

# --------------------------------------------------------------------------------------------- packers


@numba.njit(cache=True, nogil=True)
def pack_lhs_bf16(lhs, mr, kr, pad_first_row):
    """LHS rows [m, k] f32 -> bf16 groups of mr rows x (kp/kr chunks of mr rows x kr); kp = roundup(k, kr).

    Padding rows are 0, or copies of the group's first row when ``pad_first_row``."""
    m, k = lhs.shape
    kp = (k + kr - 1) // kr * kr
    groups = (m + mr - 1) // mr
    out = np.zeros(groups * mr * kp, dtype=np.uint16)
    for g in range(groups):
        for r in range(mr):
            row = g * mr + r
            if row >= m:
                if not pad_first_row:
                    continue
                row = g * mr
            for kk in range(k):
                idx = ((g * (kp // kr) + kk // kr) * mr + r) * kr + kk % kr
                out[idx] = bf16_round(lhs[row, kk])
    return out.view(np.uint8)


@numba.njit(cache=True, nogil=True)
def pack_rhs_bf16_kxn(rhs, bias, nr, kr):
    """RHS K x N f32 -> groups of nr columns: nr f32 bias, then kp/kr chunks of nr columns x kr bf16."""
    k, n = rhs.shape
    kp = (k + kr - 1) // kr * kr
    groups = (n + nr - 1) // nr
    stride = nr * 4 + nr * kp * 2
    out = np.zeros(groups * stride, dtype=np.uint8)
    for g in range(groups):
        base = g * stride
        head = out[base : base + nr * 4].view(np.float32)
        data = out[base + nr * 4 : base + stride].view(np.uint16)
        for c in range(nr):
            col = g * nr + c
            if col >= n:
                break
            head[c] = bias[col]
            for kk in range(k):
                data[((kk // kr) * nr + c) * kr + kk % kr] = bf16_round(rhs[kk, col])
    return out


# --------------------------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def matmul_bf16(m, n, k, lhs, rhs, mr, nr, kr, two_accumulators):
    """dst[m, n] of packed BF16 LHS (groups of mr rows) and RHS (groups of nr columns, bias first).

    One accumulator per output starting at the bias takes every K pair in order (BFMOPA / BFMMLA); with
    ``two_accumulators`` (the BFDOT GEMV) even pairs go to one started at the bias, odd pairs to one started
    at 0, and the two are added at the end in float32 (FADDP, round to nearest)."""
    kp = (k + kr - 1) // kr * kr
    chunks = kp // kr
    lhs16 = lhs.view(np.uint16)
    rstride = nr * 4 + nr * kp * 2
    a = np.empty((m, kp), dtype=np.float64)
    for i in range(m):
        for kk in range(kp):
            a[i, kk] = bf16_value(lhs16[(((i // mr) * chunks + kk // kr) * mr + i % mr) * kr + kk % kr])
    b = np.empty((n, kp), dtype=np.float64)
    bias = np.empty(n, dtype=np.float64)
    for j in range(n):
        base = (j // nr) * rstride
        bias[j] = rhs[base : base + nr * 4].view(np.float32)[j % nr]
        data = rhs[base + nr * 4 : base + rstride].view(np.uint16)
        for kk in range(kp):
            b[j, kk] = bf16_value(data[((kk // kr) * nr + j % nr) * kr + kk % kr])
    out = np.empty((m, n), dtype=np.float32)
    for i in range(m):
        for j in range(n):
            acc0 = bias[j]
            acc1 = 0.0
            for p in range(kp // 2):
                if two_accumulators and p % 2 == 1:
                    acc1 = bfdotadd(acc1, a[i, 2 * p], b[j, 2 * p], a[i, 2 * p + 1], b[j, 2 * p + 1])
                else:
                    acc0 = bfdotadd(acc0, a[i, 2 * p], b[j, 2 * p], a[i, 2 * p + 1], b[j, 2 * p + 1])
            if two_accumulators:
                out[i, j] = np.float32(acc0) + np.float32(acc1)
            else:
                out[i, j] = np.float32(acc0)
    return out
