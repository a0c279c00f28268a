"""Arrays at raw addresses inside compiled code: ``f32_at``, ``f64_at``, ``i64_at``, ``u8_at``, ``bool_at`` rebuild
the C-contiguous array of a shape at an address (no copy, no reference count), ``like_at`` of the dtype of a scalar.
The compiled plan reaches its arrays and the families' node routines their operands so. The caller keeps the memory
alive.

Hand-written because numba turns an integer into a typed pointer only through an intrinsic.
"""

from __future__ import annotations

import numba
from numba import types
from numba.extending import intrinsic


def _pointer_to(dtype: types.Type):
    @intrinsic
    def to_pointer(typingctx, addr):
        sig = types.CPointer(dtype)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return to_pointer


@intrinsic
def _pointer_like(typingctx, like, addr):
    """The address as a pointer to the type of the scalar ``like``."""
    sig = types.CPointer(like)(like, types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[1], context.get_value_type(signature.return_type))

    return sig, codegen


_f32_pointer = _pointer_to(types.float32)
_f64_pointer = _pointer_to(types.float64)
_u8_pointer = _pointer_to(types.uint8)
_bool_pointer = _pointer_to(types.boolean)
_i64_pointer = _pointer_to(types.int64)


@numba.njit(cache=True, nogil=True, inline="always")
def f32_at(addr, shape):  # pragma: no cover - compiled
    """The C-contiguous float32 array of ``shape`` (an int or a tuple) at address ``addr``, as the array."""
    return numba.carray(_f32_pointer(addr), shape)


@numba.njit(cache=True, nogil=True, inline="always")
def i64_at(addr, shape):  # pragma: no cover - compiled
    """The C-contiguous int64 array of ``shape`` (an int or a tuple) at address ``addr``, as the array."""
    return numba.carray(_i64_pointer(addr), shape)


@numba.njit(cache=True, nogil=True, inline="always")
def f64_at(addr, shape):  # pragma: no cover - compiled
    """The C-contiguous float64 array of ``shape`` at address ``addr``, as the array."""
    return numba.carray(_f64_pointer(addr), shape)


@numba.njit(cache=True, nogil=True, inline="always")
def u8_at(addr, shape):  # pragma: no cover - compiled
    """The C-contiguous uint8 array of ``shape`` at address ``addr``, as the array."""
    return numba.carray(_u8_pointer(addr), shape)


@numba.njit(cache=True, nogil=True, inline="always")
def bool_at(addr, shape):  # pragma: no cover - compiled
    """The C-contiguous bool array of ``shape`` at address ``addr``, as the array."""
    return numba.carray(_bool_pointer(addr), shape)


@numba.njit(cache=True, nogil=True, inline="always")
def like_at(like, addr, shape):  # pragma: no cover - compiled
    """The C-contiguous array of ``shape`` at address ``addr`` of the type of the scalar ``like`` (a scalar argument:
    unboxed at a call for nothing, where a 0-size array costs microseconds cold)."""
    return numba.carray(_pointer_like(like, addr), shape)
