"""The F16-LHS Q4_0 family ``f16p × qsi4c32p`` (KleidiAI's ``matmul_clamp_f32_f16p_qsi4c32p``): activations
converted to F16 (no quantization), GGML Q4_0 weights packed by the SME2 Q4_0 packer, the SME2 MOPA GEMM that
llama.cpp runs at prefill for Q4_0 on SME2.

This module owns the LHS packer ``lhs_pack_f16pmrx2_f32_neon`` and the kernel
``matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa``; the RHS packer is the shared
``rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon`` (:mod:`kleidipy.kernels.pack.qsi4c32p`). The reference
execution states the arithmetic on unpacked arrays (see :mod:`.jit` for it in one paragraph).
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import f16_bits_to_f32, f32_to_f16_bits
from kleidipy.core.packers import LhsPacker
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.f16p_qsi4c32p import avx512, jit, sme2
from kleidipy.kernels.pack.qsi4c32p import BL, RHS_QSI4C32PS1S0SCALEF16_NEON, frozen

FAMILY_NAME = "f16p_qsi4c32p"


class LhsPackF16pmrx2F32Neon(LhsPacker):
    """``kai_run_lhs_pack_f16pmrx2_f32_neon``: float32 rows to F16 (FCVT, nearest even), in groups of mr rows; per
    pair p of K values, the mr rows × 2 halves (row r's elements 2p, 2p + 1 at halves 2(p·mr + r), +1). A group
    is mr·k halves; the last group's rows past m are 0 (KleidiAI leaves them as the buffer was). Takes sr = 2 and
    k a multiple of bl = 32 (its loops step 16 K values); it ignores ``m_idx_start``, as KleidiAI's does."""

    name = "lhs_pack_f16pmrx2_f32_neon"
    blocked = True

    def get_lhs_packed_stride(self, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return mr * k * 2

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if mr < 1 or sr != 2 or kr < 1 or k % kr:
            raise KernelShapeError(f"{self.name}: needs mr >= 1, sr = 2 and kr dividing k (mr={mr}, kr={kr}, sr={sr})")

    def _reference(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        m, k = lhs.shape
        groups = -(-m // mr)
        halves = np.zeros((groups * mr, k), np.uint16)
        with np.errstate(over="ignore"):  # FCVT: a value past the F16 range is ±inf
            halves[:m] = f32_to_f16_bits(np.asarray(lhs, np.float32))
        placed = halves.reshape(groups, mr, k // 2, 2).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(placed).astype("<u2").view(np.uint8).reshape(-1)

    def _jit(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        rows = frozen(np.asarray(lhs, np.float32))
        if avx512.AVAILABLE and rows.shape[1] % 16 == 0:
            return avx512.lhs_pack(rows, mr)
        return jit.lhs_pack_f16pmrx2(rows, mr)

    def unpack(self, packed: np.ndarray, m: int, k: int, mr: int) -> np.ndarray:
        """The F16 values [m, k] of a packed buffer, as float32 (how the kernel reads it)."""
        groups = -(-m // mr)
        halves = np.ascontiguousarray(packed[: groups * mr * k * 2]).view("<u2")
        rows = halves.reshape(groups, k // 2, mr, 2).transpose(0, 2, 1, 3).reshape(groups * mr, k)
        return f16_bits_to_f32(rows[:m])


def widening_mopa(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The FMOPA (widening, FP16 to FP32) sum of float32 [m, k] F16 values by [n, k] ones: per pair of K values, in
    order, acc = f32(acc + f32(a[2p]·w[2p] + a[2p+1]·w[2p+1])) from +0 (the products exact, their sum rounded once:
    see :mod:`.jit`)."""
    m, k = a.shape
    acc = np.zeros((m, w.shape[0]), np.float32)
    for p in range(0, k, 2):
        pair = np.multiply.outer(a[:, p], w[:, p]).astype(np.float64) + np.multiply.outer(a[:, p + 1], w[:, p + 1])
        acc = (acc + pair.astype(np.float32)).astype(np.float32)
    return acc


LHS_F16PMRX2_F32_NEON = LhsPackF16pmrx2F32Neon()
PACKERS = [LHS_F16PMRX2_F32_NEON, RHS_QSI4C32PS1S0SCALEF16_NEON]


class F16pQsi4c32pKernel(MatmulKernel):
    """The SME2 MOPA kernel: ``luti4`` of the 4-bit codes to F16 u − 8, F16 ``fmul`` by the block's scale, widening
    ``fmopa`` of the F16 LHS into ZA (:func:`widening_mopa`)."""

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g = self._geo()
        a = self.lhs_packer.unpack(lhs, m, k, g.mr)
        codes, scale = self.rhs_packer.unpack(rhs, n, k, g.nr, g.kr)
        d = np.repeat(scale.astype(np.float16), BL, axis=1)
        w = (codes.astype(np.float16) * d).astype(np.float32)  # one F16 rounding of the exact product
        return widening_mopa(a, w)

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g = self._geo()
        return sme2.compute(m, n, k, g.mr, g.nr, frozen(lhs), frozen(rhs))


def _sme_gemm(vl: int) -> Geometry:
    return Geometry(m_step=vl, n_step=4 * vl, mr=vl, nr=4 * vl, kr=4, sr=2)


KERNELS = [
    F16pQsi4c32pKernel(
        "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa",
        FAMILY_NAME,
        "sme2",
        "gemm",
        LHS_F16PMRX2_F32_NEON,
        RHS_QSI4C32PS1S0SCALEF16_NEON,
        _sme_gemm,
    )
]
