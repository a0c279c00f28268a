"""Instruction programs of the exact-weight family ``qsi8d32p × qai8c16p`` (int8 activations per 32-block × int8
weight codes with an f32 scale and offset per 16 values; layout and recipe in
:mod:`kleidipy.kernels.qsi8d32p_qai8c16p.ukernels`). kleidipy's own kernels: there is no KleidiAI assembly to follow.

Per 16-block and group of 16 columns (four vectors of 4 columns): the LHS quads (LDR q: the GEMM's holds 4 rows ×
4 values, the GEMV's its row's 4 quads), Σq per row by SDOT against a vector of ones; per column vector, SDOT by
element of each quad's 16 code bytes (4 columns × 4 values) with the row's quad into an int32 vector per row, then
per row SCVTF, acc = fma(scale·rc, a, acc) (FMUL by element, FMLA), acc = fma(offset·rc, Σq, acc) (FMUL by element,
FMLA by element; done for ±0 offsets too: it leaves acc unchanged); after the last block acc + bias (FADD).
"""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import common, neon
from kleidipy.emulator.common import NEON_ACC
from kleidipy.emulator.machine import Buffer, Machine

BL = 16  # values per RHS block (two per LHS block)
LHS_BLOCK = 40  # per row and LHS block of 32: 32 int8, f32 row sum, f32 recip
NR = 16  # columns of a packed RHS group: four vectors of 4
RHS_BLOCK = NR * 24  # per group and 16-block: 16 × 16 int8 codes, 16 f32 offsets, 16 f32 scales
ONES, RC, LHS, QSUM, DOTS = 13, 14, 8, 12, 4  # registers: 0x01 bytes, recips, LHS quads, Σq, int32 dots per row


def _dotprod(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``qsi8d32p4x4_qai8c16p16x4_4x16_neon_dotprod`` (mr = 4: LDR q per quad, SDOT index = row) and
    ``qsi8d32p1x4_qai8c16p16x4_1x16_neon_dotprod`` (mr = 1: one LDR q per block, SDOT index = quad)."""
    mr, nb = kern.mr, k // BL
    lhs_stride, rhs_stride = mr * (nb // 2) * LHS_BLOCK, NR * (nb * 24 + 4)
    neon.movi(m, ONES, 1)

    def quad(u: int, r: int) -> tuple[int, int]:  # (register, 4-byte index) of row r's quad u
        return (LHS + u, r) if mr == 4 else (LHS, u)

    def block(m0: int, rows: int, n0: int, b: int) -> None:
        lhs_block = (m0 // mr) * lhs_stride + (b // 2) * mr * LHS_BLOCK
        rhs_block = (n0 // NR) * rhs_stride + b * RHS_BLOCK
        if b % 2 == 0:
            neon.ldr(m, 4 * mr, RC, lhs, lhs_block + 36 * mr)
        neon.movi(m, QSUM, 0)
        for u in range(BL // 4):
            if mr == 4:
                neon.ldr(m, 16, LHS + u, lhs, lhs_block + 16 * mr * (b % 2) + 16 * u)
                neon.sdot(m, QSUM, LHS + u, ONES)  # lane r: Σ of row r's quad u
            else:
                if u == 0:
                    neon.ldr(m, 16, LHS, lhs, lhs_block + 16 * (b % 2))
                neon.sdot_elem(m, QSUM, ONES, LHS, u)  # every lane: Σ of quad u
        neon.scvtf(m, QSUM, QSUM)
        for v in range(NR // 4):
            for r in range(rows):
                neon.movi(m, DOTS + r, 0)
            for u in range(BL // 4):
                neon.ldr(m, 16, 0, rhs, rhs_block + 64 * u + 16 * v)
                for r in range(rows):
                    neon.sdot_elem(m, DOTS + r, 0, *quad(u, r))
            neon.ldr(m, 16, 1, rhs, rhs_block + BL * NR + 16 * v)  # offsets
            neon.ldr(m, 16, 2, rhs, rhs_block + (BL + 4) * NR + 16 * v)  # scales
            for r in range(rows):
                acc, lane = NEON_ACC + 4 * r + v, r % mr
                neon.scvtf(m, DOTS + r, DOTS + r)
                neon.fmul_elem(m, 3, 2, RC, lane)
                neon.fmla(m, acc, DOTS + r, 3)
                neon.fmul_elem(m, 3, 1, RC, lane)
                neon.fmla_elem(m, acc, 3, QSUM, lane)

    def finish(m0: int, rows: int, n0: int) -> None:
        bias = (n0 // NR) * rhs_stride + nb * RHS_BLOCK
        for v in range(NR // 4):
            neon.ldr(m, 16, 0, rhs, bias + 16 * v)
            for r in range(rows):
                neon.fadd(m, NEON_ACC + 4 * r + v, NEON_ACC + 4 * r + v, 0)
        common.neon_store_rows(m, rows, n0, n, dst, m0, cols=NR)

    common.neon_block_tiles(m, mm, n, nb, mr, kern.m_step, block, finish, cols=NR)


PROGRAMS = {
    "matmul_clamp_f32_qsi8d32p4x4_qai8c16p16x4_4x16_neon_dotprod": _dotprod,
    "matmul_clamp_f32_qsi8d32p1x4_qai8c16p16x4_1x16_neon_dotprod": _dotprod,
}
