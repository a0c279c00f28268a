"""Instruction programs of the ``bf16p_bf16p`` family (F16 weights on KleidiAI's BF16 kernels).

* SME2/SME ``2vlx2vl_*_mopa``: ZA starts at the bias (ZERO, then FMOPA of a vector of 1.0 with the bias
  vectors), every K pair is one BFMOPA per tile (ZA0..ZA3 = rows 0/VL × columns 0/VL of the 2VL×2VL tile), then
  the tile rows leave through MOVA, clamp and ST1W.
* NEON ``8x12_neon_mmla``: 24 BFMMLA tiles [r0c0 r0c1 r1c0 r1c1] started at the bias (ZIP1/ZIP2 .2d of the bias
  pairs), UZP1/UZP2 .2d to rows at the end.
* NEON ``1x36_neon_dot``: BFDOT (vector) of [col c 4 K | col c+1 4 K] with the 4 LHS values replicated: lanes
  [c (k0,k1), c (k2,k3), c+1 (k0,k1), c+1 (k2,k3)] started at [bias, 0, bias, 0]; FADDP adds the two halves.

The BF16 steps follow FPCR.EBF = 0 (every product and sum rounded to odd, :mod:`.fp`). KleidiAI's BF16 sources
were not available to read; the instruction sequences follow the packed layouts and the arithmetic the golden
data pins down (module docstring of :mod:`kleidipy.kernels.bf16p_bf16p.ukernels`).
"""

from __future__ import annotations

from kleidipy.core.buffers import roundup
from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import neon, sme
from kleidipy.emulator.common import neon_limits, output_tiles, sme_start
from kleidipy.emulator.machine import Buffer, Machine


def _sme_mopa(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    sme2 = kern.tier == "sme2"
    vb, vl = m.vb, m.vl
    mr = nr = 2 * vl
    kp = roundup(k, 2)
    lhs_stride, rhs_stride = mr * kp * 2, nr * 4 + nr * kp * 2
    sme_start(m, 0, 2, limits=30)
    sme.dup_imm(m, 29, 1.0, "<f4", "FMOV")
    for m0, rows, n0 in output_tiles(m, mm, mr, n, nr, "bias, then the K loop (first 8 K pairs traced)"):
        lhs_group = (m0 // mr) * lhs_stride
        rhs_group = (n0 // nr) * rhs_stride
        sme.zero_za(m)
        for t in range(2):
            sme.ld1(m, 4, 4 + t, 0, rhs, rhs_group + t * vb)
        for t in range(4):
            sme.fmopa(m, t, 29, 4 + t % 2)
        for p in range(kp // 2):
            m.trace_when(m0 == 0 and n0 == 0 and p < 8)
            data = rhs_group + nr * 4 + p * 2 * vb
            if sme2:
                sme.ld1_multi(m, 2, 0, 2, 8, lhs, lhs_group + p * 2 * vb)
                sme.ld1_multi(m, 2, 2, 2, 8, rhs, data)
            else:
                for t in range(2):
                    sme.ld1(m, 2, t, 0, lhs, lhs_group + p * 2 * vb + t * vb)
                    sme.ld1(m, 2, 2 + t, 0, rhs, data + t * vb)
            for t in range(4):
                sme.bfmopa(m, t, t // 2, 2 + t % 2)
        m.trace_when(m0 == 0 and n0 == 0)
        for t in range(2):
            sme.whilelt(m, 4 + t, n0 + t * vl, n, 4)
        for i in range(rows):
            half, row = divmod(i, vl)
            for t in range(2):
                sme.mova_from_tile_row(m, 24 + t, 2 * half + t, row)
            for t in range(2):
                sme.fmax(m, 24 + t, 0, 30)
                sme.fmin(m, 24 + t, 0, 31)
            for t in range(2):
                sme.st1(m, 4, 24 + t, 4 + t, dst, ((m0 + i) * n + n0) * 4 + t * vb)
    sme.smstop(m)


def _neon_mmla(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``bf16p8x4_bf16p12x4b_8x12_neon_mmla``: accumulator v8 + 6·(row pair) + (column pair)."""
    mr, nr = 8, 12
    kp = roundup(k, 4)
    lhs_stride, rhs_stride = mr * kp * 2, nr * 4 + nr * kp * 2
    for m0, rows, n0 in output_tiles(m, mm, mr, n, nr, "bias, then the K loop (first 2 chunks traced)"):
        lhs_group = (m0 // mr) * lhs_stride
        rhs_group = (n0 // nr) * rhs_stride
        for q in range(3):
            neon.ldr(m, 16, q, rhs, rhs_group + 16 * q)
        for cp in range(6):
            for rp in range(4):
                neon.zip_(m, 1 + cp % 2, 8 + 6 * rp + cp, cp // 2, cp // 2, 8)
        for c in range(kp // 4):
            m.trace_when(m0 == 0 and n0 == 0 and c < 2)
            for rp in range(4):
                neon.ldr(m, 16, rp, lhs, lhs_group + c * 64 + 16 * rp)
            for cp in range(6):
                neon.ldr(m, 16, 4 + cp % 4, rhs, rhs_group + nr * 4 + c * 96 + 16 * cp)
                for rp in range(4):
                    neon.bfmmla(m, 8 + 6 * rp + cp, rp, 4 + cp % 4)
        m.trace_when(m0 == 0 and n0 == 0)
        neon_limits(m, 6)
        for rp in range(4):
            for j in range(3):
                neon.uzp(m, 1, 0, 8 + 6 * rp + 2 * j, 9 + 6 * rp + 2 * j, 8)
                neon.uzp(m, 2, 1, 8 + 6 * rp + 2 * j, 9 + 6 * rp + 2 * j, 8)
                for r in range(2):
                    if 2 * rp + r >= rows or n0 + 4 * j >= n:
                        continue
                    neon.fmax(m, r, r, 6)
                    neon.fmin(m, r, r, 7)
                    neon.store(m, r, min(4, n - n0 - 4 * j), 4, dst, ((m0 + 2 * rp + r) * n + n0 + 4 * j) * 4)


def _neon_dot(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``bf16p1x4_bf16p12x4b_1x36_neon_dot`` (m = 1): 36 columns = 3 packed groups of 12, accumulator
    v8 + (column pair) for the 18 pairs."""
    nr, n_step = 12, 36
    kp = roundup(k, 4)
    rhs_stride = nr * 4 + nr * kp * 2
    for n0 in range(0, n, n_step):
        groups = [g for g in range(n0 // nr, n0 // nr + 3) if g * nr < n]
        m.trace_when(n0 == 0)
        m.section(f"N block {n0}: bias, then the K loop (first 2 chunks traced)")
        neon.movi(m, 7, 0)
        for gi, g in enumerate(groups):
            for q in range(3):
                neon.ldr(m, 16, 0, rhs, g * rhs_stride + 16 * q)
                neon.zip_(m, 1, 8 + 6 * gi + 2 * q, 0, 7, 4)
                neon.zip_(m, 2, 9 + 6 * gi + 2 * q, 0, 7, 4)
        for c in range(kp // 4):
            m.trace_when(n0 == 0 and c < 2)
            neon.ld1r(m, 8, 0, lhs, 8 * c)
            for gi, g in enumerate(groups):
                for cp in range(6):
                    neon.ldr(m, 16, 1 + cp % 4, rhs, g * rhs_stride + nr * 4 + c * 96 + 16 * cp)
                    neon.bfdot(m, 8 + 6 * gi + cp, 1 + cp % 4, 0)
        m.trace_when(n0 == 0)
        neon_limits(m, 5)
        for gi, g in enumerate(groups):
            for q in range(3):
                col = g * nr + 4 * q
                if col >= n:
                    continue
                neon.faddp(m, 1, 8 + 6 * gi + 2 * q, 9 + 6 * gi + 2 * q)
                neon.fmax(m, 1, 1, 5)
                neon.fmin(m, 1, 1, 6)
                neon.store(m, 1, min(4, n - col), 4, dst, col * 4)
    m.trace_when(False)


PROGRAMS = {
    "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa": _sme_mopa,
    "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme_mopa": _sme_mopa,
    "matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla": _neon_mmla,
    "matmul_clamp_f32_bf16p1x4_bf16p12x4b_1x36_neon_dot": _neon_dot,
}
