"""Numba code of the F16-LHS Q4_0 family: the LHS pack (``f16pmrx2``) and the matmul, the same bits as the numpy
reference in :mod:`.ukernels` and as KleidiAI's SME2 kernel.

The kernel's arithmetic, per output (row i, column j): the weights w = f16((u − 8)·d) (``luti4`` then the F16
``fmul`` by the block's scale: rounded once to F16), the LHS a = f16(x) (the packer's FCVT), and per pair of K
values p, in order, the widening FMOPA's step acc = f32(acc + f32(a[2p]·w[2p] + a[2p+1]·w[2p+1])): both products
exact, their sum rounded once to float32, then added to the accumulator (from +0, ``zero {za}``) with a second
rounding. Here the products are exact in float32 and their sum is taken in float64, then rounded to float32: that
is the single rounding of the exact sum (a pair whose float64 sum is inexact has one product below 2^-30 of the
other, and the float32 result is the larger product, which float64 keeps).
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.numerics import F16_BITS_TO_F32, f32_bits, f32_to_f16_bits_scalar, round_f16_scalar
from kleidipy.kernels.pack.qsi4c32p_jit import RHS_S1S0, rhs_block_map, rhs_data_offset, rhs_scale


@numba.njit(cache=True, nogil=True)
def lhs_pack_f16pmrx2(lhs, mr):
    """Rows of float32 [m, k] as fp16 (nearest even) in groups of mr rows: half (g, p, r, t) — K pair p, row r of
    group g, element 2p + t — at g·mr·k + 2·(p·mr + r) + t; the last group's rows past m are 0."""
    m, k = lhs.shape
    groups = (m + mr - 1) // mr
    out = np.zeros(groups * mr * k, np.uint16)
    for i in range(m):
        base = (i // mr) * mr * k + 2 * (i % mr)
        for c in range(k):
            out[base + (c // 2) * 2 * mr + c % 2] = f32_to_f16_bits_scalar(f32_bits(np.float32(lhs[i, c])))
    return out.view(np.uint8)


@numba.njit(cache=True, nogil=True)
def _weights(rhs, n, k, nr):
    """The kernel's F16 weights as float32, K-major [k, n]: f16((u − 8)·d) of the ``qsi4c32ps1s0scalef16`` layout."""
    nb = k // 32
    inner, k_lo, k_hi, _ = rhs_block_map(RHS_S1S0, 4)
    w_t = np.empty((k, n), np.float32)
    for j in range(n):
        g, r = j // nr, j % nr
        for b in range(nb):
            d = rhs_scale(rhs, RHS_S1S0, nr, nb, g, b, r)
            data = rhs_data_offset(RHS_S1S0, nr, nb, g, b)
            for o in range(8):
                for t in range(inner):
                    byte = np.int32(rhs[data + (o * nr + r) * inner + t])
                    w_t[b * 32 + k_lo[o * inner + t], j] = round_f16_scalar(np.float32((byte & 15) - 8) * d)
                    w_t[b * 32 + k_hi[o * inner + t], j] = round_f16_scalar(np.float32((byte >> 4) - 8) * d)
    return w_t


@numba.njit(cache=True, nogil=True)
def matmul(m, n, k, mr, nr, lhs, rhs):
    """Unclamped float32 [m, n] of the packed LHS (mr rows per group) × the packed RHS (nr columns per group)."""
    w_t = _weights(rhs, n, k, nr)
    halves = lhs.view(np.uint16)
    out = np.empty((m, n), np.float32)
    acc = np.empty(n, np.float32)
    for i in range(m):
        base = (i // mr) * mr * k + 2 * (i % mr)
        acc[:] = 0
        for p in range(k // 2):
            a0 = F16_BITS_TO_F32[halves[base + 2 * p * mr]]
            a1 = F16_BITS_TO_F32[halves[base + 2 * p * mr + 1]]
            for j in range(n):
                pair = np.float64(a0 * w_t[2 * p, j]) + np.float64(a1 * w_t[2 * p + 1, j])
                acc[j] = acc[j] + np.float32(pair)
        out[i] = acc
    return out
