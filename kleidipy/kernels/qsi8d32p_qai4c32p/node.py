"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): the LHS quantize+pack and the
matmul on the tiles this host runs — the native SME2 tiles (SME2 layouts) or sdot tiles (NEON layout) on aarch64,
the AVX-512 VNNI tiles on x86 — or, without any of those, the portable numba loops."""

from __future__ import annotations

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.qsi8d32p_qai4c32p import jit, neon, sme2, vnni

#: K values per row per chunk of the LHS (kr / sr), bytes per column per chunk of the RHS layout, whether the RHS
#: is the NEON layout
P_KBL, P_CHUNK, P_NEON = kn.P_FAMILY, kn.P_FAMILY + 1, kn.P_FAMILY + 2
N_PARAMS = kn.P_FAMILY + 3

#: the tiles: the native SME2 ones on a host with SME2 (the SME2 layouts; the rest as below), the VNNI ones, the
#: native sdot ones on aarch64 with DotProd; None: the portable loops
_TILES = vnni._matmul if vnni.HAVE_VNNI else neon.matmul if neon.AVAILABLE else None
_TILES = sme2.matmul if sme2.AVAILABLE else _TILES


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, out = kn.pack_operands(params, N_PARAMS, x, rows, dst)
    kn.copy(jit.lhs_quant_pack(src, p[kn.P_MR], p[P_KBL], 0), out)


def _matmul_tiles(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    fmul, neon_layout = p[kn.P_FIRST_BLOCK_FMUL] != 0, p[P_NEON] != 0
    res = _TILES(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], p[P_KBL], a, b, neon_layout, fmul)
    kn.store_clamped(res, dst, ld)


def _matmul_portable(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    fmul, neon_layout = p[kn.P_FIRST_BLOCK_FMUL] != 0, p[P_NEON] != 0
    res = jit.matmul(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], p[P_KBL], p[P_CHUNK], a, b, neon_layout, fmul)
    kn.store_clamped(res, dst, ld)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    g, packer = kern._geo(), kern.rhs_packer
    slots = {P_KBL: g.kr // g.sr, P_CHUNK: packer.chunk(g.kr, g.sr), P_NEON: packer.neon}
    tiled = vnni.HAVE_VNNI or neon.AVAILABLE or sme2.AVAILABLE
    return kn.node_kernel(kern, k, _pack, _matmul_tiles if tiled else _matmul_portable, slots, (P_KBL,))
