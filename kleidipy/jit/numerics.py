"""Scalar float32 primitives for numba code: single-rounded fma (llvm.fma.f32), C rounding modes, fp16 table."""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from kleidipy.numerics import F16_BITS_TO_F32

#: fp16 bits -> float32, indexed by the uint16 pattern (pass it to jitted code as an argument or global).
F16_TABLE = F16_BITS_TO_F32


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
def fma_f32(a, b, c):
    """fma on float32 scalars (casts its arguments)."""
    return fma32(np.float32(a), np.float32(b), np.float32(c))


@numba.njit(inline="always", cache=True)
def round_away(x):
    """C roundf / lround on a float (ties away from zero), computed in float64."""
    y = np.float64(x)
    if y >= 0:
        return np.floor(y + 0.5)
    return -np.floor(-y + 0.5)


@numba.njit(inline="always", cache=True)
def round_even(x):
    """rintf: nearest integer, ties to even."""
    return np.rint(np.float64(x))
