"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): the LHS is the f32 rows themselves
(the pack routine copies them), the matmul one fma per k on the packed f32 RHS from the bias (the NEON kernel's 6-row
tiles take any rows: every output is computed alone; the SME2 GEMV one row)."""

from __future__ import annotations

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.pointers import f32_at
from kleidipy.kernels.f32_f32p import sme2
from kleidipy.kernels.pack import f32p_jit


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, _ = kn.pack_operands(params, kn.P_FAMILY, x, rows, dst)
    k = p[kn.P_K]
    floats = f32_at(dst, rows * k)
    for r in range(rows):
        kn.copy(src[r], floats[r * k : (r + 1) * k])


def _matmul(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, _, b, dst = kn.matmul_operands(params, kn.P_FAMILY, m, n, lhs, rhs, out, ld)
    k = p[kn.P_K]
    kn.store_clamped(f32p_jit.matmul_f32_fma(m, n, k, f32_at(lhs, m * k), b, p[kn.P_NR], False), dst, ld)


def _matmul_native(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled (aarch64 with SME2)
    p, _, b, dst = kn.matmul_operands(params, kn.P_FAMILY, m, n, lhs, rhs, out, ld)
    k = p[kn.P_K]
    kn.store_clamped(sme2._compute(m, n, k, p[kn.P_NR], f32_at(lhs, m * k), b), dst, ld)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of the family's kernel at depth k (the LHS is its rows: groups
    of one row; the SME2 GEMV on its native tile where this host runs it)."""
    native = kern.tier == "sme2" and sme2.AVAILABLE
    return kn.node_kernel(kern, k, _pack, _matmul_native if native else _matmul, {}, (), lhs_rows=1)
