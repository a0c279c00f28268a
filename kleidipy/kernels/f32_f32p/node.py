"""The family's kernel as the compiled plan runs it (:mod:`kleidipy.core.node`): the LHS is the f32 rows themselves
(the pack routine copies them), the matmul one fma per k on the packed f32 RHS (its 6-row tiles take any rows:
every output is computed alone)."""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.node import P_FAMILY, P_K, P_NR, P_RHS_STRIDE, NodeKernel, copy, node_kernel, store_clamped
from kleidipy.core.pointers import f32_at, i64_at, u8_at
from kleidipy.kernels.f32_f32p import jit

N_PARAMS = P_FAMILY


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    k = p[P_K]
    src, floats = f32_at(x, (rows, k)), f32_at(dst, rows * k)
    for r in range(rows):
        copy(src[r], floats[r * k : (r + 1) * k])


def _matmul(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    k, nr = p[P_K], p[P_NR]
    b = u8_at(rhs, (n + nr - 1) // nr * p[P_RHS_STRIDE])
    res = jit.matmul_f32_fma(m, n, k, f32_at(lhs, m * k), b, nr)
    store_clamped(res, f32_at(out, (m - 1) * ld + n), ld)


def node(kern: MatmulKernel, k: int) -> NodeKernel:
    """The compiled plan's routines and parameters of the family's kernel at depth k (the LHS is its rows: groups
    of one row)."""
    return node_kernel(kern, k, _pack, _matmul, {}, (), lhs_rows=1)
