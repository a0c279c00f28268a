"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): the LHS quantize+pack and a
matmul routine per RHS layout, each on the family's tile chain (``ukernels.SME2_COMPUTE``, ``ukernels.NEON_COMPUTE``),
the one its jit runs."""

from __future__ import annotations

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.vnni import HOST_ISA
from kleidipy.kernels.qsi8d32p_qai4c32p import ukernels, vnni_pack

#: K values per row per chunk of the LHS (kr / sr)
P_KBL = kn.P_FAMILY
N_PARAMS = kn.P_FAMILY + 1


def pack_lhs(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, out = kn.pack_operands(params, N_PARAMS, x, rows, dst)
    vnni_pack.lhs_pack_into(HOST_ISA, src, p[kn.P_MR], p[P_KBL], 0, out)


def _matmul_sme2(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    fmul = p[kn.P_FIRST_BLOCK_FMUL] != 0
    kn.store_clamped(ukernels.SME2_COMPUTE(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b, fmul), dst, ld)


def _matmul_neon(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    kn.store_clamped(ukernels.NEON_COMPUTE(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], p[P_KBL], a, b), dst, ld)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    g = kern._geo()
    matmul = _matmul_neon if kern.rhs_packer.neon else _matmul_sme2
    return kn.node_kernel(kern, k, pack_lhs, matmul, {P_KBL: g.kr // g.sr}, (P_KBL,))
