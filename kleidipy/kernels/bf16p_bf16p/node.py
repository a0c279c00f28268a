"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): the bf16 LHS pack and the
matmul on this host's tiles (``native.matmul_bf16_native``: native BFMMLA/BFDOT/BFMOPA tiles on aarch64 with them,
else the numba loops)."""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.node import (
    P_FAMILY,
    P_K,
    P_KR,
    P_LHS_STRIDE,
    P_MR,
    P_NR,
    P_RHS_STRIDE,
    NodeKernel,
    copy,
    node_kernel,
    store_clamped,
)
from kleidipy.core.pointers import f32_at, i64_at, u8_at
from kleidipy.kernels.bf16p_bf16p import jit, native

#: LHS padding rows copy the group's first row; the GEMV's two accumulators
P_PAD_FIRST_ROW, P_TWO_ACCUMULATORS = P_FAMILY, P_FAMILY + 1
N_PARAMS = P_FAMILY + 2


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    mr = p[P_MR]
    packed = jit.pack_lhs_bf16(f32_at(x, (rows, p[P_K])), mr, p[P_KR], p[P_PAD_FIRST_ROW] != 0)
    copy(packed, u8_at(dst, (rows + mr - 1) // mr * p[P_LHS_STRIDE]))


def _matmul(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    mr, nr = p[P_MR], p[P_NR]
    a = u8_at(lhs, (m + mr - 1) // mr * p[P_LHS_STRIDE])
    b = u8_at(rhs, (n + nr - 1) // nr * p[P_RHS_STRIDE])
    res = native.matmul_bf16_native(m, n, p[P_K], a, b, mr, nr, p[P_KR], p[P_TWO_ACCUMULATORS] != 0)
    store_clamped(res, f32_at(out, (m - 1) * ld + n), ld)


def node(kern: MatmulKernel, k: int) -> NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    slots = {
        P_PAD_FIRST_ROW: kern.lhs_packer.pad_first_row,
        P_TWO_ACCUMULATORS: bool(kern.flags.get("two_accumulators", False)),
    }
    return node_kernel(kern, k, _pack, _matmul, slots, (P_PAD_FIRST_ROW,))
