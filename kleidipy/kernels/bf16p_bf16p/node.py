"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): the bf16 LHS pack and the
matmul on this host's tiles (``native.matmul_bf16_native``: native BFMMLA/BFDOT/BFMOPA tiles on aarch64 with them,
else the numba loops), and the GEMM of two float32 operands packed at the call (llama.cpp's F16 KV-cache GEMM)."""

from __future__ import annotations

import numpy as np

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.pointers import f32_at, i64_at
from kleidipy.kernels.bf16p_bf16p import jit, native

#: LHS padding rows copy the group's first row; the GEMV's two accumulators
P_PAD_FIRST_ROW, P_TWO_ACCUMULATORS = kn.P_FAMILY, kn.P_FAMILY + 1
N_PARAMS = kn.P_FAMILY + 2


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, out = kn.pack_operands(params, N_PARAMS, x, rows, dst)
    kn.copy(jit.pack_lhs_bf16(src, p[kn.P_MR], p[kn.P_KR], p[P_PAD_FIRST_ROW] != 0), out)


def _matmul(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    two = p[P_TWO_ACCUMULATORS] != 0
    kn.store_clamped(native.matmul_bf16_native(m, n, p[kn.P_K], a, b, p[kn.P_MR], p[kn.P_NR], p[kn.P_KR], two), dst, ld)


def _gemm_kxn(params, m, n, k, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    mr, nr, kr = p[kn.P_MR], p[kn.P_NR], p[kn.P_KR]
    a = jit.pack_lhs_bf16(f32_at(lhs, (m, k)), mr, kr, p[P_PAD_FIRST_ROW] != 0)
    b = jit.pack_rhs_bf16_kxn(f32_at(rhs, (k, n)), np.zeros(n, np.float32), nr, kr)
    res = native.matmul_bf16_native(m, n, k, a, b, mr, nr, kr, p[P_TWO_ACCUMULATORS] != 0)
    kn.store_clamped(res, f32_at(out, (m - 1) * ld + n), ld)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    slots = {
        P_PAD_FIRST_ROW: kern.lhs_packer.pad_first_row,
        P_TWO_ACCUMULATORS: bool(kern.flags.get("two_accumulators", False)),
    }
    return kn.node_kernel(kern, k, _pack, _matmul, slots, (P_PAD_FIRST_ROW,), gemm_kxn=_gemm_kxn)
