"""The MUL_MAT node of the compiled plan: a prepared matmul's routines (:func:`node_kernel`), its LHS packing
(:func:`pack_lhs`) and the thread split (:func:`matmul`, :func:`split`; two kernels' columns in llama.cpp's SME/NEON
hybrid, :func:`mul_mat_hybrid`), callable from numba code; the plan never names a kernel family.

The entry points' contracts: docs/compiled-plan-execution.md."""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.matmul import PreparedMatmul
from kleidipy.core.node import (
    P_LHS_STRIDE,
    P_MATMUL,
    P_MR,
    P_N_STEP,
    P_NR,
    P_PACK,
    P_RHS_STRIDE,
    NodeKernel,
    call_matmul,
    call_pack,
)
from kleidipy.errors import KleidipyError
from kleidipy.graph.atomics import monotonic_ns
from kleidipy.graph.workers import barrier, share
from kleidipy.kernels.catalogue import family_of


class NotCompilableError(KleidipyError, ValueError):
    """A prepared matmul the compiled plan cannot run: another execution than ``jit``, or a kernel without a
    compiled routine."""


def node_kernel(prepared: PreparedMatmul) -> NodeKernel:
    """The :class:`~kleidipy.core.node.NodeKernel` of a prepared matmul (NotCompilableError for other executions
    than ``jit`` or a kernel whose family has no routine for it)."""
    kern = prepared.kernel
    if prepared.execution != "jit":
        raise NotCompilableError(
            f"{kern.name}: the compiled plan runs the jit execution only, this matmul is prepared for "
            f"{prepared.execution!r}"
        )
    family = family_of(kern)
    node = family.node(kern, prepared.k) if family.node is not None else None
    if node is None:
        raise NotCompilableError(f"{kern.name}: no compiled routine for this kernel in the graph executor")
    return node


def same_lhs(a: NodeKernel, b: NodeKernel) -> bool:
    """Whether two routines pack the same rows into the same bytes (one pack can serve both)."""
    return a.lhs_key == b.lhs_key


# --- compiled code -----------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _finite(x, r0, r1):  # pragma: no cover - compiled
    """Whether rows r0 .. r1-1 of float32 x hold no NaN/Inf: an all-ones exponent plus one carries into bit 31; the
    OR of those sums vectorises (5x faster than a max of the exponents, ~1 µs for 64 × 576 values)."""
    for r in range(r0, r1):
        bits = x[r].view(np.uint32)
        acc = np.uint32(0)
        for i in range(bits.size):
            acc |= (bits[i] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
        if acc & np.uint32(0x80000000):
            return False
    return True


@numba.njit(cache=True, nogil=True)
def pack_lhs(params, x, m, out, ith, nth):  # pragma: no cover - compiled
    """Thread ith's share of the LHS quantize+pack of x[:m] into out (docs/compiled-plan-execution.md). False on
    NaN/Inf."""
    mr = params[P_MR]
    g0, g1 = share((m + mr - 1) // mr, ith, nth)
    r0, r1 = g0 * mr, min(m, g1 * mr)
    if r0 >= r1:
        return True
    if not _finite(x, r0, r1):
        return False
    dst = out.ctypes.data + g0 * params[P_LHS_STRIDE]
    call_pack(params[P_PACK], params.ctypes.data, x[r0:r1].ctypes.data, r1 - r0, dst)
    return True


@numba.njit(cache=True, nogil=True)
def _packed(ith, nth, sync, finite, status, prof, node):  # pragma: no cover - compiled
    """After thread ith's share of a MUL_MAT's LHS packing (``finite``: its rows held no NaN/Inf): the stamp, the
    barrier; whether every share was finite (status[0] set otherwise)."""
    if not finite:
        status[0] = 1
    if prof.shape[0] > 0:
        prof[ith, node, 1] = monotonic_ns()
    barrier(sync, nth)
    return status[0] == 0


@numba.njit(cache=True, nogil=True)
def mul_mat(ith, nth, sync, params, x, m, lhs, rhs, out, n, status, prof, node):  # pragma: no cover - compiled
    """A MUL_MAT node as each of the nth threads runs it (the compiled plan's, and ``benchmarks/kernels.py``'s):
    its share of the LHS quantize+pack of x[:m], a barrier, its share of the columns into out. A thread whose share
    holds NaN/Inf sets status[0]; then every thread returns False, nothing multiplied. With a non-empty ``prof``
    the thread stamps prof[ith, node, 1] (monotonic ns) when its pack share is done."""
    if not _packed(ith, nth, sync, pack_lhs(params, x, m, lhs, ith, nth), status, prof, node):
        return False
    matmul(params, m, n, lhs, rhs, out, ith, nth)
    return True


@numba.njit(cache=True, nogil=True)
def second_lhs(params, m):  # pragma: no cover - compiled
    """Where a hybrid MUL_MAT's second packed LHS starts in the scratch: past the first's m rows, 64-byte aligned."""
    return ((m + params[P_MR] - 1) // params[P_MR] * params[P_LHS_STRIDE] + 63) // 64 * 64


@numba.njit(cache=True, nogil=True)
def mul_mat_hybrid(
    ith, nth, sync, params, params2, x, m, lhs, rhs, rhs2, out, n, cols, status, prof, node
):  # pragma: no cover - compiled
    """A MUL_MAT node split between two kernels, llama.cpp's SME/NEON hybrid (:func:`mul_mat` otherwise): each
    packs x[:m] with its own packer (the second's from :func:`second_lhs` on), a barrier, then the columns [0, cols)
    by the first kernel and [cols, n) by the second, each shared out over the nth threads."""
    lhs2 = lhs[second_lhs(params, m) :]
    finite = pack_lhs(params, x, m, lhs, ith, nth)
    finite = pack_lhs(params2, x, m, lhs2, ith, nth) and finite
    if not _packed(ith, nth, sync, finite, status, prof, node):
        return False
    columns(params, m, 0, cols, lhs, rhs, out, ith, nth)
    columns(params2, m, cols, n, lhs2, rhs2, out, ith, nth)
    return True


@numba.njit(cache=True, nogil=True)
def split(m, n, mr, n_step, ith, nth):  # pragma: no cover - compiled
    """Thread ith's block [r0, r1) x [n0, n1) of an m x n MUL_MAT (docs/compiled-plan-execution.md): llama.cpp's
    share of the columns, unless whole mr-row groups split more evenly (the longest share is shorter) — a prefill
    whose n has an odd count of n_step chunks (576 = 9 x 64 on two threads: 5 chunks for one, 4 for the other)."""
    per = ((n + nth - 1) // nth + n_step - 1) // n_step * n_step
    groups = (m + mr - 1) // mr
    if (groups + nth - 1) // nth * ((n + n_step - 1) // n_step) < groups * (per // n_step):
        g0, g1 = share(groups, ith, nth)
        return g0 * mr, min(m, g1 * mr), 0, n
    return 0, m, ith * per, min(n, (ith + 1) * per)


@numba.njit(cache=True, nogil=True)
def matmul(params, m, n, lhs, rhs, out, ith, nth):  # pragma: no cover - compiled
    """Thread ith's block of the MUL_MAT (:func:`split`) into out[:m] (docs/compiled-plan-execution.md)."""
    columns(params, m, 0, n, lhs, rhs, out, ith, nth)


@numba.njit(cache=True, nogil=True)
def columns(params, m, first, end, lhs, rhs, out, ith, nth):  # pragma: no cover - compiled
    """Thread ith's block (:func:`split`) of the columns [first, end) of the MUL_MAT (``first`` a multiple of the
    kernel's n_step) into out[:m]."""
    mr, nr = params[P_MR], params[P_NR]
    r0, r1, n0, n1 = split(m, end - first, mr, params[P_N_STEP], ith, nth)
    if n0 >= n1 or r0 >= r1:
        return
    a = lhs.ctypes.data + r0 // mr * params[P_LHS_STRIDE]
    b = rhs.ctypes.data + (first + n0) // nr * params[P_RHS_STRIDE]
    ld = out.shape[1]
    c = out.ctypes.data + (r0 * ld + first + n0) * 4
    call_matmul(params[P_MATMUL], params.ctypes.data, r1 - r0, n1 - n0, a, b, c, ld)
