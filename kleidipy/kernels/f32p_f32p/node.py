"""The family's kernel as the compiled plan runs it (:mod:`kleidipy.core.node`): the f32 LHS pack and the matmul on
this host's tile (the native SME2 tile on aarch64 with SME2 at the kernel's SVL, else the portable jit: the packed
rows read back, then the layout's fma chain from +0 + bias)."""

from __future__ import annotations

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.f32p_f32p import jit, sme2
from kleidipy.kernels.pack import f32p_jit


def _matmul(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, kn.P_FAMILY, m, n, lhs, rhs, out, ld)
    k, mr = p[kn.P_K], p[kn.P_MR]
    kn.store_clamped(f32p_jit.matmul_f32_fma(m, n, k, jit.lhs_unpack_f32p(a, m, k, mr), b, p[kn.P_NR], True), dst, ld)


def _matmul_native(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled (aarch64 with SME2)
    p, a, b, dst = kn.matmul_operands(params, kn.P_FAMILY, m, n, lhs, rhs, out, ld)
    kn.store_clamped(sme2._compute(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b), dst, ld)


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, out = kn.pack_operands(params, kn.P_FAMILY, x, rows, dst)
    kn.copy(jit.lhs_pack_f32p(src, p[kn.P_MR]), out)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of the family's kernel at depth k."""
    return kn.node_kernel(kern, k, _pack, _matmul_native if sme2.AVAILABLE else _matmul, {}, ())
