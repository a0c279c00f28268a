"""The ``qai8dxp × qsi4cxp`` family: per-channel int4 weights (unsigned codes, zero point 8, f32 scale per row).

Owns the two RHS packers (NEON ``rhs_pack_nxk_qsi4cxp_qs4cxs1s0`` and SME2
``rhs_pack_nxk_qsi4cxps1s0_qsu4cxs1s0_neon``) and the five kernels, whose jit runs on the family's own tiles
(``sme2``, ``neon``, ``vnni``). The LHS packer, the per-channel RHS
base and the kernel arithmetic are shared with the Q8_0 family (:mod:`kleidipy.kernels.qai8dxp_qsi8cxp.ukernels`).
"""

from __future__ import annotations

import numpy as np

from kleidipy.kernels.qai8dxp_qsi4cxp import neon, sme2, vnni
from kleidipy.kernels.qai8dxp_qsi8cxp import jit
from kleidipy.kernels.qai8dxp_qsi8cxp.ukernels import (
    LHS_PACKER,
    PerChannelRhsPacker,
    Qai8dxpMatmulKernel,
    Recipe,
    RhsDataLayout,
    k_internal,
    make_kernel,
    neon_geometry,
    sme_geometry,
)

FAMILY_NAME = "qai8dxp_qsi4cxp"
#: KleidiAI's ``params.rhs_zero_point``: the input codes u are unsigned, the weight is u − 8.
RHS_ZERO_POINT = 8


class Qsi4cxpRhsPacker(PerChannelRhsPacker):
    """Input: ``rhs`` = uint8 [n, ceil(k/2)] codes, element k in nibble k%2 of byte k//2 (s1s0), weight u − 8;
    ``scale`` f32 [n]. The data is nr·k_int/2 bytes of two signed nibbles (u − 8) & 15, 0 for k ≥ K."""

    rhs_dtype = np.uint8

    def data_bytes(self, k: int, nr: int) -> int:
        return nr * k_internal(k) // 2

    def weights(self, rhs: np.ndarray, n: int, k: int) -> np.ndarray:
        codes = self.rhs_rows(rhs, n, k).astype(np.int32)
        nibbles = np.stack([codes & 15, codes >> 4], axis=2).reshape(n, -1)[:, :k]
        return nibbles - RHS_ZERO_POINT


class RhsPackNxkQsi4cxpQs4cxs1s0(Qsi4cxpRhsPacker):
    """``kai_run_rhs_pack_nxk_qsi4cxp_qs4cxs1s0`` (NEON kernels).

    Data byte db of a group: blen = kr/sr, column (db//blen)%nr, t = (db//(nr·blen))·blen + db%blen; the low
    nibble holds k0 = 32·(t//16) + t%16, the high one k0 + 16 (the kernels read them as 16·w with ``<<4`` and
    ``&0xF0``, hence row sums 16·Σw and scales f32(scale·0.0625)). Padding columns copy column n−1.
    """

    name = "rhs_pack_nxk_qsi4cxp_qs4cxs1s0"
    sum_multiplier = 16
    scale_multiplier = 0.0625

    @classmethod
    def build_layout(cls, k_int: int, nr: int, kr: int, sr: int) -> RhsDataLayout:
        blen = kr // sr
        e = np.arange(nr * k_int // 2)
        t = (e // (nr * blen)) * blen + e % blen
        k_lo = 32 * (t // 16) + t % 16
        return RhsDataLayout(blen, 16, (e // blen) % nr, k_lo, k_lo + 16)


class RhsPackNxkQsi4cxps1s0Qsu4cxs1s0Neon(Qsi4cxpRhsPacker):
    """``kai_run_rhs_pack_nxk_qsi4cxps1s0_qsu4cxs1s0_neon`` (SME2 kernels).

    For kr-chunk c and column col, kr/2 bytes at c·nr·kr/2 + col·kr/2; byte j holds k = c·kr + 2j (low nibble)
    and k + 1 (high nibble). Row sums Σw, scales as given; padding columns are all 0 (data, sum, scale, bias).
    """

    name = "rhs_pack_nxk_qsi4cxps1s0_qsu4cxs1s0_neon"
    zero_padding = True

    @classmethod
    def build_layout(cls, k_int: int, nr: int, kr: int, sr: int) -> RhsDataLayout:
        blen = kr // 2
        e = np.arange(nr * k_int // 2)
        k_lo = (e // (nr * blen)) * kr + 2 * (e % blen)
        return RhsDataLayout(blen, 1, (e // blen) % nr, k_lo, k_lo + 1)


#: the family's tile chain (its jit's; the compiled plan runs none of its kernels), ``jit.matmul_qai8dxp``'s arguments
#: and bits: the SME2 tiles (its SME2 layouts at the host's SVL), the NEON tiles (a host with DotProd), the AVX-512
#: VNNI tiles (an x86 host with them), each where the host has them, and the portable loop for everything else
MATMUL_COMPUTE = jit.with_tiles(
    [tier.tiles for tier, have in ((sme2, sme2.AVAILABLE), (neon, neon.AVAILABLE), (vnni, vnni.HAVE_VNNI)) if have],
    jit.matmul_qai8dxp,
)


class Qsi4cxpMatmulKernel(Qai8dxpMatmulKernel):
    """A kernel of this family: its jit runs on the family's tile chain (:data:`MATMUL_COMPUTE`)."""

    compute = staticmethod(MATMUL_COMPUTE)


RHS_PACKER_NEON = RhsPackNxkQsi4cxpQs4cxs1s0()
RHS_PACKER_SME2 = RhsPackNxkQsi4cxps1s0Qsu4cxs1s0Neon()

KERNELS = [
    make_kernel(
        f"matmul_clamp_f32_qai8dxp{lhs}_qsi4cxp{rhs}_{tile}",
        FAMILY_NAME,
        tier,
        packer,
        geo,
        recipe,
        Qsi4cxpMatmulKernel,
    )
    for lhs, rhs, tile, tier, packer, geo, recipe in (
        ("1vlx8", "4vlx8", "1vlx4vl_sme2_mopa", "sme2", RHS_PACKER_SME2, sme_geometry(True), Recipe.FMUL_FADD),
        ("1x4", "4vlx4", "1x4vl_sme2_sdot", "sme2", RHS_PACKER_SME2, sme_geometry(False), Recipe.FMA_BIAS),
        ("1x8", "4x8", "1x4x32_neon_dotprod", "dotprod", RHS_PACKER_NEON, neon_geometry(1, 1, 16, 2), Recipe.FMUL_FADD),
        ("4x8", "4x8", "4x4x32_neon_i8mm", "i8mm", RHS_PACKER_NEON, neon_geometry(4, 4, 16, 2), Recipe.FMUL_FADD),
        ("4x8", "4x8", "8x4x32_neon_i8mm", "i8mm", RHS_PACKER_NEON, neon_geometry(8, 4, 16, 2), Recipe.FMUL_FADD),
    )
]

PACKERS = [LHS_PACKER, RHS_PACKER_NEON, RHS_PACKER_SME2]
