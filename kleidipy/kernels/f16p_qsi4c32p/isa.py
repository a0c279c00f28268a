"""Instruction program of the F16-LHS Q4_0 family: KleidiAI's ``…f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa``.

It replays the kernel's loops (column groups of 4·VL, row groups of VL, blocks of 32, K quads) and instructions over
the real packed bytes: per block the 4·VL F16 scales (LD1H of two vectors) zipped with themselves into z24–z27; per K
quad the codes of two K pairs (LD2B: low bytes into z4, high bytes into z5), per pair the VL rows × 2 F16 of the LHS
(LD1W), LUTI4 of the codes to F16 u − 8 (four registers), four F16 FMUL by the zipped scales and four widening
FMOPA into ZA0.S–ZA3.S; after the blocks, per row a MOVA of the four tiles' row and its ST1W. The program writes the
unclamped result (the kernel's FCLAMP is the clamp ``MatmulKernel.run`` applies). Address arithmetic and branches
are done in Python (not counted); every data instruction is emulated.
"""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import sme
from kleidipy.emulator.common import LUT_F16
from kleidipy.emulator.machine import Buffer, Machine

BL = 32


def _pair(m: Machine, lhs: Buffer, lhs_off: int, codes: int) -> None:
    """One K pair of a K quad: the VL rows × 2 F16 of the LHS at ``lhs_off`` (LD1W into z6 or z7), LUTI4 of the codes
    in z<codes> to the 4·VL columns × 2 F16 weights, their FMUL by the scales, one widening FMOPA per ZA.S tile."""
    za_in, w = (6, 8) if codes == 4 else (7, 12)
    sme.ld1(m, 4, za_in, 0, lhs, lhs_off)
    sme.luti4_x4_h(m, w, codes)
    for t in range(4):
        sme.fmul_h(m, w + t, w + t, 24 + t)
    for t in range(4):
        sme.fmopa_wide_h(m, t, za_in, w + t)


def _mopa(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    vb, vl = m.vb, m.vl
    mr, nr, nb = vl, 4 * vl, k // BL
    lhs_stride, rhs_stride = mr * k * 2, nr * nb * (BL // 2 + 2)
    sme.smstart(m)
    sme.ptrue(m, 2, 1)
    sme.ldr_zt0(m, Buffer("lut", LUT_F16), 0)
    for n0 in range(0, n, nr):
        sme.whilelt_pn(m, 8, n0, n, 2, 2)
        sme.whilelt_pn(m, 9, n0, n, 4, 4)
        sme.whilelt(m, 1, n0, n, 1)
        rhs_group = (n0 // nr) * rhs_stride
        rhs_scales = rhs_group + nr * nb * BL // 2
        for m0 in range(0, mm, mr):
            sme.zero_za(m)
            sme.whilelt(m, 0, 0, mm - m0, 4)
            lhs_group = (m0 // mr) * lhs_stride
            for b in range(nb):
                m.trace_when(n0 == 0 and m0 == 0 and b == 0)
                m.section(f"N block {n0}, M block {m0}, K block {b}")
                sme.ld1_multi(m, 2, 0, 2, 8, rhs, rhs_scales + b * nr * 2)
                sme.zip_x2(m, 24, 0, 0, 2)
                sme.zip_x2(m, 26, 1, 1, 2)
                for q in range(b * BL // 4, (b + 1) * BL // 4):
                    sme.ld2(m, 1, 4, 1, rhs, rhs_group + q * 2 * vb)
                    _pair(m, lhs, lhs_group + 2 * q * vb, 4)
                    _pair(m, lhs, lhs_group + (2 * q + 1) * vb, 5)
            m.trace_when(False)
            for i in range(min(mm - m0, vl)):
                sme.mova_tile_rows(m, 0, 4 * i)
                sme.st1_multi(m, 4, 0, 4, 9, dst, (m0 + i) * 4 * n + 4 * n0)
    sme.smstop(m)


PROGRAMS = {"matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa": _mopa}
