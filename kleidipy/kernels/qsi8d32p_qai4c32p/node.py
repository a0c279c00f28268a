"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): the LHS quantize+pack and the
matmul on the tiles this host runs — the native SME2 tiles (SME2 layouts) or sdot tiles (NEON layout) on aarch64,
the AVX-512 VNNI tiles on x86 — or, without any of those, the portable numba loops."""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.node import (
    P_FAMILY,
    P_FIRST_BLOCK_FMUL,
    P_K,
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
from kleidipy.kernels.qsi8d32p_qai4c32p import jit, neon, sme2, vnni

#: K values per row per chunk of the LHS (kr / sr), bytes per column per chunk of the RHS layout, whether the RHS
#: is the NEON layout
P_KBL, P_CHUNK, P_NEON = P_FAMILY, P_FAMILY + 1, P_FAMILY + 2
N_PARAMS = P_FAMILY + 3

#: the tiles: the native SME2 ones on a host with SME2 (the SME2 layouts; the rest as below), the VNNI ones, the
#: native sdot ones on aarch64 with DotProd; None: the portable loops
_TILES = vnni._matmul if vnni.HAVE_VNNI else neon.matmul if neon.AVAILABLE else None
_TILES = sme2.matmul if sme2.AVAILABLE else _TILES


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    mr = p[P_MR]
    packed = jit.lhs_quant_pack(f32_at(x, (rows, p[P_K])), mr, p[P_KBL], 0)
    copy(packed, u8_at(dst, (rows + mr - 1) // mr * p[P_LHS_STRIDE]))


def _matmul_tiles(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    mr, nr, fmul = p[P_MR], p[P_NR], p[P_FIRST_BLOCK_FMUL] != 0
    a = u8_at(lhs, (m + mr - 1) // mr * p[P_LHS_STRIDE])
    b = u8_at(rhs, (n + nr - 1) // nr * p[P_RHS_STRIDE])
    res = _TILES(m, n, p[P_K], mr, nr, p[P_KBL], a, b, p[P_NEON] != 0, fmul)
    store_clamped(res, f32_at(out, (m - 1) * ld + n), ld)


def _matmul_portable(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    mr, nr, fmul = p[P_MR], p[P_NR], p[P_FIRST_BLOCK_FMUL] != 0
    a = u8_at(lhs, (m + mr - 1) // mr * p[P_LHS_STRIDE])
    b = u8_at(rhs, (n + nr - 1) // nr * p[P_RHS_STRIDE])
    res = jit.matmul(m, n, p[P_K], mr, nr, p[P_KBL], p[P_CHUNK], a, b, p[P_NEON] != 0, fmul)
    store_clamped(res, f32_at(out, (m - 1) * ld + n), ld)


def node(kern: MatmulKernel, k: int) -> NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    g, packer = kern._geo(), kern.rhs_packer
    slots = {P_KBL: g.kr // g.sr, P_CHUNK: packer.chunk(g.kr, g.sr), P_NEON: packer.neon}
    tiled = vnni.HAVE_VNNI or neon.AVAILABLE or sme2.AVAILABLE
    return node_kernel(kern, k, _pack, _matmul_tiles if tiled else _matmul_portable, slots, (P_KBL,))
