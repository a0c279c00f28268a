"""Exact float32 building blocks, in numpy and as numba scalars: fp16/bf16 conversion, C rounding modes,
single-rounded fma, and the FPCR.EBF = 0 BF16 arithmetic (round-to-odd BFDotAdd).

The numpy functions are what the reference executions use to state KleidiAI's arithmetic step by step; the
``*_scalar`` / scalar functions are their counterparts inside numba code (jit executions and the emulator).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

FLT_MAX = float(np.finfo(np.float32).max)


def _f16_table() -> np.ndarray:
    """float32 of every fp16 bit pattern, built from the bits (no float conversion, so the same on every host and
    no warning): exact for numbers and infinities; NaNs quieted with their payload kept, as Arm's FCVT does
    (numpy's own conversion leaves signalling NaNs signalling on x86 and quiets them on aarch64)."""
    h = np.arange(65536, dtype=np.uint32)
    sign, exp, mant = (h >> 15) << 31, (h >> 10) & 0x1F, h & 0x3FF
    normal = sign | ((exp + (127 - 15)) << 23) | (mant << 13)
    special = sign | 0x7F800000 | np.where(mant != 0, 0x400000 | (mant << 13), 0)
    bits = np.where(exp == 31, special, normal).astype(np.uint32)
    out = bits.view(np.float32).copy()
    sub = exp == 0  # zeros and subnormals: mant * 2^-24, exact in float32
    out[sub] = (
        np.where(sign[sub] != 0, -1.0, 1.0).astype(np.float32) * mant[sub].astype(np.float32) * np.float32(2.0**-24)
    )
    return out


#: fp16 bit pattern -> float32 value, for all 65536 patterns (exact; NaNs quieted, see :func:`_f16_table`).
F16_BITS_TO_F32 = _f16_table()


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


# --------------------------------------------------------------------------------------------- numba scalars


@intrinsic
def fma32(typingctx, a, b, c):
    """float32 a*b + c with one rounding (LLVM's llvm.fma.f32: vfmadd on x86, fmadd on Arm)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fty = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [fty], ir.FunctionType(fty, [fty, fty, fty]))
        return builder.call(fn, list(args))

    return sig, codegen


@numba.njit(inline="always", cache=True)
def fma_f32_scalar(a, b, c):
    """fma on float32 scalars (casts its arguments)."""
    return fma32(np.float32(a), np.float32(b), np.float32(c))


@numba.njit(cache=True, nogil=True, inline="always")
def f32_to_f16_bits_scalar(bits):
    """fp16 bit pattern of a float32 given by its bit pattern, rounded to nearest even (FCVT; numpy's NaN rule)."""
    bits = np.int64(bits)
    sign = (bits >> 16) & 0x8000
    e = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    if e == 0xFF:  # Inf, or NaN keeping its top payload bits
        return np.uint16(sign | 0x7C00 | max(mant >> 13, 1 if mant else 0))
    exp = e - 127 + 15
    if exp >= 31:
        return np.uint16(sign | 0x7C00)
    if exp <= 0:  # fp16 subnormal (or zero below half the smallest one)
        if exp < -10:
            return np.uint16(sign)
        shift = 14 - exp
        full = mant | 0x800000
        h = full >> shift
        rem = full & ((1 << shift) - 1)
        half = 1 << (shift - 1)
    else:
        h = (exp << 10) | (mant >> 13)
        rem = mant & 0x1FFF
        half = 0x1000
    if rem > half or (rem == half and (h & 1) != 0):
        h += 1  # a carry into the exponent gives the next binade, or Inf
    return np.uint16(sign | h)


@numba.njit(inline="always", cache=True)
def round_away_scalar(x):
    """C roundf / lround on a float (ties away from zero), computed in float64."""
    y = np.float64(x)
    if y >= 0:
        return np.floor(y + 0.5)
    return -np.floor(-y + 0.5)


@numba.njit(inline="always", cache=True)
def round_even_scalar(x):
    """rintf: nearest integer, ties to even."""
    return np.rint(np.float64(x))


# --------------------------------------------------------------------------------------------- bf16 (EBF = 0)

#: the float32 default NaN (what FPCR.DN = 1 arithmetic returns for any NaN result).
DEFAULT_NAN_BITS = 0x7FC00000
_MIN_NORMAL = 2.0**-126
_OVERFLOW = 2.0**128
_LOW29 = (1 << 29) - 1  # the float64 fraction bits below float32 precision


def _bitcast(src: types.Type, dst: types.Type):
    """Intrinsic reinterpreting the bits of a ``src`` scalar as a ``dst`` scalar of the same width."""

    @intrinsic
    def bitcast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(dst))

        return dst(src), codegen

    return bitcast


_f64_bits = _bitcast(types.float64, types.int64)
_bits_f64 = _bitcast(types.int64, types.float64)
f32_bits = _bitcast(types.float32, types.uint32)
bits_f32 = _bitcast(types.uint32, types.float32)


@numba.njit(inline="always", cache=True)
def bf16_round(x):
    """bf16 bit pattern of a float32 value, rounded to nearest even (BFCVT); NaN stays a quiet NaN."""
    u = np.int64(f32_bits(np.float32(x)))
    if x != x:
        return np.uint16((u >> 16) | 0x40)
    return np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


@numba.njit(inline="always", cache=True)
def bf16_value(bits):
    """float64 value of a bf16 bit pattern, flushed to zero when denormal (EBF = 0 input flush)."""
    v = np.float64(bits_f32(np.uint32(bits) << np.uint32(16)))
    if abs(v) < _MIN_NORMAL:
        return 0.0 * v
    return v


@numba.njit(inline="always", cache=True)
def _round_to_odd(s, err):
    """float32 round-to-odd of the exact value s + err (s = float64 rounding, err = its exact error),
    flushed to zero below 2^-126, ±inf from 2^128, default NaN for NaN. Returns a float64 holding it."""
    if s != s:
        return np.float64(bits_f32(np.uint32(DEFAULT_NAN_BITS)))
    b = _f64_bits(s)
    if err != 0.0 and (b & 1) == 0:  # round to odd in float64 first (exact value lies strictly beyond s)
        b += 1 if (err > 0.0) == (s > 0.0) else -1
    t = _bits_f64(b & ~np.int64(_LOW29))
    if abs(t) < _MIN_NORMAL:
        return 0.0 * s
    if abs(t) >= _OVERFLOW:
        return t * np.inf
    f = f32_bits(np.float32(t))
    if b & _LOW29:
        f |= np.uint32(1)
    return np.float64(bits_f32(f))


@numba.njit(inline="always", cache=True)
def ro_add(x, y):
    """float32 x + y rounded to odd, FTZ (inputs are float64 holding float32 values)."""
    if abs(x) < _MIN_NORMAL:
        x = 0.0 * x
    if abs(y) < _MIN_NORMAL:
        y = 0.0 * y
    s = x + y
    bp = s - x
    err = (y - bp) + (x - (s - bp))
    if s != s or abs(s) == np.inf:
        err = 0.0
    return _round_to_odd(s, err)


@numba.njit(inline="always", cache=True)
def bfdotadd(acc, a0, b0, a1, b1):
    """BFDotAdd with FPCR.EBF = 0: acc + (a0*b0 + a1*b1), each of the four steps rounded to odd (FTZ)."""
    return ro_add(acc, ro_add(_round_to_odd(a0 * b0, 0.0), _round_to_odd(a1 * b1, 0.0)))


@numba.njit(cache=True, nogil=True, inline="always")
def round_f16_scalar(x):
    """The F16 value of a float32 as a float32 (F32->F16 nearest even, as ggml's operand conversion; overflow to
    inf, NaN kept), every case computed and the result selected — no branch — so that loops of it vectorize."""
    x = np.float32(x)
    u = np.int64(f32_bits(x))
    a = u & 0x7FFFFFFF
    sub = np.float32(np.rint(x * np.float32(16777216.0)) * np.float32(5.9604645e-08))  # F16 subnormals: 2^-24 apart
    big = bits_f32(np.uint32((u & 0x80000000) | 0x7F800000)) if a <= 0x7F800000 else x  # inf; NaN stays
    kept = (a + 0xFFF + ((a >> 13) & 1)) & 0xFFFFE000  # keep 10 of the 23 mantissa bits, ties to even
    normal = bits_f32(np.uint32((u & 0x80000000) | kept))
    return sub if a < 0x38800000 else big if a >= 0x477FF000 else normal  # below 2^-14; >= 65520
