"""Instruction program of the ``f32_f32p`` family: ``matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla``.

A 6×16 tile lives in v8–v31 (row r, columns 4v..4v+3 in v8 + 4r + v), started at the 16 packed biases
(4 × LDR q, MOV per row). Per k: the 16 RHS values of row k (4 × LDR q) and, per LHS row, its value
(LDR s) feed 4 FMLA by element (fused, one rounding each, k in ascending order). Then clamp and store.
KleidiAI's source was not available to read; the sequence follows the packed layout and the golden-pinned
arithmetic (one fma per k, from the bias).
"""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import neon
from kleidipy.emulator.common import neon_limits, output_tiles
from kleidipy.emulator.machine import Buffer, Machine

NR, MR = 16, 6


def _neon_mla(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    rhs_stride = NR * 4 * (1 + k)
    for m0, rows, n0 in output_tiles(m, mm, MR, n, NR, "bias, then the K loop (first 2 k traced)"):
        group = (n0 // NR) * rhs_stride
        for v in range(4):
            neon.ldr(m, 16, v, rhs, group + 16 * v)
        for r in range(rows):
            for v in range(4):
                neon.mov(m, 8 + 4 * r + v, v)
        for kk in range(k):
            m.trace_when(m0 == 0 and n0 == 0 and kk < 2)
            for v in range(4):
                neon.ldr(m, 16, v, rhs, group + NR * 4 * (1 + kk) + 16 * v)
            for r in range(rows):
                neon.ldr(m, 4, 4, lhs, ((m0 + r) * k + kk) * 4)
                for v in range(4):
                    neon.fmla_elem(m, 8 + 4 * r + v, v, 4, 0)
        m.trace_when(m0 == 0 and n0 == 0)
        neon_limits(m, 4)
        for r in range(rows):
            for v in range(4):
                col = n0 + 4 * v
                if col >= n:
                    continue
                reg = 8 + 4 * r + v
                neon.fmax(m, reg, reg, 4)
                neon.fmin(m, reg, reg, 5)
                neon.store(m, reg, min(4, n - col), 4, dst, ((m0 + r) * n + col) * 4)


PROGRAMS = {"matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla": _neon_mla}
