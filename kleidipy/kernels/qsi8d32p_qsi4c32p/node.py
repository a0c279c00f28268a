"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): one LHS pack routine and a
matmul routine per layout (NEON, SME2, SME), each on the tiles this host runs — native aarch64 tiles where the host
has them, else the AVX-512 VNNI tiles (their portable IR without AVX-512 VNNI), else the portable jit."""

from __future__ import annotations

import numba

from kleidipy.core import node as kn
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.vnni import HAS_AVX512_VNNI, HOST_ISA
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit, neon, sme2, ukernels, vnni, vnni_neon, vnni_pack

#: K values per row per interleaved chunk of the LHS packer, its layout id (``jit.LHS_QSI8D32P*``) and whether it
#: rounds ties to even
P_KBL, P_LHS_LAYOUT, P_TIES_EVEN = kn.P_FAMILY, kn.P_FAMILY + 1, kn.P_FAMILY + 2
N_PARAMS = kn.P_FAMILY + 3


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p, src, out = kn.pack_operands(params, N_PARAMS, x, rows, dst)
    kn.copy(vnni_pack._lhs_pack(HOST_ISA, src, p[kn.P_MR], p[P_KBL], 0, p[P_LHS_LAYOUT], p[P_TIES_EVEN]), out)


@numba.njit(cache=True, nogil=True)
def _neon_numba(m, n, k, mr, nr, kr, sr, lhs, rhs):  # pragma: no cover - compiled
    """The NEON layout where the host has no native aarch64 tiles: the VNNI tiles, or the portable jit."""
    if HAS_AVX512_VNNI:
        return vnni_neon._compute_neon(HOST_ISA, m, n, k, mr, nr, kr, kr // sr, lhs, rhs)
    return jit.matmul_qsi8d32p_qsi4c32pscalef16(m, n, k, mr, nr, kr, sr, lhs, rhs)


_NEON_TILES = neon.compute if neon.AVAILABLE else _neon_numba


def _matmul_neon(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    res = _NEON_TILES(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], p[kn.P_KR], p[kn.P_SR], a, b)
    kn.store_clamped(res, dst, ld)


def _matmul_sme2(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    """The VNNI (or portable) tiles, which store and clamp into out themselves."""
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    fmul = p[kn.P_FIRST_BLOCK_FMUL] != 0
    vnni.compute_into(HOST_ISA, m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b, fmul, dst, ld)


def _matmul_sme2_native(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled (aarch64 with SME2)
    """The native SME2 tiles (the kernels bound to this host's SVL; the others on the VNNI/portable tiles)."""
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    fmul = p[kn.P_FIRST_BLOCK_FMUL] != 0
    kn.store_clamped(sme2._compute(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b, fmul), dst, ld)


def _matmul_sme(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p, a, b, dst = kn.matmul_operands(params, N_PARAMS, m, n, lhs, rhs, out, ld)
    fmul = p[kn.P_FIRST_BLOCK_FMUL] != 0
    kn.store_clamped(ukernels.SME_COMPUTE(m, n, p[kn.P_K], p[kn.P_MR], p[kn.P_NR], a, b, fmul), dst, ld)


def node(kern: MatmulKernel, k: int) -> kn.NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    g, packer = kern._geo(), kern.lhs_packer
    sme2_tiles = _matmul_sme2_native if sme2.AVAILABLE else _matmul_sme2
    matmul = _matmul_neon if not kern.is_sme else sme2_tiles if kern.tier == "sme2" else _matmul_sme
    slots = {P_KBL: packer.chunk(g.kr, g.sr), P_LHS_LAYOUT: packer.layout, P_TIES_EVEN: packer.ties_even}
    return kn.node_kernel(kern, k, _pack, matmul, slots, (P_KBL, P_LHS_LAYOUT, P_TIES_EVEN))
