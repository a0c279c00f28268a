"""The plain-f32-LHS family ``f32_f32p`` (KleidiAI's ``matmul_clamp_f32_f32_f32p``): the LHS rows are read as they
are (no LHS packer), the RHS packed f32 with its biases.

Two kernels: ``matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla``, the NEON FMLA fallback of the F16 route (its RHS packer
``rhs_pack_kxn_x32p16x1b_x32_x32_neon`` takes the F16 route's K x N values, :func:`kleidipy.kernels.pack.kxn
.f16_nxk_to_f32_kxn`: exact F16 -> F32, zero bias), and ``matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla``, the SME2
GEMV llama.cpp runs F32 weights through at decode (m = 1; on the RHS its MOPA GEMM's packer wrote,
:data:`kleidipy.kernels.pack.f32p.RHS_F32P2VLX1BIASF32_SME`).

Both read the bias-then-rows layout (:mod:`kleidipy.kernels.pack.f32p`: per group of nr columns, nr f32 biases, then
for each k the nr f32 of row k; nr = 16, or 2·VL for the SME2 one).

Arithmetic (confirmed bit for bit against every golden run of both): the accumulator starts at the bias and takes one
fused multiply-add per k, in ascending k (FMLA by element, round to nearest even)::

    acc = bias[n];  for k in 0..K-1: acc = fma(lhs[m, k], rhs[k, n], acc)

A plain multiply-then-add chain instead mismatches 4987 of the 6311 NEON golden outputs (and every SME2 GEMV run).
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.buffers import check_finite
from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import fma_f32
from kleidipy.kernels.f32_f32p import sme2
from kleidipy.kernels.pack import f32p_jit
from kleidipy.kernels.pack.f32p import RHS_F32P2VLX1BIASF32_SME, BiasRowsRhsPacker, unpack_bias_rows

FAMILY_NAME = "f32_f32p"
NR = 16


class X32KxnRhsPacker(BiasRowsRhsPacker):
    """``rhs_pack_kxn_x32p16x1b_x32_x32_neon``: K x N f32 + f32 bias (None = zeros, as KleidiAI's NULL bias)."""

    name = "rhs_pack_kxn_x32p16x1b_x32_x32_neon"
    rhs_order = "kxn"
    fixed_nr = NR


RHS_X32 = X32KxnRhsPacker()
PACKERS = [RHS_X32, RHS_F32P2VLX1BIASF32_SME]


class F32MatmulKernel(MatmulKernel):
    """A kernel of plain f32 LHS rows × the bias-then-rows RHS, one fma per k from the bias."""

    def _operands(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.ascontiguousarray(lhs[: m * k])
        check_finite(rows.reshape(m, k), self.name)
        nr = self.nr
        return rows, np.ascontiguousarray(rhs[: -(-n // nr) * nr * 4 * (1 + k)])

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        rows, rhs = self._operands(m, n, k, lhs, rhs)
        a = rows.reshape(m, k)
        bias, b = unpack_bias_rows(rhs, n, k, self.nr)
        acc = np.broadcast_to(bias, (m, n))
        for kk in range(k):
            acc = fma_f32(a[:, kk, None], b[None, kk], acc)
        return np.asarray(acc, dtype=np.float32)

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        rows, rhs = self._operands(m, n, k, lhs, rhs)
        if self.tier == "sme2":  # (the GEMV: its native SME2 tile where this host runs it)
            return sme2.compute(m, n, k, self.nr, rows, rhs)
        return f32p_jit.matmul_f32_fma(m, n, k, rows, rhs, self.nr, False)


def mla_geometry(vl: int) -> Geometry:
    """6 x 16 tiles; mr = m_step (the LHS is not packed, so mr only sets the row step)."""
    return Geometry(m_step=6, n_step=NR, mr=6, nr=NR, kr=1, sr=1)


def sme2_gemv_geometry(vl: int) -> Geometry:
    """One row; columns in steps of 16·VL, the RHS in groups of nr = 2·VL (KleidiAI's get_mr is its m_step, 1)."""
    return Geometry(m_step=1, n_step=16 * vl, mr=1, nr=2 * vl, kr=1, sr=1)


KERNELS = [
    F32MatmulKernel(
        "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla",
        FAMILY_NAME,
        "neon",
        "gemm",
        None,
        RHS_X32,
        mla_geometry,
        bl=None,
    ),
    F32MatmulKernel(  # (a GEMV: m = 1, as KleidiAI asserts)
        "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla",
        FAMILY_NAME,
        "sme2",
        "gemv",
        None,
        RHS_F32P2VLX1BIASF32_SME,
        sme2_gemv_geometry,
        bl=None,
    ),
]
