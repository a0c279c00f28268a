"""The family's kernels as the compiled plan runs them (:mod:`kleidipy.core.node`): one LHS pack routine and a
matmul routine per layout (NEON, SME2, SME), each on the tiles this host runs — native aarch64 tiles where the host
has them, else the AVX-512 VNNI tiles (their portable IR without AVX-512 VNNI), else the portable jit."""

from __future__ import annotations

import numba

from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.node import (
    P_FAMILY,
    P_FIRST_BLOCK_FMUL,
    P_K,
    P_KR,
    P_LHS_STRIDE,
    P_MR,
    P_NR,
    P_RHS_STRIDE,
    P_SR,
    NodeKernel,
    copy,
    node_kernel,
    store_clamped,
)
from kleidipy.core.pointers import f32_at, i64_at, u8_at
from kleidipy.core.vnni import HAS_AVX512_VNNI, HOST_ISA
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit, neon, sme2, ukernels, vnni, vnni_neon, vnni_pack

#: K values per row per interleaved chunk of the LHS packer, its layout id (``jit.LHS_QSI8D32P*``) and whether it
#: rounds ties to even
P_KBL, P_LHS_LAYOUT, P_TIES_EVEN = P_FAMILY, P_FAMILY + 1, P_FAMILY + 2
N_PARAMS = P_FAMILY + 3


@numba.njit(cache=True, nogil=True)
def _operands(p, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    """The packed LHS of m rows, the packed RHS of n columns and the flat output rows at their addresses."""
    a = u8_at(lhs, (m + p[P_MR] - 1) // p[P_MR] * p[P_LHS_STRIDE])
    b = u8_at(rhs, (n + p[P_NR] - 1) // p[P_NR] * p[P_RHS_STRIDE])
    return a, b, f32_at(out, (m - 1) * ld + n)


def _pack(params, x, rows, dst):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    mr = p[P_MR]
    src = f32_at(x, (rows, p[P_K]))
    packed = vnni_pack._lhs_pack(HOST_ISA, src, mr, p[P_KBL], 0, p[P_LHS_LAYOUT], p[P_TIES_EVEN])
    copy(packed, u8_at(dst, (rows + mr - 1) // mr * p[P_LHS_STRIDE]))


@numba.njit(cache=True, nogil=True)
def _neon_numba(m, n, k, mr, nr, kr, sr, lhs, rhs):  # pragma: no cover - compiled
    """The NEON layout where the host has no native aarch64 tiles: the VNNI tiles, or the portable jit."""
    if HAS_AVX512_VNNI:
        return vnni_neon._compute_neon(HOST_ISA, m, n, k, mr, nr, kr, kr // sr, lhs, rhs)
    return jit.matmul_qsi8d32p_qsi4c32pscalef16(m, n, k, mr, nr, kr, sr, lhs, rhs)


_NEON_TILES = neon.compute if neon.AVAILABLE else _neon_numba


def _matmul_neon(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    a, b, dst = _operands(p, m, n, lhs, rhs, out, ld)
    store_clamped(_NEON_TILES(m, n, p[P_K], p[P_MR], p[P_NR], p[P_KR], p[P_SR], a, b), dst, ld)


def _matmul_sme2(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    """The VNNI (or portable) tiles, which store and clamp into out themselves."""
    p = i64_at(params, N_PARAMS)
    a, b, dst = _operands(p, m, n, lhs, rhs, out, ld)
    vnni.compute_into(HOST_ISA, m, n, p[P_K], p[P_MR], p[P_NR], a, b, p[P_FIRST_BLOCK_FMUL] != 0, dst, ld)


def _matmul_sme2_native(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled (aarch64 with SME2)
    """The native SME2 tiles (the kernels bound to this host's SVL; the others on the VNNI/portable tiles)."""
    p = i64_at(params, N_PARAMS)
    a, b, dst = _operands(p, m, n, lhs, rhs, out, ld)
    fmul = p[P_FIRST_BLOCK_FMUL] != 0
    store_clamped(sme2._compute(m, n, p[P_K], p[P_MR], p[P_NR], a, b, fmul), dst, ld)


def _matmul_sme(params, m, n, lhs, rhs, out, ld):  # pragma: no cover - compiled
    p = i64_at(params, N_PARAMS)
    a, b, dst = _operands(p, m, n, lhs, rhs, out, ld)
    fmul = p[P_FIRST_BLOCK_FMUL] != 0
    store_clamped(ukernels.SME_COMPUTE(m, n, p[P_K], p[P_MR], p[P_NR], a, b, fmul), dst, ld)


def node(kern: MatmulKernel, k: int) -> NodeKernel:
    """The compiled plan's routines and parameters of one of the family's kernels at depth k."""
    g, packer = kern._geo(), kern.lhs_packer
    sme2_tiles = _matmul_sme2_native if sme2.AVAILABLE else _matmul_sme2
    matmul = _matmul_neon if not kern.is_sme else sme2_tiles if kern.tier == "sme2" else _matmul_sme
    slots = {P_KBL: packer.chunk(g.kr, g.sr), P_LHS_LAYOUT: packer.layout, P_TIES_EVEN: packer.ties_even}
    return node_kernel(kern, k, _pack, matmul, slots, (P_KBL, P_LHS_LAYOUT, P_TIES_EVEN))
