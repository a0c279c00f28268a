"""Exact float32 building blocks in numpy: fp16/bf16 conversion, C rounding modes, single-rounded fma.

These are the primitives the reference executions use to state KleidiAI's arithmetic step by step.
"""

from __future__ import annotations

import numpy as np

FLT_MAX = float(np.finfo(np.float32).max)

#: fp16 bit pattern -> float32 value, for all 65536 patterns (exact).
F16_BITS_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def f16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Exact float32 values of fp16 bit patterns (any integer array)."""
    return F16_BITS_TO_F32[np.asarray(bits).astype(np.uint16)]


def f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """fp16 bit patterns of float32 values, rounded to nearest even (hardware FCVT)."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 bit patterns of float32 values, rounded to nearest even (BFCVT); NaN stays a quiet NaN."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    rounded = np.where(nan, (u >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Exact float32 values of bf16 bit patterns."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def round_away(x: np.ndarray) -> np.ndarray:
    """C ``roundf``/``lround``: nearest integer, ties away from zero (computed in float64: exact)."""
    x64 = np.asarray(x, dtype=np.float64)
    return np.copysign(np.floor(np.abs(x64) + 0.5), x64)


def round_even(x: np.ndarray) -> np.ndarray:
    """``rintf``/``vcvtn``: nearest integer, ties to even."""
    return np.rint(np.asarray(x, dtype=np.float64))


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add a*b + c with a single rounding (IEEE fma), vectorised.

    a*b is exact in float64 (24+24 bits). The float64 sum is made round-to-odd with the exact TwoSum error,
    so the final cast to float32 rounds once correctly.
    """
    a64 = np.asarray(a, dtype=np.float32).astype(np.float64)
    b64 = np.asarray(b, dtype=np.float32).astype(np.float64)
    c64 = np.asarray(c, dtype=np.float32).astype(np.float64)
    p = a64 * b64
    s = p + c64
    bp = s - c64
    err = (p - bp) + (c64 - (s - bp))
    inexact_even = (err != 0) & ((np.atleast_1d(s).view(np.int64).reshape(s.shape) & 1) == 0) & np.isfinite(s)
    s = np.where(inexact_even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    # An exact zero sum keeps the float64 addition's IEEE sign (+0 unless both terms are -0), as fma does.
    return s.astype(np.float32)


def fmax_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Arm FMAX on non-NaN float32: like max, but max(+0, -0) is +0 whatever the order."""
    a, b = np.float32(a) if np.isscalar(a) else a, np.float32(b) if np.isscalar(b) else b
    return np.where(a == b, np.where(a == 0, a + b, a), np.maximum(a, b)).astype(np.float32)


def fmin_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Arm FMIN on non-NaN float32: like min, but min(+0, -0) is -0 whatever the order."""
    a, b = np.float32(a) if np.isscalar(a) else a, np.float32(b) if np.isscalar(b) else b
    return np.where(a == b, np.where(a == 0, -((-a) + (-b)), a), np.minimum(a, b)).astype(np.float32)


def clamp_f32(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """KleidiAI's clamp: FMAX with min, then FMIN with max, in float32 (signed zeros as Arm orders them).

    Only a ±0 bound can tie with a value of the other sign; without one, a plain clip is the same thing.
    """
    if lo != 0 and hi != 0:
        return np.clip(np.asarray(x, dtype=np.float32), np.float32(lo), np.float32(hi))
    return fmin_f32(fmax_f32(np.asarray(x, dtype=np.float32), np.float32(lo)), np.float32(hi))
