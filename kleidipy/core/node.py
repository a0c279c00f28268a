"""The compiled plan's interface to a family's matmul (KleidiAI's ukernel interface struct, llama.cpp's function
pointers in ``kernels.cpp``): a :class:`NodeKernel` is a kernel's LHS pack and matmul routines as C function
addresses plus one int64 parameter record; the plan calls them through :func:`call_pack` and :func:`call_matmul`
and never names a family. Each routine is a numba ``cfunc`` compiled (and cached) on its own when a model first
uses it, so a model compiles only its families' code. The record's layout and the routines' contracts:
``docs/compiled-plan.md``.

Hand-written because numba calls a function whose address it learns at run time only through an LLVM indirect
call, which no numba API emits from a value held in an array.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.numerics import FLT_MAX
from kleidipy.core.pointers import f32_at, i64_at, u8_at

# --- the parameter record: a header every family fills, then the family's own slots ---------------------------
#: the kernel's geometry and K
P_MR, P_NR, P_KR, P_SR, P_N_STEP, P_K = 0, 1, 2, 3, 4, 5
#: bytes of one packed LHS group of mr rows, of one packed RHS group of nr columns
P_LHS_STRIDE, P_RHS_STRIDE = 6, 7
#: the MOPA kernels' first block is an FMUL (accumulators from −0)
P_FIRST_BLOCK_FMUL = 8
#: the addresses of the routines (:data:`PACK` and :data:`MATMUL` signatures), and of the run-time packed GEMM
#: (:data:`GEMM_KXN`; 0 when the family has none)
P_PACK, P_MATMUL, P_GEMM_KXN = 9, 10, 11
#: the first of a family's own slots
P_FAMILY = 12

#: ``pack(params, x, rows, dst)``: quantize+pack ``rows`` float32 rows of K values at address x (C-contiguous) into
#: the bytes at dst (whole mr-row groups: ceil(rows / mr) · P_LHS_STRIDE bytes, padding rows as the packer pads)
PACK = types.void(types.int64, types.int64, types.int64, types.int64)
#: ``matmul(params, m, n, lhs, rhs, out, ld)``: the packed LHS of m rows (its first group at lhs) × n packed columns
#: (their first group at rhs) into the float32 rows at out (row i at out + 4·i·ld), clamped to ±FLT_MAX
MATMUL = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64, types.int64)
#: ``gemm_kxn(params, m, n, k, lhs, rhs, out, ld)``: m float32 rows of k values at lhs (C-contiguous) × the K x N
#: float32 matrix at rhs (C-contiguous), both packed at the call by the kernel's packers (zero bias) at depth k (not
#: the record's), into the float32 rows at out (row i at out + 4·i·ld), clamped to ±FLT_MAX: llama.cpp's GEMM of an
#: operand packed at run time (kleidiai.cpp ``compute_forward_fp16``: the F16 KV cache's KQV)
GEMM_KXN = types.void(*([types.int64] * 8))


@dataclass(eq=False)
class NodeKernel:
    """A kernel as the compiled plan runs it, for ``name``: its ``record`` (the header above without the routines'
    addresses, the family's slots after it) and the cfunc bodies ``pack`` and ``matmul``; ``lhs_key`` is equal for
    two kernels that pack the same rows into the same bytes. :attr:`params` is the record with the addresses: the
    routines compile (or load from numba's cache) at its first use, so that describing a model's plan compiles
    nothing."""

    name: str
    record: np.ndarray
    pack: Callable
    matmul: Callable
    lhs_key: tuple
    gemm_kxn: Callable | None = None
    _params: np.ndarray | None = None

    @property
    def routine(self) -> str:
        """The matmul routine's qualified name."""
        return f"{self.matmul.__module__}.{self.matmul.__name__}"

    @property
    def params(self) -> np.ndarray:
        """The parameter record the compiled code reads, with the routines' addresses."""
        if self._params is None:
            p = self.record.copy()
            p[P_PACK], p[P_MATMUL] = cfunc_address(self.pack, PACK), cfunc_address(self.matmul, MATMUL)
            p[P_GEMM_KXN] = 0 if self.gemm_kxn is None else cfunc_address(self.gemm_kxn, GEMM_KXN)
            self._params = p
        return self._params

    def lhs_bytes(self, m: int) -> int:
        """Bytes of the packed LHS of m rows (what the pack routine writes and the matmul routine reads)."""
        return -(-m // int(self.record[P_MR])) * int(self.record[P_LHS_STRIDE])


@cache
def cfunc_address(py_func: Callable, signature: types.Type) -> int:
    """The C address of ``py_func`` compiled as a cfunc of ``signature`` (compiled, or loaded from numba's cache,
    at its first use in this process)."""
    return numba.cfunc(signature, nopython=True, cache=True)(py_func).address


def node_kernel(
    kern: MatmulKernel,
    k: int,
    pack: Callable,
    matmul: Callable,
    family: dict[int, int],
    lhs_slots: tuple[int, ...],
    lhs_rows: int | None = None,
    gemm_kxn: Callable | None = None,
) -> NodeKernel:
    """The :class:`NodeKernel` of ``kern`` at depth k running the cfunc bodies ``pack`` and ``matmul`` (and
    ``gemm_kxn``, when the family packs both operands at run time), with the family's slots ``family`` (slot ->
    value); ``lhs_slots`` are the slots the pack routine reads. ``lhs_rows``: rows per packed LHS group when the LHS
    is not packed in groups of mr (a kernel without LHS packer: 1)."""
    g = kern._geo()
    mr = g.mr if lhs_rows is None else lhs_rows
    p = np.zeros(P_FAMILY + len(family), np.int64)
    p[P_MR], p[P_NR], p[P_KR], p[P_SR], p[P_N_STEP], p[P_K] = mr, g.nr, g.kr, g.sr, g.n_step, k
    p[P_LHS_STRIDE] = kern.lhs_packed_size(mr, k)
    p[P_RHS_STRIDE] = kern.rhs_packed_size(g.nr, k)
    p[P_FIRST_BLOCK_FMUL] = bool(kern.flags.get("first_block_fmul", False))
    for slot, value in family.items():
        p[slot] = value
    key = (pack, *(int(p[s]) for s in (P_MR, P_KR, P_SR, P_K, P_LHS_STRIDE, *lhs_slots)))
    return NodeKernel(kern.name, p, pack, matmul, key, gemm_kxn)


# --- compiled side ----------------------------------------------------------------------------------------------
def indirect_call(context, builder: ir.IRBuilder, signature, values: list):
    """The indirect call of the function at address values[0] with the int64 arguments values[1:]."""
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] * (len(values) - 1))
    builder.call(builder.inttoptr(values[0], fnty.as_pointer()), values[1:])
    return context.get_dummy_value()


@intrinsic
def call_pack(typingctx, fn, params, x, rows, dst):
    """``call_pack(params[P_PACK], params address, x address, rows, dst address)``: the :data:`PACK` routine."""
    return types.void(*([types.int64] * 5)), indirect_call


@intrinsic
def call_matmul(typingctx, fn, params, m, n, lhs, rhs, out, ld):
    """``call_matmul(params[P_MATMUL], params address, m, n, lhs address, rhs address, out address, ld)``: the
    :data:`MATMUL` routine."""
    return types.void(*([types.int64] * 8)), indirect_call


@intrinsic
def call_gemm_kxn(typingctx, fn, params, m, n, k, lhs, rhs, out, ld):
    """``call_gemm_kxn(params[P_GEMM_KXN], params address, m, n, k, lhs address, rhs address, out address, ld)``: the
    :data:`GEMM_KXN` routine."""
    return types.void(*([types.int64] * 9)), indirect_call


_LO, _HI = np.float32(-FLT_MAX), np.float32(FLT_MAX)


@numba.njit(cache=True, nogil=True, inline="always")
def clamped(v):  # pragma: no cover - compiled
    """v clamped to ±FLT_MAX (NaN kept, as numpy's maximum/minimum): the kernels' clamp."""
    return _LO if v < _LO else (_HI if v > _HI else v)


@numba.njit(cache=True, nogil=True)
def copy_clamped(src, dst):  # pragma: no cover - compiled
    """dst[:] = src (1-D, one size, not overlapping) clamped (:func:`clamped`)."""
    for j in range(src.size):
        dst[j] = clamped(src[j])


@numba.njit(cache=True, nogil=True)
def clamp_in_place(a):  # pragma: no cover - compiled
    """a[:] (1-D) clamped (:func:`clamped`) in place. Apart from :func:`copy_clamped` because LLVM vectorises a loop
    whose source may be its destination only when they provably do not overlap: ``copy_clamped(a, a)`` ran scalar,
    ~10x slower (0.5-0.7 ms for a 512 x 1536 result, 8-24 % of a 512-row GEMM at k = 576-1536)."""
    for j in range(a.size):
        a[j] = clamped(a[j])


@numba.njit(cache=True, nogil=True)
def pack_operands(params, n_params, x, rows, dst):  # pragma: no cover - compiled
    """A pack routine's record (its first ``n_params`` slots), rows [rows, K] and destination bytes at their
    addresses."""
    p = i64_at(params, n_params)
    mr = p[P_MR]
    return p, f32_at(x, (rows, p[P_K])), u8_at(dst, (rows + mr - 1) // mr * p[P_LHS_STRIDE])


@numba.njit(cache=True, nogil=True)
def matmul_operands(params, n_params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    """A matmul routine's record (its first ``n_params`` slots), the packed LHS of m rows, the packed RHS of n
    columns and the flat output rows (row i at [i·ld :]) at their addresses."""
    p = i64_at(params, n_params)
    a = u8_at(lhs, (m + p[P_MR] - 1) // p[P_MR] * p[P_LHS_STRIDE])
    b = u8_at(rhs, (n + p[P_NR] - 1) // p[P_NR] * p[P_RHS_STRIDE])
    return p, a, b, f32_at(out, (m - 1) * ld + n)


@numba.njit(cache=True, nogil=True)
def copy(src, dst):  # pragma: no cover - compiled
    """dst[:src.size] = src for 1-D arrays (a plain loop: numba's slice assignment is ~20x slower)."""
    for i in range(src.size):
        dst[i] = src[i]


@numba.njit(cache=True, nogil=True)
def zero_partial_groups(out, rows, row_offset, mr, stride):  # pragma: no cover - compiled
    """Zero the first and last of the row groups (``stride`` bytes each) of a packed LHS whose ``rows`` rows start at
    position ``row_offset`` when either is partial, so that the rows no packed row covers hold the packers' zeros
    (a packer writing into a scratch that is not zeroed)."""
    if row_offset or (row_offset + rows) % mr:
        groups = (row_offset + rows + mr - 1) // mr
        out[:stride] = 0
        out[(groups - 1) * stride : groups * stride] = 0


@numba.njit(cache=True, nogil=True)
def store_clamped(res, out, ld):  # pragma: no cover - compiled
    """res [m, n] clamped into the flat float32 rows ``out`` (row i at out[i·ld :])."""
    m, n = res.shape
    for i in range(m):
        copy_clamped(res[i], out[i * ld : i * ld + n])
