"""Instruction programs of the Q4_1 family ``qsi8d32p × qai4c32p`` (8-bit blocked activations × asymmetric
4-bit blocked weights; recipe in :mod:`kleidipy.kernels.qsi8d32p_qai4c32p.ukernels`).

Per block the integer dot a = Σ q·w is built like the Q4_0 kernels' (SME2: LUTI4 of the unsigned codes with
entry i = i − 8, then SMOPA into the ZA.S tiles or SDOT into a ZA vector group; NEON: SMMLA / SDOT on the
SHL #4 / AND #0xF0 nibbles, 16·w), then each output takes the zero term and the scale term, both fused:
acc = fma(zero, rowsum_L, acc) (FMLA; FMUL for the MOPA kernel's first block), acc = fma(scale·recip_L, a, acc)
(FMUL, FMLA); after the last block acc + bias (FADD).

KleidiAI's assembly of these kernels was not available to read; the programs follow the Q4_0 kernels of the
same shapes (which share the templates) on this family's packed layouts.
"""

from __future__ import annotations

from collections.abc import Callable

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import common, neon, sme
from kleidipy.emulator.common import LUT_U4, NEON_ACC
from kleidipy.emulator.machine import Buffer, Machine

BL = 32
LHS_BLOCK = 40  # per row: 32 int8, f32 row sum, f32 recip
RHS_BLOCK = 24  # per column: 16 bytes of nibbles, f32 zero, f32 scale


def _rhs_stride(nr: int, nb: int) -> int:
    return nr * (nb * RHS_BLOCK + 4)


# --------------------------------------------------------------------------------------------- SME2


def _sme2_mopa(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa``: per block 8 K-quads of LUTI4 + 4 SMOPA; per row the
    four tile rows (MOVA, SCVTF) are scaled into dst (FMUL zero·rowsum first block, else reload + FMLA)."""
    vb, vl = m.vb, m.vl
    mr, nr, nb = vl, 4 * vl, k // BL
    lhs_stride, rhs_stride = mr * nb * LHS_BLOCK, _rhs_stride(nr, nb)
    row_bytes = 4 * n
    common.sme_start(m, 0, 4, limits=16, lut=LUT_U4)
    for n0 in range(0, n, nr):
        sme.whilelt_pn(m, 9, n0, n, 4, 4)
        rhs_group = (n0 // nr) * rhs_stride
        for m0 in range(0, mm, mr):
            lhs_group = (m0 // mr) * lhs_stride
            rows = min(mm - m0, vl)
            for b in range(nb):
                m.trace_when(n0 == 0 and m0 == 0 and b == 0)
                m.section(f"N block {n0}, M block {m0}, K block {b}")
                rhs_block, lhs_block = rhs_group + b * nr * RHS_BLOCK, lhs_group + b * mr * LHS_BLOCK
                sme.zero_za(m)
                for q in range(BL // 4):
                    common.sme2_luti4_smopa(m, rhs, rhs_block + q * 2 * vb, lhs, lhs_block + q * vb, 4)
                sme.ld1_multi(m, 4, 0, 4, 8, rhs, rhs_block + 16 * nr)  # zero
                sme.ld1_multi(m, 4, 12, 4, 8, rhs, rhs_block + 20 * nr)  # scale
                last = b == nb - 1
                if last:
                    sme.ld1_multi(m, 4, 20, 4, 9, rhs, rhs_group + nb * nr * RHS_BLOCK)  # bias
                for i in range(rows):
                    m.trace_when(n0 == 0 and m0 == 0 and b == 0 and i < 2)
                    sme.ld1r(m, 4, 18, 0, lhs, lhs_block + 32 * mr + 4 * i)  # row sum
                    sme.ld1r(m, 4, 19, 0, lhs, lhs_block + 36 * mr + 4 * i)  # recip
                    sme.mova_tile_rows(m, 28, 4 * i)
                    sme.scvtf_x4(m, 28)
                    for t in range(4):
                        sme.fmul(m, 8 + t, 12 + t, 19)
                    row_off = (m0 + i) * row_bytes + 4 * n0
                    if b == 0:
                        for t in range(4):
                            sme.fmul(m, 24 + t, t, 18)
                    else:
                        sme.ld1_multi(m, 4, 24, 4, 9, dst, row_off)
                        for t in range(4):
                            sme.fmla(m, 24 + t, 0, t, 18)
                    for t in range(4):
                        sme.fmla(m, 24 + t, 0, 8 + t, 28 + t)
                    if last:
                        for t in range(4):
                            sme.fadd(m, 24 + t, 0, 20 + t)
                        sme.fclamp_x4(m, 24, 16, 17)
                    sme.st1_multi(m, 4, 24, 4, 9, dst, row_off)
    m.trace_when(False)
    sme.smstop(m)


def _sme2_dot(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot`` (m = 1): per block, LD1RQB of 16 LHS bytes, LUTI4 of two
    K-quads × 4VL columns, SDOT into the ZA vector group; then z24–z27 take the zero and scale terms."""
    vb = m.vb
    nr, nb = vb, k // BL
    rhs_stride = _rhs_stride(nr, nb)
    common.sme_start(m, 2, 2, limits=30, lut=LUT_U4)
    for n0 in range(0, n, nr):
        rhs_group = (n0 // nr) * rhs_stride
        for t in range(4):
            sme.dup_imm(m, 24 + t, 0, "<i4")
        for b in range(nb):
            m.trace_when(n0 == 0 and b == 0)
            m.section(f"N block {n0}, K block {b}")
            rhs_block, lhs_block = rhs_group + b * nr * RHS_BLOCK, b * LHS_BLOCK
            sme.zero_za(m)
            for h in range(BL // 16):
                sme.ld1rq(m, 0, 2, lhs, lhs_block + 16 * h)
                for half in range(2):
                    common.sme2_luti4_sdot(m, rhs, rhs_block + (4 * h + 2 * half) * 2 * vb, 2 * half)
            sme.mova_vgx4(m, 16, 0)
            sme.scvtf_x4(m, 16)
            sme.ld1r(m, 4, 1, 2, lhs, lhs_block + 32)  # row sum
            sme.ld1r(m, 4, 2, 2, lhs, lhs_block + 36)  # recip
            sme.ld1_multi(m, 4, 4, 4, 8, rhs, rhs_block + 16 * nr)  # zero
            sme.ld1_multi(m, 4, 8, 4, 8, rhs, rhs_block + 20 * nr)  # scale
            for t in range(4):
                sme.fmla(m, 24 + t, 2, 4 + t, 1)
            for t in range(4):
                sme.fmul(m, 8 + t, 8 + t, 2)
            for t in range(4):
                sme.fmla(m, 24 + t, 2, 8 + t, 16 + t)
        m.trace_when(n0 == 0)
        sme.whilelt_pn(m, 9, n0, n, 4, 4)
        sme.ld1_multi(m, 4, 4, 4, 9, rhs, rhs_group + nb * nr * RHS_BLOCK)  # bias
        for t in range(4):
            sme.fadd(m, 24 + t, 2, 4 + t)
        sme.fclamp_x4(m, 24, 30, 31)
        sme.st1_multi(m, 4, 24, 4, 9, dst, 4 * n0)
    m.trace_when(False)
    sme.smstop(m)


# --------------------------------------------------------------------------------------------- NEON
#
# Integer accumulators in v24–v31 (8 rows: SMMLA tiles or per-row SDOT sums) while v16–v23 hold the rows'
# float accumulators; after a block's integer part v1–v7 take the per-block values (zero, scale, row sums,
# recips, products).


def _neon_block_epilogue(m: Machine, ints: list[int], rows: int, row0: int, lhs: Buffer, lhs_block: int,
                         rhs: Buffer, rhs_block: int, mr: int) -> None:  # fmt: skip
    """Per row: a = SCVTF(16·dot) (the 16 is carried by the stored scale/16), acc = fma(zero, rowsum, acc)
    (FMLA by element), S = scale·recip (FMUL by element), acc = fma(a, S, acc) (FMLA)."""
    neon.ldr(m, 16, 1, rhs, rhs_block + 64)  # zero
    neon.ldr(m, 16, 2, rhs, rhs_block + 80)  # scale / 16
    if mr == 1:
        neon.ld1r(m, 4, 3, lhs, lhs_block + 32)
        neon.ld1r(m, 4, 4, lhs, lhs_block + 36)
    else:
        neon.ldr(m, 16, 3, lhs, lhs_block + 32 * mr)
        neon.ldr(m, 16, 4, lhs, lhs_block + 36 * mr)
    for r in range(rows):
        acc, lane = NEON_ACC + row0 + r, r % mr
        neon.scvtf(m, ints[r], ints[r])
        neon.fmla_elem(m, acc, 1, 3, lane)
        neon.fmul_elem(m, 5, 2, 4, lane)
        neon.fmla(m, acc, ints[r], 5)


def _neon_finish(m: Machine, rows: int, rhs: Buffer, bias_off: int, n0: int, n: int, dst: Buffer, m0: int) -> None:
    """acc + bias (FADD), then clamp and store."""
    neon.ldr(m, 16, 0, rhs, bias_off)
    for r in range(rows):
        neon.fadd(m, NEON_ACC + r, NEON_ACC + r, 0)
    common.neon_store_rows(m, rows, n0, n, dst, m0)


def _neon_blocks(
    m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, rhs: Buffer, dst: Buffer,
    block: Callable[[int, int, list[int]], None],
) -> None:  # fmt: skip
    """The loops of the GEMM / 4-row kernels: per K block the RHS nibbles (0xF0 mask in v13), then
    ``block(rows, rhs_block, lhs_blocks)`` (the block's offsets in the RHS group and in each group of mr LHS
    rows); finally acc + bias, clamp and store."""
    mr, nb = kern.mr, k // BL
    lhs_stride, rhs_stride = mr * nb * LHS_BLOCK, _rhs_stride(4, nb)
    neon.movi(m, 13, 0xF0)

    def each_block(m0: int, rows: int, n0: int, b: int) -> None:
        rhs_block = (n0 // 4) * rhs_stride + b * 4 * RHS_BLOCK
        common.neon_split_nibbles(m, rhs, rhs_block, 13)
        groups = range(m0 // mr, m0 // mr + -(-rows // mr))
        block(rows, rhs_block, [g * lhs_stride + b * mr * LHS_BLOCK for g in groups])

    def finish(m0: int, rows: int, n0: int) -> None:
        _neon_finish(m, rows, rhs, (n0 // 4) * rhs_stride + nb * 4 * RHS_BLOCK, n0, n, dst, m0)

    common.neon_block_tiles(m, mm, n, nb, mr, kern.m_step, each_block, finish)


def _neon_i8mm(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``qsi8d32p4x8_qai4c32p4x8_8x4_neon_i8mm``: per block, SMMLA of [row r 8 K | row r+1 8 K] chunks with the
    nibbles of the two 8-byte segments ([col 0 | col 1], [col 2 | col 3]), UZP1/UZP2 .2d to rows."""
    mr = kern.mr

    def block(rows: int, rhs_block: int, lhs_blocks: list[int]) -> None:
        tiles = list(range(24, 24 + 4 * len(lhs_blocks)))
        for reg in tiles:
            neon.movi(m, reg, 0)
        for grp, lhs_block in enumerate(lhs_blocks):
            for c in range(4):
                nibbles = (5 if c < 2 else 1) + 2 * (c % 2)
                for pair in range(2):
                    neon.ldr(m, 16, 15, lhs, lhs_block + 32 * c + 16 * pair)
                    neon.smmla(m, tiles[4 * grp + 2 * pair], 15, nibbles)
                    neon.smmla(m, tiles[4 * grp + 2 * pair + 1], 15, nibbles + 1)
        for grp, lhs_block in enumerate(lhs_blocks):
            for pair, temps in enumerate(((10, 11), (14, 15))):
                common.neon_uzp_rows(m, tiles[4 * grp + 2 * pair], tiles[4 * grp + 2 * pair + 1], *temps)
            _neon_block_epilogue(
                m, [10, 11, 14, 15], min(mr, rows - mr * grp), mr * grp, lhs, lhs_block, rhs, rhs_block, mr
            )

    _neon_blocks(m, kern, mm, n, k, rhs, dst, block)


def _neon_dotprod(
    m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer
) -> None:
    """``qsi8d32p4x4_qai4c32p4x4_8x4_neon_dotprod`` and ``qsi8d32p1x4_qai4c32p4x4_1x4_neon_dotprod`` (kr = 8):
    SDOT by element of the 4-byte segments' nibbles with 4-value K chunks (4 rows: idx = row; 1 row: 16 K per
    LDR q, idx = chunk)."""
    mr = kern.mr

    def block(rows: int, rhs_block: int, lhs_blocks: list[int]) -> None:
        ints = list(range(24, 24 + len(lhs_blocks) * mr))
        for reg in ints:
            neon.movi(m, reg, 0)
        for grp, lhs_block in enumerate(lhs_blocks):
            if mr == 1:
                neon.ldr(m, 16, 14, lhs, lhs_block)
                neon.ldr(m, 16, 15, lhs, lhs_block + 16)
                for c in range(8):
                    neon.sdot_elem(m, ints[0], (5 if c < 4 else 1) + c % 4, (14, 15)[c // 4], c % 4)
            else:
                for c in range(8):
                    neon.ldr(m, 16, 15, lhs, lhs_block + 16 * c)
                    for r in range(mr):
                        neon.sdot_elem(m, ints[mr * grp + r], (5 if c < 4 else 1) + c % 4, 15, r)
        for grp, lhs_block in enumerate(lhs_blocks):
            _neon_block_epilogue(
                m, ints[mr * grp :], min(mr, rows - mr * grp), mr * grp, lhs, lhs_block, rhs, rhs_block, mr
            )

    _neon_blocks(m, kern, mm, n, k, rhs, dst, block)


def _neon_dotprod_1x8(
    m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer
) -> None:
    """``qsi8d32p1x8_qai4c32p4x8_1x4_neon_dotprod`` (kr = 16): SDOT (vector) of [col c | col c+1] 8-byte
    segment nibbles with the replicated 8-value LHS chunk (LD1R .2d), ADDP into the four columns per block."""
    nb = k // BL
    rhs_stride = _rhs_stride(4, nb)
    neon.movi(m, 13, 0xF0)
    for n0 in range(0, n, 4):
        rhs_group = (n0 // 4) * rhs_stride
        neon.movi(m, NEON_ACC, 0)
        for b in range(nb):
            m.trace_when(n0 == 0 and b == 0)
            m.section(f"N block {n0}, K block {b}")
            rhs_block, lhs_block = rhs_group + b * 4 * RHS_BLOCK, b * LHS_BLOCK
            common.neon_split_nibbles(m, rhs, rhs_block, 13)
            neon.movi(m, 10, 0)
            neon.movi(m, 11, 0)
            for c in range(4):
                neon.ld1r(m, 8, 14, lhs, lhs_block + 8 * c)
                nibbles = (5 if c < 2 else 1) + 2 * (c % 2)
                neon.sdot(m, 10, nibbles, 14)
                neon.sdot(m, 11, nibbles + 1, 14)
            neon.addp(m, 24, 10, 11, 4)
            _neon_block_epilogue(m, [24], 1, 0, lhs, lhs_block, rhs, rhs_block, 1)
        m.trace_when(n0 == 0)
        _neon_finish(m, 1, rhs, rhs_group + nb * 4 * RHS_BLOCK, n0, n, dst, 0)
    m.trace_when(False)


PROGRAMS = {
    "matmul_clamp_f32_qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa": _sme2_mopa,
    "matmul_clamp_f32_qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot": _sme2_dot,
    "matmul_clamp_f32_qsi8d32p4x8_qai4c32p4x8_8x4_neon_i8mm": _neon_i8mm,
    "matmul_clamp_f32_qsi8d32p4x4_qai4c32p4x4_8x4_neon_dotprod": _neon_dotprod,
    "matmul_clamp_f32_qsi8d32p1x8_qai4c32p4x8_1x4_neon_dotprod": _neon_dotprod_1x8,
    "matmul_clamp_f32_qsi8d32p1x4_qai4c32p4x4_1x4_neon_dotprod": _neon_dotprod,
}
