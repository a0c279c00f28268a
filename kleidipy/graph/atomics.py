"""Atomics, spin-wait hints and a clock for numba nopython code: what the graph executor's threads synchronise and
time themselves with. Owns :func:`atomic_add`, :func:`atomic_load`, :func:`atomic_store`, :func:`cpu_pause`,
:func:`sched_yield` and :func:`monotonic_ns` (numba intrinsics, callable from ``@njit`` code only).

Hand-written because numba has no atomics in nopython code (only ``cuda.atomic`` on the GPU target) and no maintained
library provides them, nor a barrier built on them, usable from inside a numba function.

Their semantics: docs/threads-and-barriers.md."""

from __future__ import annotations

import ctypes
import ctypes.util
import time

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

_ORDER = "seq_cst"
_TRIPLE = llvm.get_process_triple()
#: the LLVM intrinsic (and its arguments) of the spin-wait hint; no inline asm, which numba's JIT cannot parse.
if _TRIPLE.startswith(("x86_64", "i386", "i586", "i686")):
    _PAUSE: tuple[str, list] | None = ("llvm.x86.sse2.pause", [])
elif _TRIPLE.startswith(("aarch64", "arm64")):
    _PAUSE = ("llvm.aarch64.isb", [ir.Constant(ir.IntType(32), 15)])  # isb sy
else:  # a plain spin
    _PAUSE = None

#: the LLVM symbols the compiled code calls for sched_yield and clock_gettime (names of ours, bound to libc's
#: functions below).
_YIELD_SYMBOL = "kleidipy_sched_yield"
_CLOCK_SYMBOL = "kleidipy_clock_gettime"


def _libc_function(function: str) -> int | None:
    """Address of a C library function, or None where there is none (Windows)."""
    for name in (None, ctypes.util.find_library("c")):
        try:
            return ctypes.cast(getattr(ctypes.CDLL(name), function), ctypes.c_void_p).value
        except (OSError, AttributeError, TypeError):
            continue
    return None


_YIELD_ADDRESS = _libc_function("sched_yield")
#: the host has a sched_yield the compiled code calls (else sched_yield() is a no-op).
HAS_SCHED_YIELD = _YIELD_ADDRESS is not None
if HAS_SCHED_YIELD:
    llvm.add_symbol(_YIELD_SYMBOL, _YIELD_ADDRESS)
_CLOCK_ADDRESS = _libc_function("clock_gettime") if hasattr(time, "CLOCK_MONOTONIC") else None
#: the host has a clock_gettime the compiled code calls (else monotonic_ns() is 0).
HAS_CLOCK = _CLOCK_ADDRESS is not None
if HAS_CLOCK:
    llvm.add_symbol(_CLOCK_SYMBOL, _CLOCK_ADDRESS)

_INTEGERS = (types.int32, types.int64, types.uint32, types.uint64)


def _check(what: str, arr: types.Type, *ints: types.Type) -> None:
    """Typing of an atomic: a writable (but for atomic_load) 1-D integer array, an integer index and values."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype in _INTEGERS):
        raise TypingError(f"{what}: a 1-D int32/int64 array, got {arr}")
    if not arr.mutable and what != "atomic_load":
        raise TypingError(f"{what}: the array is read-only")
    if not all(isinstance(ty, types.Integer) for ty in ints):
        raise TypingError(f"{what}: integer index and values, got {ints}")


def _operands(context, builder, signature, args):
    """Pointer to ``arr[i]`` (no bounds check), its alignment, and the further arguments cast to arr's dtype."""
    aryty, idxty = signature.args[:2]
    array = context.make_array(aryty)(context, builder, args[0])
    index = context.cast(builder, args[1], idxty, types.intp)
    ptr = cgutils.get_item_pointer(context, builder, aryty, array, [index], wraparound=False)
    values = [context.cast(builder, v, ty, aryty.dtype) for v, ty in zip(args[2:], signature.args[2:], strict=True)]
    return ptr, aryty.dtype.bitwidth // 8, values


@intrinsic
def atomic_add(typingctx, arr, i, v):
    """``old = arr[i]; arr[i] += v`` as one atomic step; returns ``old``."""
    _check("atomic_add", arr, i, v)

    def codegen(context, builder, signature, args):
        ptr, _, (val,) = _operands(context, builder, signature, args)
        return builder.atomic_rmw("add", ptr, val, _ORDER)

    return arr.dtype(arr, i, v), codegen


@intrinsic
def atomic_load(typingctx, arr, i):
    """``arr[i]``, read atomically."""
    _check("atomic_load", arr, i)

    def codegen(context, builder, signature, args):
        ptr, align, _ = _operands(context, builder, signature, args)
        return builder.load_atomic(ptr, _ORDER, align)

    return arr.dtype(arr, i), codegen


@intrinsic
def atomic_store(typingctx, arr, i, v):
    """``arr[i] = v``, written atomically."""
    _check("atomic_store", arr, i, v)

    def codegen(context, builder, signature, args):
        ptr, align, (val,) = _operands(context, builder, signature, args)
        builder.store_atomic(val, ptr, _ORDER, align)
        return context.get_dummy_value()

    return types.void(arr, i, v), codegen


@intrinsic
def cpu_pause(typingctx):
    """The CPU's spin-wait hint (``pause`` / ``isb``; nothing on other targets)."""

    def codegen(context, builder, signature, args):
        if _PAUSE is not None:
            name, operands = _PAUSE
            fnty = ir.FunctionType(ir.VoidType(), [op.type for op in operands])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), operands)
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def sched_yield(typingctx):
    """Give the rest of this thread's time slice to another runnable thread (libc ``sched_yield``)."""

    def codegen(context, builder, signature, args):
        if HAS_SCHED_YIELD:
            fnty = ir.FunctionType(ir.IntType(32), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, _YIELD_SYMBOL), [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def monotonic_ns(typingctx):
    """Nanoseconds of CLOCK_MONOTONIC (libc ``clock_gettime``, ``time.monotonic_ns()``'s clock); 0 without one."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        if not HAS_CLOCK:
            return ir.Constant(i64, 0)
        spec = cgutils.alloca_once(builder, ir.LiteralStructType([i64, i64]))  # struct timespec (LP64)
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32), ir.IntType(8).as_pointer()])
        clock = cgutils.get_or_insert_function(builder.module, fnty, _CLOCK_SYMBOL)
        builder.call(clock, [ir.Constant(ir.IntType(32), time.CLOCK_MONOTONIC), builder.bitcast(spec, fnty.args[1])])
        zero = ir.Constant(ir.IntType(32), 0)
        sec = builder.load(builder.gep(spec, [zero, zero]))
        nsec = builder.load(builder.gep(spec, [zero, ir.Constant(ir.IntType(32), 1)]))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

    return types.int64(), codegen
