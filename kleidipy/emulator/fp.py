"""Exact lane-wise floating-point primitives the emulated instructions share (numba, compiled once and cached).

numpy has no fused multiply-add and no round-to-odd, so the instructions that need them (FMLA/FMLALB/FMLALT, the
FPCR.EBF = 0 BF16 dot products of BFMOPA/BFMMLA/BFDOT and the widening F16 FMOPA's single rounding of a pair of
products) call these loops over their lanes. The scalar
semantics are kleidipy's: :func:`kleidipy.core.numerics.fma32` (one rounding) and
:func:`kleidipy.core.numerics.bfdotadd` (every step rounded to odd, denormals flushed).
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.numerics import F16_BITS_TO_F32, bf16_value, bfdotadd, fma32


@numba.njit(cache=True, nogil=True)
def fma_lanes(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a·b + c per lane with a single rounding (1-D arrays of equal length)."""
    out = np.empty(c.size, dtype=np.float32)
    for i in range(c.size):
        out[i] = fma32(a[i], b[i], c[i])
    return out


@numba.njit(cache=True, nogil=True)
def bf16_outer_pairs(acc: np.ndarray, a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """acc[i, j] ← BFDotAdd(acc[i, j], a[i, 0]·b[j, 0] + a[i, 1]·b[j, 1]) for bf16 pairs a [rows, 2], b [cols, 2]
    (uint16 bit patterns) and a float32 accumulator tile [rows, cols] (BFMOPA; BFMMLA/BFDOT use it per lane)."""
    out = np.empty_like(acc)
    for i in range(acc.shape[0]):
        a0 = bf16_value(a_bits[i, 0])
        a1 = bf16_value(a_bits[i, 1])
        for j in range(acc.shape[1]):
            out[i, j] = np.float32(
                bfdotadd(np.float64(acc[i, j]), a0, bf16_value(b_bits[j, 0]), a1, bf16_value(b_bits[j, 1]))
            )
    return out


@numba.njit(cache=True, nogil=True)
def bf16_dot_lanes(acc: np.ndarray, a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """acc[l] ← BFDotAdd(acc[l], a[l, 0]·b[l, 0] + a[l, 1]·b[l, 1]) per lane (BFDOT, vector form)."""
    out = np.empty_like(acc)
    for i in range(acc.size):
        out[i] = np.float32(
            bfdotadd(
                np.float64(acc[i]),
                bf16_value(a_bits[i, 0]),
                bf16_value(b_bits[i, 0]),
                bf16_value(a_bits[i, 1]),
                bf16_value(b_bits[i, 1]),
            )
        )
    return out


@numba.njit(cache=True, nogil=True)
def f16_outer_pairs(acc: np.ndarray, a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """acc[i, j] ← f32(acc[i, j] + f32(a[i, 0]·b[j, 0] + a[i, 1]·b[j, 1])) for F16 pairs a [rows, 2], b [cols, 2]
    (uint16 bit patterns): FMOPA (widening, FP16 to FP32) — the two products exact, their sum rounded once to
    float32 (FPDot), then added with a second rounding. An F16 product is exact in float32; the float64 sum of two
    of them, rounded to float32, is the single rounding of the exact sum (when the float64 sum is inexact, one
    product is below 2^-30 of the other and the result is the larger one)."""
    out = np.empty_like(acc)
    for i in range(acc.shape[0]):
        a0 = F16_BITS_TO_F32[a_bits[i, 0]]
        a1 = F16_BITS_TO_F32[a_bits[i, 1]]
        for j in range(acc.shape[1]):
            pair = np.float64(a0 * F16_BITS_TO_F32[b_bits[j, 0]]) + np.float64(a1 * F16_BITS_TO_F32[b_bits[j, 1]])
            out[i, j] = acc[i, j] + np.float32(pair)
    return out
