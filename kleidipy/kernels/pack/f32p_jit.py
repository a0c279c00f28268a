"""Numba code of the bias-then-rows f32 layout (:mod:`.f32p`): its packer and the one arithmetic of every kernel that
reads it (KleidiAI's F32 FMLA and FMOPA kernels: one fused multiply-add per k, in ascending k, from the bias)."""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.numerics import fma32


@numba.njit(cache=True, nogil=True)
def pack_bias_rows(rhs, bias, nr):
    """RHS K x N f32 -> groups of nr columns: nr f32 bias, then for each k the nr f32 of row k (padding 0)."""
    k, n = rhs.shape
    groups = (n + nr - 1) // nr
    out = np.zeros(groups * nr * (1 + k), dtype=np.float32)
    for g in range(groups):
        base = g * nr * (1 + k)
        for c in range(nr):
            col = g * nr + c
            if col >= n:
                break
            out[base + c] = bias[col]
            for kk in range(k):
                out[base + (1 + kk) * nr + c] = rhs[kk, col]
    return out.view(np.uint8)


@numba.njit(cache=True, nogil=True)
def matmul_f32_fma(m, n, k, lhs, rhs, nr, from_zero):
    """dst[m, n] = bias + sum_k lhs[., k] * rhs[k, .] as one fused multiply-add per k, in k order, of f32 rows lhs
    (m·k values) and the bias-then-rows RHS; ``from_zero``: the accumulator starts at +0 + bias (FMOPA of the bias
    into a zeroed ZA: a −0 bias starts at +0), else at the bias (FMLA's accumulators loaded with it)."""
    r = rhs.view(np.float32)
    gstride = nr * (1 + k)
    out = np.empty((m, n), dtype=np.float32)
    for j in range(n):
        base = (j // nr) * gstride
        c = j % nr
        for i in range(m):
            acc = r[base + c]
            if from_zero:
                acc = acc + np.float32(0.0)
            for kk in range(k):
                acc = fma32(lhs[i * k + kk], r[base + (1 + kk) * nr + c], acc)
            out[i, j] = acc
    return out
