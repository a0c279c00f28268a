"""Instruction program of the F32 MOPA family: KleidiAI's ``matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa``.

It replays the kernel's loops (row groups of 2·VL, column groups of 2·VL, K) and instructions over the real packed
bytes: per tile, ``fmov z22.s, #1.0``, the group's 2·VL biases (LD1W of two vectors), ``zero {za}`` and four FMOPA of
the ones by the biases into ZA0.S–ZA3.S (rows 0..VL-1 and VL..2VL-1 by columns 0..VL-1 and VL..2VL-1); per k the
2·VL LHS values (LD1W, two vectors) and the 2·VL RHS values (LD1W, two vectors) and four FMOPA; then per row a MOVA
of its two tiles' row and its ST1W. The program writes the unclamped result (the kernel's FCLAMP is the clamp
``MatmulKernel.run`` applies). Address arithmetic and branches are done in Python (not counted); every data
instruction is emulated.
"""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import sme
from kleidipy.emulator.machine import Buffer, Machine


def _mopa(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    vb, vl = m.vb, m.vl
    mr = nr = 2 * vl
    lhs_stride, rhs_stride = mr * k * 4, nr * (1 + k) * 4
    sme.smstart(m)
    sme.ptrue(m, 0, 4)
    sme.ptrue_pn(m, 9, 4)
    for m0 in range(0, mm, mr):
        for n0 in range(0, n, nr):
            m.trace_when(m0 == 0 and n0 == 0)
            m.section(f"M block {m0}, N block {n0}: bias, then K")
            group = (n0 // nr) * rhs_stride
            sme.dup_imm(m, 22, 1.0, "<f4", "FMOV")
            sme.ld1_multi(m, 4, 12, 2, 9, rhs, group)
            sme.zero_za(m)
            sme.whilelt_pn(m, 8, n0, n, 4, 2)
            for tile, (zn, zm) in enumerate(((22, 12), (22, 13), (22, 12), (22, 13))):
                sme.fmopa(m, tile, zn, zm)
            for kk in range(k):
                m.trace_when(m0 == 0 and n0 == 0 and kk < 2)
                sme.ld1_multi(m, 4, 28, 2, 9, lhs, (m0 // mr) * lhs_stride + kk * 2 * vb)
                sme.ld1_multi(m, 4, 6, 2, 9, rhs, group + (1 + kk) * 2 * vb)
                for tile, (zn, zm) in enumerate(((28, 6), (28, 7), (29, 6), (29, 7))):
                    sme.fmopa(m, tile, zn, zm)
            m.trace_when(False)
            for i in range(min(mm - m0, mr)):
                half, row = divmod(i, vl)
                sme.mova_from_tile_row(m, 4, 2 * half, row)
                sme.mova_from_tile_row(m, 5, 2 * half + 1, row)
                sme.st1_multi(m, 4, 4, 2, 8, dst, (m0 + i) * 4 * n + 4 * n0)
    sme.smstop(m)


PROGRAMS = {"matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa": _mopa}
