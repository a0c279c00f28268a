"""The ``f32_f32p`` family: F16 weights kept exact in float32 (the FP32 fallback of the F16 route).

Owns the RHS packer ``rhs_pack_kxn_x32p16x1b_x32_x32_neon`` and the kernel
``matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla``. The LHS is not packed: the kernel reads the float32 rows.
The weights come from :func:`kleidipy.kernels.pack.kxn.f16_nxk_to_f32_kxn` (exact F16 -> F32, K x N,
zero bias).

Packed RHS: per group of 16 columns, 16 f32 biases, then for each k the 16 f32 of row k (padding columns 0).

Arithmetic (confirmed bit for bit against every golden run): the accumulator starts at the bias and takes one
fused multiply-add per k, in ascending k (FMLA by element, round to nearest even)::

    acc = bias[n];  for k in 0..K-1: acc = fma(lhs[m, k], rhs[k, n], acc)

A plain multiply-then-add chain instead mismatches 4987 of the 6311 golden outputs.
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.buffers import check_finite
from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import fma_f32
from kleidipy.core.packers import RhsPacker
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.f32_f32p import jit
from kleidipy.kernels.pack.kxn import check_no_bl, kxn_inputs

FAMILY_NAME = "f32_f32p"
NR = 16


class X32KxnRhsPacker(RhsPacker):
    """``rhs_pack_kxn_x32p16x1b_x32_x32_neon``: K x N f32 + f32 bias (None = zeros, as KleidiAI's NULL bias)."""

    name = "rhs_pack_kxn_x32p16x1b_x32_x32_neon"
    blocked = False
    rhs_order = "kxn"
    inputs = ()

    def get_rhs_packed_stride(self, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return nr * 4 * (1 + k)

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        check_no_bl(self.name, bl)
        if (nr, kr, sr) != (NR, 1, 1):
            raise KernelShapeError(f"{self.name}: takes nr=16, kr=1, sr=1; got nr={nr}, kr={kr}, sr={sr}")

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        weights, biases = kxn_inputs(self.name, n, k, rhs, scale, zero, bias)
        groups = -(-n // nr)
        packed = np.zeros((groups, 1 + k, nr), dtype=np.float32)
        head = np.zeros(groups * nr, dtype=np.float32)
        head[:n] = biases
        packed[:, 0] = head.reshape(groups, nr)
        cols = np.zeros((k, groups * nr), dtype=np.float32)
        cols[:, :n] = weights
        packed[:, 1:] = cols.reshape(k, groups, nr).transpose(1, 0, 2)
        return packed.reshape(-1).view(np.uint8)

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        weights, biases = kxn_inputs(self.name, n, k, rhs, scale, zero, bias)
        return jit.pack_rhs_x32_kxn(np.ascontiguousarray(weights), biases, nr)


RHS_X32 = X32KxnRhsPacker()
PACKERS = [RHS_X32]


class F32MatmulKernel(MatmulKernel):
    """``matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla``: f32 LHS rows x packed f32 RHS, one fma per k."""

    def _operands(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.ascontiguousarray(lhs[: m * k])
        check_finite(rows.reshape(m, k), self.name)
        return rows, np.ascontiguousarray(rhs[: -(-n // NR) * NR * 4 * (1 + k)])

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        rows, rhs = self._operands(m, n, k, lhs, rhs)
        a = rows.reshape(m, k)
        packed = rhs.view(np.float32).reshape(-1, 1 + k, NR)
        bias = packed[:, 0].reshape(-1)[:n]
        b = packed[:, 1:].transpose(1, 0, 2).reshape(k, -1)[:, :n]
        acc = np.broadcast_to(bias, (m, n))
        for kk in range(k):
            acc = fma_f32(a[:, kk, None], b[None, kk], acc)
        return np.asarray(acc, dtype=np.float32)

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        rows, rhs = self._operands(m, n, k, lhs, rhs)
        return jit.matmul_f32_fma(m, n, k, rows, rhs, NR)


def mla_geometry(vl: int) -> Geometry:
    """6 x 16 tiles; mr = m_step (the LHS is not packed, so mr only sets the row step)."""
    return Geometry(m_step=6, n_step=NR, mr=6, nr=NR, kr=1, sr=1)


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
]
