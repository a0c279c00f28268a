"""The F32 MOPA family ``f32p × f32p`` (KleidiAI's ``matmul_clamp_f32_f32p_f32p``): float32 activations packed in
groups of mr = 2·VL rows, float32 weights packed with their biases in groups of nr = 2·VL columns.

This module owns the LHS packer ``lhs_pack_f32p2vlx1_f32_sme`` and the kernel
``matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa``; the RHS packer is the shared
``rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme`` (:mod:`kleidipy.kernels.pack.f32p`).

Arithmetic (KleidiAI's source: ``zero {za}``, one FMOPA of a vector of 1.0 by the packed biases, then one FMOPA per k
in ascending k, FCLAMP at the store; confirmed bit for bit against every golden run): per output, acc = +0 + bias,
then acc = fma(lhs[m, k], rhs[k, n], acc) for k = 0..K-1 — the GEMV's arithmetic (``f32_f32p``) but for a −0 bias,
which starts here at +0.
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import fma_f32
from kleidipy.core.packers import LhsPacker
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.f32p_f32p import jit, sme2
from kleidipy.kernels.pack.f32p import RHS_F32P2VLX1BIASF32_SME, unpack_bias_rows

FAMILY_NAME = "f32p_f32p"


class LhsPackF32p2vlx1F32Sme(LhsPacker):
    """``kai_run_lhs_pack_f32p2vlx1_f32_sme``: float32 rows in groups of mr rows, transposed: per k, the group's mr
    values of column k (the last group's rows past m are 0). Takes kr = sr = 1 and, as KleidiAI asserts,
    ``m_idx_start`` = 0."""

    name = "lhs_pack_f32p2vlx1_f32_sme"
    blocked = False

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if mr < 8 or mr % 8 or (kr, sr) != (1, 1):
            raise KernelShapeError(f"{self.name}: takes mr = 2·VL, kr=1, sr=1; got mr={mr}, kr={kr}, sr={sr}")

    def get_lhs_packed_stride(self, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return 4 * mr * k

    def _rows(self, lhs: np.ndarray, row_offset: int) -> np.ndarray:
        if row_offset:
            raise KernelShapeError(f"{self.name}: packs from m_idx_start = 0 only (KleidiAI asserts it)")
        return np.ascontiguousarray(lhs, np.float32)

    def _reference(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        rows = self._rows(lhs, row_offset)
        m, k = rows.shape
        groups = -(-m // mr)
        padded = np.zeros((groups * mr, k), np.float32)
        padded[:m] = rows
        return np.ascontiguousarray(padded.reshape(groups, mr, k).transpose(0, 2, 1)).reshape(-1).view(np.uint8)

    def _jit(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        return jit.lhs_pack_f32p(self._rows(lhs, row_offset), mr)

    def unpack(self, packed: np.ndarray, m: int, k: int, mr: int) -> np.ndarray:
        """The float32 rows [m, k] of a packed buffer."""
        groups = -(-m // mr)
        values = np.ascontiguousarray(packed[: groups * mr * k * 4]).view(np.float32)
        return values.reshape(groups, k, mr).transpose(0, 2, 1).reshape(groups * mr, k)[:m]


LHS_F32P2VLX1_F32_SME = LhsPackF32p2vlx1F32Sme()
PACKERS = [LHS_F32P2VLX1_F32_SME, RHS_F32P2VLX1BIASF32_SME]


class F32pF32pKernel(MatmulKernel):
    """The SME2 MOPA kernel: per output, +0 + bias, then one fma per k in ascending k."""

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        a = self.lhs_packer.unpack(lhs, m, k, self.mr)
        bias, b = unpack_bias_rows(rhs, n, k, self.nr)
        acc = np.broadcast_to(bias + np.float32(0), (m, n))
        for kk in range(k):
            acc = fma_f32(a[:, kk, None], b[None, kk], acc)
        return np.asarray(acc, dtype=np.float32)

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        return sme2.compute(m, n, k, self.mr, self.nr, lhs, rhs)


def _sme_gemm(vl: int) -> Geometry:
    return Geometry(m_step=2 * vl, n_step=2 * vl, mr=2 * vl, nr=2 * vl, kr=1, sr=1)


KERNELS = [
    F32pF32pKernel(
        "matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa",
        FAMILY_NAME,
        "sme2",
        "gemm",
        LHS_F32P2VLX1_F32_SME,
        RHS_F32P2VLX1BIASF32_SME,
        _sme_gemm,
        bl=None,
    )
]
