"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): the Q4_1 family's LHS
quantize+pack and one matmul routine on the family's tile chain (``ukernels.COMPUTE``), the one its jit runs."""

from __future__ import annotations

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.qsi8d32p_qai4c32p import node as q4_1_node
from kleidipy.kernels.qsi8d32p_qai8c16p import ukernels

#: K values per row per chunk of the LHS (kr / sr): the Q4_1 family's slot, which its pack routine reads
P_KBL = q4_1_node.P_KBL
N_PARAMS = q4_1_node.N_PARAMS


def _matmul(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    kn.store_clamped(ukernels.COMPUTE(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], p[P_KBL], a, b), dst, ld)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    g = kern._geo()
    return kn.node_kernel(kern, k, q4_1_node.pack_lhs, _matmul, {P_KBL: g.kr // g.sr}, (P_KBL,))
