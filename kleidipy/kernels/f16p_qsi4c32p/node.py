"""The family's kernel as the compiled plan runs it (:mod:`kleidipy.core.node`): the F16 LHS pack and the matmul on
this host's tile (the native SME2 tile on aarch64 with SME2 at the kernel's SVL, the AVX-512 tiles on x86, else the
portable jit)."""

from __future__ import annotations

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.f16p_qsi4c32p import avx512, jit, sme2

N_PARAMS = kn.P_FAMILY


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, out = kn.pack_operands(params, N_PARAMS, x, rows, dst)
    kn.copy(jit.lhs_pack_f16pmrx2(src, p[kn.P_MR]), out)


def _pack_avx512(params, x, rows, dst):  # pragma: no cover - compiled (x86 with AVX-512)
    p, src, out = kn.pack_operands(params, N_PARAMS, x, rows, dst)
    kn.copy(avx512.lhs_pack(src, p[kn.P_MR]), out)


def _matmul(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    kn.store_clamped(jit.matmul(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b), dst, ld)


def _matmul_avx512(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled (x86 with AVX-512)
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    kn.store_clamped(avx512.compute(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b), dst, ld)


def _matmul_native(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled (aarch64 with SME2)
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    kn.store_clamped(sme2._compute(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b), dst, ld)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of the family's kernel at depth k."""
    if sme2.AVAILABLE:
        return kn.node_kernel(kern, k, _pack, _matmul_native, {}, ())
    if avx512.runs(kern.nr):  # (k is a multiple of 32, as the kernel's: the packer's 16 values a step fit)
        return kn.node_kernel(kern, k, _pack_avx512, _matmul_avx512, {}, ())
    return kn.node_kernel(kern, k, _pack, _matmul, {}, ())
