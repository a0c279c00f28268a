"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): the LHS quantize+pack and the
matmul on the family's tile chain (``ukernels.matmul_tiled``, its jit's) for the layouts it runs on this host, else
the portable numba loop. Kernels of another RHS packer (the qsi4cxp family's) have none."""

from __future__ import annotations

import numpy as np

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.pointers import f32_at
from kleidipy.kernels.qai8dxp_qsi8cxp import jit, ukernels

#: K values per row per LHS chunk (kr / sr), the float epilogue (``Recipe``), K rounded up to a multiple of 32
P_KBL, P_RECIPE, P_K_INT = kn.P_FAMILY, kn.P_FAMILY + 1, kn.P_FAMILY + 2
N_PARAMS = kn.P_FAMILY + 3


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, out = kn.pack_operands(params, N_PARAMS, x, rows, dst)
    mr, stride = p[kn.P_MR], p[kn.P_LHS_STRIDE]
    if rows % mr:  # the padding rows of the last group are 0
        for i in range(rows // mr * stride, out.size):
            out[i] = 0
    jit.lhs_quant_pack_qai8dxp(src, mr, p[P_KBL], 0, p[P_K_INT], out)


def _matmul_tiles(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    res = np.empty((m, n), np.float32)
    fma_bias = p[P_RECIPE] == jit.RECIPE_FMA_BIAS
    mr, nr, kbl, kr = p[kn.P_MR], p[kn.P_NR], p[P_KBL], p[kn.P_KR]
    ukernels.matmul_tiled(m, n, p[P_K_INT], mr, nr, kbl, kr, a.view(np.int8), b, fma_bias, res)
    kn.store_clamped(res, dst, ld)


def _matmul_portable(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    """The portable loop writes the output rows itself: clamped in place."""
    p, a, b, _ = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    mr, nr, kr, k_int = p[kn.P_MR], p[kn.P_NR], p[kn.P_KR], p[P_K_INT]
    dst = f32_at(out, (m, ld))[:, :n]
    k_lo = jit.int8_k_lo(k_int, nr, kr)
    a_i8, a_i32, a_f32 = a.view(np.int8), a.view(np.int32), a.view(np.float32)
    jit.matmul_qai8dxp(m, n, k_int, a_i8, a_i32, a_f32, b, mr, p[P_KBL], nr, kr, 0, k_lo, k_lo[:0], p[P_RECIPE], dst)
    for i in range(m):
        kn.clamp_in_place(dst[i])


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel | None:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k (None: a kernel of
    another RHS packer)."""
    if kern.rhs_packer is not ukernels.RHS_PACKER:
        return None
    g = kern._geo()
    lay = kern.rhs_packer.layout(k, g.nr, g.kr, g.sr)
    k_int = ukernels.k_internal(k)
    args = (g.mr, k_int, g.kr // g.sr, g.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi)
    tiled = ukernels.is_tiled_layout(*args)
    slots = {P_KBL: g.kr // g.sr, P_RECIPE: int(kern.recipe), P_K_INT: k_int}
    return kn.node_kernel(kern, k, _pack, _matmul_tiles if tiled else _matmul_portable, slots, (P_KBL, P_K_INT))
