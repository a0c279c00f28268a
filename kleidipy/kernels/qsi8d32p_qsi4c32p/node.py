"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): one LHS pack routine and a
matmul routine per RHS layout (NEON, SME2, SME), each on the family's tile chain for that layout
(``ukernels.NEON_COMPUTE``, ``SME2_COMPUTE``, ``SME_COMPUTE``), the one its jit runs."""

from __future__ import annotations

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.vnni import HOST_ISA
from kleidipy.kernels.qsi8d32p_qsi4c32p import ukernels, vnni_pack

#: K values per row per interleaved chunk of the LHS packer, its layout id (``jit.LHS_QSI8D32P*``) and whether it
#: rounds ties to even
P_KBL, P_LHS_LAYOUT, P_TIES_EVEN = kn.P_FAMILY, kn.P_FAMILY + 1, kn.P_FAMILY + 2
N_PARAMS = kn.P_FAMILY + 3


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, out = kn.pack_operands(params, N_PARAMS, x, rows, dst)
    vnni_pack.lhs_pack_into(HOST_ISA, src, p[kn.P_MR], p[P_KBL], 0, p[P_LHS_LAYOUT], p[P_TIES_EVEN], out)


def _matmul_neon(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    res = ukernels.NEON_COMPUTE(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], p[kn.P_KR], p[kn.P_SR], a, b)
    kn.store_clamped(res, dst, ld)


def _matmul_sme2(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    """The SME2 chain stores and clamps into out itself."""
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    fmul = p[kn.P_FIRST_BLOCK_FMUL] != 0
    ukernels.SME2_COMPUTE(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b, fmul, dst, ld)


def _matmul_sme(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    fmul = p[kn.P_FIRST_BLOCK_FMUL] != 0
    kn.store_clamped(ukernels.SME_COMPUTE(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b, fmul), dst, ld)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    g, packer = kern._geo(), kern.lhs_packer
    matmul = _matmul_neon if not kern.is_sme else _matmul_sme2 if kern.tier == "sme2" else _matmul_sme
    slots = {P_KBL: packer.chunk(g.kr, g.sr), P_LHS_LAYOUT: packer.layout, P_TIES_EVEN: packer.ties_even}
    return kn.node_kernel(kern, k, _pack, matmul, slots, (P_KBL, P_LHS_LAYOUT, P_TIES_EVEN))
