"""The Q4_0 family ``qsi8d32p × qsi4c32p``: GGML Q4_0 weights packed verbatim, activations quantized to int8 per
32-block, as llama.cpp's KleidiAI backend runs Q4_0 models.

This module owns the family's packers (three RHS layouts, three LHS quantize+pack routines), its nine matmul
kernels (SME2 / SME1 / I8MM / DotProd, GEMM and GEMV) and GET_ROWS (dequantizing selected output channels
straight from a packed RHS, as llama.cpp does for token embeddings). Layouts: spec §4.1–4.4 and the golden
README; arithmetic: spec §5.2 (see ``jit.py`` beside this module for the recipe in one paragraph).

The reference execution states each layout as reshapes/transposes of the logical arrays (pack) and their
inverse (unpack, which is how the reference kernels read packed bytes); the jit execution is the numba code.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import f16_bits_to_f32, f32_to_f16_bits, fma_f32, round_away, round_even
from kleidipy.core.packers import LhsPacker
from kleidipy.core.vnni import HAS_AVX512_VNNI
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.pack.qsi4c32p import (
    BL,
    RHS_QSI4C32PS1S0SCALEF16_NEON,
    RHS_QSI4C32PS4S0SF16_NEON,
    RHS_QSI4C32PSCALEF16,
    fp16_from_le_bytes,
    fp16_le_bytes,
    frozen,
)
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit, neon, sme, sme2, vnni, vnni_neon, vnni_s4s0
from kleidipy.kernels.qsi8d32p_qsi4c32p.vnni_pack import lhs_quant_pack_qsi8d32p as vnni_lhs_pack

FAMILY_NAME = "qsi8d32p_qsi4c32p"


# --------------------------------------------------------------------------------------------- helpers


def quantize_qsi8d32(lhs: np.ndarray, ties_even: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-32-block symmetric int8 quantization of float32 rows [m, k] (spec §4.3).

    Returns q int8 [m, k] and the fp16 bits of the block scales [m, k/32]: amax = max|x|, sf = f32(amax/127),
    inv = f32(1/sf) (0 when sf is 0), q = round(f32(x·inv)) — roundf, or ties-to-even (``vcvtnq``) — and the
    stored scale is fp16(sf) (RNE), while quantization used the float32 inv.
    """
    m, k = lhs.shape
    x = lhs.reshape(m, k // BL, BL)
    amax = np.abs(x).max(axis=2)
    sf = (amax / np.float32(127)).astype(np.float32)
    inv = np.zeros_like(sf)
    np.divide(np.float32(1), sf, out=inv, where=sf != 0)
    scaled = (x * inv[:, :, None]).astype(np.float32)
    q = (round_even(scaled) if ties_even else round_away(scaled)).astype(np.int8)
    return q.reshape(m, k), f32_to_f16_bits(sf)


# --------------------------------------------------------------------------------------------- LHS


class _Qsi8d32pLhsPacker(LhsPacker):
    """Common part of the qsi8d32p LHS packers: size, argument rules, quantization, jit call."""

    blocked = True
    #: jit layout id (LHS_QSI8D32P or LHS_QSI8D32P_NEON)
    layout: int = jit.LHS_QSI8D32P
    ties_even: bool = False

    def get_lhs_packed_stride(self, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return mr * (k // BL) * (BL + 2)

    def chunk(self, kr: int, sr: int) -> int:
        """K values per row per interleaved chunk (kbl)."""
        return kr // sr

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if mr < 1 or kr < 1 or sr < 1 or kr % sr:
            raise KernelShapeError(f"{self.name}: mr={mr}, kr={kr}, sr={sr} must be positive with sr dividing kr")
        if BL % self.chunk(kr, sr):
            raise KernelShapeError(f"{self.name}: a chunk of {self.chunk(kr, sr)} K values does not divide bl=32")

    def _reference(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        q, scale_bits = quantize_qsi8d32(np.asarray(lhs, dtype=np.float32), self.ties_even)
        m, k = q.shape
        groups = -(-(row_offset + m) // mr)
        q_all = np.zeros((groups * mr, k), np.int8)
        s_all = np.zeros((groups * mr, k // BL), np.uint16)
        q_all[row_offset : row_offset + m] = q
        s_all[row_offset : row_offset + m] = scale_bits
        return self._place(q_all, s_all, mr, self.chunk(kr, sr))

    def _jit(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        rows = frozen(np.asarray(lhs, dtype=np.float32))
        kbl = self.chunk(kr, sr)  # the vectorised packer (the same bytes as jit.lhs_quant_pack_qsi8d32p)
        return vnni_lhs_pack(rows, mr, kbl, row_offset, self.layout, self.ties_even)

    def _place(self, q: np.ndarray, scale_bits: np.ndarray, mr: int, kbl: int) -> np.ndarray:
        """Packed bytes of whole groups: q int8 [groups·mr, k], scale bits [groups·mr, k/32]."""
        raise NotImplementedError

    def unpack(self, packed: np.ndarray, m: int, k: int, mr: int, kr: int, sr: int) -> tuple[np.ndarray, np.ndarray]:
        """int8 values [m, k] and float32 block scales [m, k/32] of a packed LHS (how the kernels read it)."""
        raise NotImplementedError


class LhsQuantPackQsi8d32pF32(_Qsi8d32pLhsPacker):
    """``kai_run_lhs_quant_pack_qsi8d32p_f32`` (§4.3): per block, mr fp16 scales then mr × 32 int8 in kr/sr chunks.

    Rounds ties away from zero (roundf). Used by every NEON kernel of the family.
    """

    name = "lhs_quant_pack_qsi8d32p_f32"

    def _place(self, q: np.ndarray, scale_bits: np.ndarray, mr: int, kbl: int) -> np.ndarray:
        rows, k = q.shape
        groups, nb = rows // mr, k // BL
        data = q.view(np.uint8).reshape(groups, mr, nb, BL // kbl, kbl).transpose(0, 2, 3, 1, 4)
        scales = fp16_le_bytes(scale_bits.reshape(groups, mr, nb).transpose(0, 2, 1))
        return np.concatenate([scales, data.reshape(groups, nb, mr * BL)], axis=2).reshape(-1)

    def unpack(self, packed: np.ndarray, m: int, k: int, mr: int, kr: int, sr: int) -> tuple[np.ndarray, np.ndarray]:
        nb, kbl = k // BL, self.chunk(kr, sr)
        groups = -(-m // mr)
        blocks = packed[: groups * self.get_lhs_packed_stride(k, mr, kr, sr)].reshape(groups, nb, mr * (BL + 2))
        scales = fp16_from_le_bytes(blocks[:, :, : 2 * mr]).transpose(0, 2, 1).reshape(groups * mr, nb)
        data = blocks[:, :, 2 * mr :].reshape(groups, nb, BL // kbl, mr, kbl).transpose(0, 3, 1, 2, 4)
        q = data.reshape(groups * mr, k).view(np.int8)
        return q[:m], f16_bits_to_f32(scales[:m])


class LhsQuantPackQsi8d32p4x8sbF32Neon(LhsQuantPackQsi8d32pF32):
    """``kai_run_lhs_quant_pack_qsi8d32p4x8sb_f32_neon``: the §4.3 layout for mr=4, kr=16, sr=2 only, rounding
    ties to even (``vcvtnq_s32_f32``). llama.cpp pairs it with the I8MM GEMM; its bytes are layout-compatible with
    ``lhs_quant_pack_qsi8d32p_f32`` (they differ only on exact .5 ties), so the I8MM kernels accept both.

    KleidiAI's 4-row fast path reads rows 1–3 at +k floats (dense rows) and misplaces rows when m_idx_start is
    not a multiple of 4; here rows honour ``lhs_stride`` and ``m_idx_start`` as in the generic packer.
    """

    name = "lhs_quant_pack_qsi8d32p4x8sb_f32_neon"
    ties_even = True

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if (mr, kr, sr) != (4, 16, 2):
            raise KernelShapeError(f"{self.name}: takes only mr=4, kr=16, sr=2 (got {mr}, {kr}, {sr})")


class LhsQuantPackQsi8d32pF32Neon(_Qsi8d32pLhsPacker):
    """``kai_run_lhs_quant_pack_qsi8d32p_f32_neon`` (§4.4, SME kernels): all int8 in chunks of kr = 4 values per
    row, then the fp16 scales block-major. Rounds ties away from zero.

    KleidiAI ignores ``m_idx_start`` and ``lhs_stride`` (it reads dense rows into an mr-aligned group); here the
    rows given are the rows packed, at row position ``m_idx_start % mr``, like every other LHS packer.
    """

    name = "lhs_quant_pack_qsi8d32p_f32_neon"
    layout = jit.LHS_QSI8D32P_NEON

    def chunk(self, kr: int, sr: int) -> int:
        return kr

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if kr != 4:
            raise KernelShapeError(f"{self.name}: takes only kr=4 (got {kr})")

    def _place(self, q: np.ndarray, scale_bits: np.ndarray, mr: int, kbl: int) -> np.ndarray:
        rows, k = q.shape
        groups, nb = rows // mr, k // BL
        data = q.view(np.uint8).reshape(groups, mr, k // kbl, kbl).transpose(0, 2, 1, 3).reshape(groups, mr * k)
        scales = fp16_le_bytes(scale_bits.reshape(groups, mr, nb).transpose(0, 2, 1)).reshape(groups, 2 * mr * nb)
        return np.concatenate([data, scales], axis=1).reshape(-1)

    def unpack(self, packed: np.ndarray, m: int, k: int, mr: int, kr: int, sr: int) -> tuple[np.ndarray, np.ndarray]:
        nb, kbl = k // BL, self.chunk(kr, sr)
        groups = -(-m // mr)
        group_bytes = packed[: groups * self.get_lhs_packed_stride(k, mr, kr, sr)].reshape(groups, mr * (k + 2 * nb))
        data = group_bytes[:, : mr * k].reshape(groups, k // kbl, mr, kbl).transpose(0, 2, 1, 3)
        q = data.reshape(groups * mr, k).view(np.int8)
        scales = fp16_from_le_bytes(group_bytes[:, mr * k :]).reshape(groups, nb, mr).transpose(0, 2, 1)
        return q[:m], f16_bits_to_f32(scales.reshape(groups * mr, nb)[:m])


LHS_QSI8D32P_F32 = LhsQuantPackQsi8d32pF32()
LHS_QSI8D32P4X8SB_F32_NEON = LhsQuantPackQsi8d32p4x8sbF32Neon()
LHS_QSI8D32P_F32_NEON = LhsQuantPackQsi8d32pF32Neon()

PACKERS = [
    LHS_QSI8D32P_F32,
    LHS_QSI8D32P4X8SB_F32_NEON,
    LHS_QSI8D32P_F32_NEON,
    RHS_QSI4C32PSCALEF16,
    RHS_QSI4C32PS1S0SCALEF16_NEON,
    RHS_QSI4C32PS4S0SF16_NEON,
]


# --------------------------------------------------------------------------------------------- kernels


def block_scaled_sum(
    q: np.ndarray, lhs_scale: np.ndarray, w: np.ndarray, rhs_scale: np.ndarray, dot_multiplier: int, fmul: bool
) -> np.ndarray:
    """The §5.2 recipe on unpacked operands: q int8 [m, k], w int8 [n, k], scales float32 [m|n, k/32].

    Per block b: a = f32(dot_multiplier · Σ q·w) (exact int32), S = f32(s_L·s_R) + 0, acc = fma(a, S, acc), from
    acc = +0, or −0 for the MOPA kernels (first block FMUL).
    """
    m, k = q.shape
    n, nb = w.shape[0], k // BL
    dots = np.einsum(
        "ibt,jbt->ijb", q.reshape(m, nb, BL).astype(np.int32), w.reshape(n, nb, BL).astype(np.int32), dtype=np.int32
    )
    acc = np.full((m, n), -0.0 if fmul else 0.0, dtype=np.float32)
    for b in range(nb):
        scale = (lhs_scale[:, b, None] * rhs_scale[None, :, b]).astype(np.float32) + np.float32(0)
        acc = fma_f32((dots[:, :, b] * dot_multiplier).astype(np.float32), scale, acc)
    return acc


#: the family's tile chain, one per RHS layout, for its jit and its compiled-plan routines (the same bits every
#: way). SME2 ``(m, n, k, mr, nr, lhs, rhs, first_block_fmul, dst, ld)``, the result clamped to ±FLT_MAX into the
#: flat rows dst (row i at dst[i·ld :]): the native SME2 tiles (kernels bound to the host's SVL), else the VNNI
#: tiles (their portable IR without AVX-512 VNNI)
SME2_COMPUTE = sme2.compute_into if sme2.AVAILABLE else vnni.compute_into_host
#: SME1 (s4s0 codes) ``(m, n, k, mr, nr, lhs, rhs, first_block_fmul) -> f32 [m, n]``: the native SME tiles (bound to
#: the host's SVL), the AVX-512 VNNI tiles, else the portable jit
SME_COMPUTE = (
    sme.compute_s4s0
    if sme.AVAILABLE
    else vnni_s4s0.compute_s4s0
    if HAS_AVX512_VNNI
    else jit.matmul_qsi8d32p_qsi4c32ps4s0sf16
)
#: NEON (dotprod / i8mm) ``(m, n, k, mr, nr, kr, sr, lhs, rhs) -> f32 [m, n]``: the native sdot/smmla tiles on
#: aarch64 with DotProd, the AVX-512 VNNI tiles, else the portable jit
NEON_COMPUTE = (
    neon.compute
    if neon.AVAILABLE
    else vnni_neon.compute_neon_vnni512
    if HAS_AVX512_VNNI
    else jit.matmul_qsi8d32p_qsi4c32pscalef16
)


class Qsi8d32pQsi4c32pKernel(MatmulKernel):
    """A matmul kernel of the family. ``flags["first_block_fmul"]`` marks the MOPA kernels (−0.0 quirk);
    ``alt_lhs_packers`` lists LHS packers whose buffers share the kernel's layout (accepted by ``run``)."""

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g = self._geo()
        q, lhs_scale = self.lhs_packer.unpack(lhs, m, k, g.mr, g.kr, g.sr)
        w, rhs_scale = self.rhs_packer.unpack(rhs, n, k, g.nr, g.kr)
        fmul = self.flags.get("first_block_fmul", False)
        return block_scaled_sum(q, lhs_scale, w, rhs_scale, self.rhs_packer.dot_multiplier, fmul)

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g = self._geo()
        lhs, rhs = frozen(lhs), frozen(rhs)
        fmul = self.flags.get("first_block_fmul", False)
        if self.tier == "sme2":
            out = np.empty((m, n), np.float32)
            SME2_COMPUTE(m, n, k, g.mr, g.nr, lhs, rhs, fmul, out.reshape(-1), n)
            return out
        if self.is_sme:
            return SME_COMPUTE(m, n, k, g.mr, g.nr, lhs, rhs, fmul)
        return NEON_COMPUTE(m, n, k, g.mr, g.nr, g.kr, g.sr, lhs, rhs)


def _sme_gemm(vl: int) -> Geometry:
    return Geometry(m_step=vl, n_step=4 * vl, mr=vl, nr=4 * vl, kr=4, sr=2)


def _sme_gemv(vl: int) -> Geometry:
    return Geometry(m_step=1, n_step=4 * vl, mr=1, nr=4 * vl, kr=4, sr=2)


def _neon(m_step: int, mr: int, kr: int) -> Callable[[int], Geometry]:
    def geometry(vl: int) -> Geometry:
        return Geometry(m_step=m_step, n_step=4, mr=mr, nr=4, kr=kr, sr=2)

    return geometry


def _kernel(
    name: str,
    tier: str,
    kind: str,
    geometry: Callable[[int], Geometry],
    first_block_fmul: bool = False,
    lhs_packers: tuple[LhsPacker, ...] = (LHS_QSI8D32P_F32,),
) -> Qsi8d32pQsi4c32pKernel:
    """A kernel with the packers of its tier: SME2 / SME1 RHS layouts with the SME LHS, or the NEON pair (the NEON
    kernels pack with lhs_packers[0] and accept the other packers' buffers too)."""
    if tier in ("sme", "sme2"):
        lhs_packers = (LHS_QSI8D32P_F32_NEON,)
        rhs = RHS_QSI4C32PS1S0SCALEF16_NEON if tier == "sme2" else RHS_QSI4C32PS4S0SF16_NEON
    else:
        rhs = RHS_QSI4C32PSCALEF16
    flags = {"first_block_fmul": True} if first_block_fmul else {}
    return Qsi8d32pQsi4c32pKernel(
        name, FAMILY_NAME, tier, kind, lhs_packers[0], rhs, geometry, flags=flags, alt_lhs_packers=lhs_packers[1:]
    )


#: the I8MM GEMMs' LHS packers, both of one layout: the 16x4 one packs as llama.cpp pairs them (4x8sb, ties to even:
#: bit for bit with llama.cpp), the 8x4x32 one with the generic packer (ties away); each accepts the other's buffers
_SB, _GENERIC = (LHS_QSI8D32P4X8SB_F32_NEON, LHS_QSI8D32P_F32), (LHS_QSI8D32P_F32, LHS_QSI8D32P4X8SB_F32_NEON)

KERNELS = [
    _kernel("matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa", "sme2", "gemm", _sme_gemm, True),
    _kernel("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot", "sme2", "gemv", _sme_gemv),
    _kernel("matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme_mopa", "sme", "gemm", _sme_gemm, True),
    _kernel("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme_dot", "sme", "gemv", _sme_gemv),
    _kernel("matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", "i8mm", "gemm", _neon(16, 4, 16), False, _SB),
    _kernel(
        "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_8x4x32_neon_i8mm", "i8mm", "gemm", _neon(8, 4, 16), False, _GENERIC
    ),
    _kernel("matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod", "dotprod", "gemm", _neon(16, 4, 8)),
    _kernel("matmul_clamp_f32_qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod", "dotprod", "gemv", _neon(1, 1, 16)),
    _kernel("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod", "dotprod", "gemv", _neon(1, 1, 8)),
]
