"""Instruction programs of the Q4_0 family ``qsi8d32p × qsi4c32p`` (spec §5.3–5.5).

Each program replays one KleidiAI kernel's loops and instructions over the real packed bytes: the SME2 MOPA
(LUTI4 + SMOPA into the four ZA.S tiles, per-row FMLALB/FMLALT scale epilogue through dst), the SME2 GEMV (LUTI4
+ multi-vector SDOT into ZA vector groups), their SME1 siblings (nibbles extracted as 16·w with LSL/AND, scales
stored as d/16), and the NEON I8MM / DotProd kernels (SMMLA or SDOT on nibble-shifted bytes, SCVTF #4, FCVTL'd
scales). Address arithmetic and branches are done in Python (not counted); every data instruction is emulated.

Sources read (facts only): the SME2 MOPA and SDOT kernels, the SME1 dot kernel, the NEON ``8x4x32`` I8MM and
``1x4`` DotProd kernels. The SME1 MOPA, the ``16x4`` I8MM / DotProd and the ``1x8`` DotProd sources were not
available: their programs follow their siblings' instruction pattern on their own packed layouts (the SME1
MOPA: SME2 MOPA loops with the SME1 dot kernel's nibble extraction, two SMOPA per tile and 8-value packet).
"""

from __future__ import annotations

from collections.abc import Callable

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import common, neon, sme
from kleidipy.emulator.common import LUT_U4, NEON_ACC
from kleidipy.emulator.machine import Buffer, Machine

BL = 32

# --------------------------------------------------------------------------------------------- SME GEMM


def _sme_mopa(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``…1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa`` (LUTI4) and ``…_sme_mopa`` (LSL/AND nibbles)."""
    sme2 = kern.tier == "sme2"
    vb, vl = m.vb, m.vl
    mr, nr, nb = vl, 4 * vl, k // BL
    lhs_stride, rhs_stride = mr * nb * (BL + 2), nr * nb * (BL // 2 + 2)
    row_bytes = 4 * n
    common.sme_start(m, 0, 4, lut=LUT_U4 if sme2 else None)
    sme.whilelt(m, 4, 0, 2 * mr, 1)
    if not sme2:
        sme.dup_imm(m, 20, -16, "<i1")
    for n0 in range(0, n, nr):
        sme.whilelt_pn(m, 9, n0, n, 4, 4)
        rhs_group = (n0 // nr) * rhs_stride
        rhs_scales = rhs_group + rhs_stride - nr * nb * 2
        for m0 in range(0, mm, mr):
            lhs_group = (m0 // mr) * lhs_stride
            lhs_scales = lhs_group + lhs_stride - mr * nb * 2
            rows = min(mm - m0, vl)
            for b in range(nb):
                m.trace_when(n0 == 0 and m0 == 0 and b == 0)
                m.section(f"N block {n0}, M block {m0}, K block {b}")
                sme.zero_za(m)
                sme.ld1_multi(m, 4, 0, 2, 8, rhs, rhs_scales + b * 2 * vb)
                sme.zip_x2(m, 0, 0, 1, 2)
                if sme2:
                    for c in range(BL // 4):
                        step = b * (BL // 4) + c
                        common.sme2_luti4_smopa(m, rhs, rhs_group + step * 2 * vb, lhs, lhs_group + step * vb, 2)
                else:
                    for p in range(BL // 8):
                        packet = b * (BL // 8) + p
                        for t in range(4):
                            sme.ld1(m, 1, 12 + t, 0, rhs, rhs_group + packet * 4 * vb + t * vb)
                        sme.ld1(m, 2, 16, 0, lhs, lhs_group + 2 * packet * vb)
                        sme.ld1(m, 2, 17, 0, lhs, lhs_group + (2 * packet + 1) * vb)
                        for t in range(4):
                            sme.lsl_imm(m, 4 + 2 * t, 12 + t, 4)
                            sme.and_(m, 5 + 2 * t, 12 + t, 20)
                        for t in range(4):
                            sme.smopa4(m, t, 0, 0, 16, 4 + 2 * t)
                            sme.smopa4(m, t, 0, 0, 17, 5 + 2 * t)
                _mopa_epilogue(m, sme2, b, rows, lhs, lhs_scales + b * vb // 2, dst, m0 * row_bytes + 4 * n0, row_bytes)
    m.trace_when(False)
    sme.smstop(m)


def _mopa_epilogue(
    m: Machine, sme2: bool, b: int, rows: int, lhs: Buffer, scale_off: int, dst: Buffer, dst_off: int, stride: int
) -> None:
    """After a block: per row i, S = s_L[i]·s_R (FMLALB/FMLALT from +0, zipped scales in z0/z1), the row of the
    four tiles converted (MOVA + SCVTF), dst row = S·a (FMUL, block 0) or fma(S, a, dst row) (reload + FMLA)."""
    sme.ld1(m, 1, 16, 4, lhs, scale_off)
    sme.pfalse(m, 3)
    traced = m.tracing
    for i in range(rows):
        if traced and i == 2:
            m.note(f"-- rows 2..{rows - 1}: the same sequence (not traced)")
        m.tracing = traced and i < 2
        sme.pnext(m, 3, 0, 2)
        sme.clastb(m, 19, 3, 16, 2)
        if sme2:
            sme.mova_tile_rows(m, 28, 4 * i)
            sme.scvtf_x4(m, 28)
        else:
            for t in range(4):
                sme.mova_tile_row(m, 28 + t, 4 * i + t)
            for t in range(4):
                sme.scvtf(m, 28 + t, 28 + t)
        for t, (src, top) in enumerate(((0, False), (1, False), (0, True), (1, True))):
            sme.movprfx(m, 8 + t, 18)
            (sme.fmlalt if top else sme.fmlalb)(m, 8 + t, 19, src)
        row_off = dst_off + i * stride
        if b == 0:
            for t in range(4):
                sme.fmul(m, 24 + t, 8 + t, 28 + t)
        else:
            sme.ld1_multi(m, 4, 24, 4, 9, dst, row_off)
            for t in range(4):
                sme.fmla(m, 24 + t, 0, 8 + t, 28 + t)
        sme.st1_multi(m, 4, 24, 4, 9, dst, row_off)


# --------------------------------------------------------------------------------------------- SME GEMV


def _sme_dot(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``…1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot`` (LUTI4 + SDOT into ZA VGx4) and ``…_sme_dot`` (SVE SDOT)."""
    sme2 = kern.tier == "sme2"
    vb = m.vb
    nr, nb = vb, k // BL
    rhs_stride = nr * nb * (BL // 2 + 2)
    common.sme_start(m, 2, 2, limits=20, lut=LUT_U4 if sme2 else None)
    sme.ptrue(m, 3, 2)
    sme.dup_imm(m, 28, 0.0, "<f4", "FMOV")
    if not sme2:
        sme.dup_imm(m, 31, -16, "<i1")
    lhs_scales = k
    for n0 in range(0, n, nr):
        group = (n0 // nr) * rhs_stride
        data, scales = group, group + rhs_stride - nr * nb * 2
        for t in range(4):
            sme.dup_imm(m, 24 + t, 0, "<i4")
        for b in range(nb):
            m.trace_when(n0 == 0 and b == 0)
            m.section(f"N block {n0}, K block {b}")
            if sme2:
                sme.zero_za(m)
            else:
                for t in range(4):
                    sme.dup_imm(m, 16 + t, 0, "<i4")
            for h in range(BL // 16):
                sme.ld1rq(m, 0, 2, lhs, b * BL + 16 * h)
                for half in range(2):
                    if sme2:
                        common.sme2_luti4_sdot(m, rhs, data, 2 * half)
                    else:
                        for r in range(4):
                            sme.ld1(m, 1, 12 + r, 2, rhs, data + r * vb)
                        for r in range(4):
                            sme.lsl_imm(m, 4 + 2 * r, 12 + r, 4)
                            sme.and_(m, 5 + 2 * r, 12 + r, 31)
                        for r in range(4):
                            sme.sdot_indexed(m, 16 + r, 4 + 2 * r, 0, 2 * half)
                        for r in range(4):
                            sme.sdot_indexed(m, 16 + r, 5 + 2 * r, 0, 2 * half + 1)
                    data += 4 * vb
            if sme2:
                sme.mova_vgx4(m, 16, 0)
                sme.scvtf_x4(m, 16)
            else:
                for t in range(4):
                    sme.scvtf(m, 16 + t, 16 + t)
            sme.ld1r(m, 2, 1, 2, lhs, lhs_scales + 2 * b)
            if sme2:
                sme.ld1_multi(m, 2, 4, 2, 8, rhs, scales + b * 2 * vb)
                sme.zip_x2(m, 2, 4, 5, 2)
            else:
                sme.ld1(m, 2, 4, 3, rhs, scales + b * 2 * vb)
                sme.ld1(m, 2, 5, 3, rhs, scales + b * 2 * vb + vb)
                sme.zip1(m, 2, 4, 5, 2)
                sme.zip2(m, 3, 4, 5, 2)
            for t, (src, top) in enumerate(((2, False), (3, False), (2, True), (3, True))):
                sme.movprfx(m, 4 + t, 28)
                (sme.fmlalt if top else sme.fmlalb)(m, 4 + t, 1, src)
            for t in range(4):
                sme.fmla(m, 24 + t, 2, 16 + t, 4 + t)
        m.trace_when(n0 == 0)
        if sme2:
            sme.fclamp_x4(m, 24, 20, 21)
            sme.whilelt_pn(m, 9, n0, n, 4, 4)
            sme.st1_multi(m, 4, 24, 4, 9, dst, 4 * n0)
        else:
            for t in range(4):
                sme.fmax(m, 24 + t, 2, 20)
            for t in range(4):
                sme.fmin(m, 24 + t, 2, 21)
            for t in range(4):
                sme.whilelt(m, 4, n0 + t * m.vl, n, 4)
                sme.st1(m, 4, 24 + t, 4, dst, 4 * n0 + t * vb)
    m.trace_when(False)
    sme.smstop(m)


# --------------------------------------------------------------------------------------------- NEON


def _neon_rhs_block(m: Machine, rhs: Buffer, block: int, mask: int) -> None:
    """Per block: the 4 fp16 RHS scales widened (LDR d + FCVTL → v0), then the 64 data bytes split into 16·w
    nibbles (low: K 0–15 → v5–v8, high: K 16–31 → v1–v4)."""
    neon.ldr(m, 8, 0, rhs, block)
    neon.fcvtl(m, 0, 0)
    common.neon_split_nibbles(m, rhs, block + 8, mask)


def _neon_lhs_scales(m: Machine, lhs: Buffer, off: int, mr: int) -> None:
    """The LHS block scales of a row group as float32 lanes in v9 (LDR d, or LD1R .8h for one row; FCVTL)."""
    if mr == 1:
        neon.ld1r(m, 2, 9, lhs, off)
    else:
        neon.ldr(m, 8, 9, lhs, off)
    neon.fcvtl(m, 9, 9)


def _neon_accumulate(m: Machine, acc: int, ints: int, s_tmp: int, row: int, mr: int) -> None:
    """One row's block result: SCVTF #4 (exact: undoes the ×16 of the nibbles), S = s_R·s_L[row] (FMUL),
    acc = fma(a, S, acc) (FMLA)."""
    neon.scvtf(m, ints, ints, 4)
    if mr == 1:
        neon.fmul(m, s_tmp, 0, 9)
    else:
        neon.fmul_elem(m, s_tmp, 0, 9, row)
    neon.fmla(m, acc, ints, s_tmp)


def _neon_blocks(
    m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, rhs: Buffer, dst: Buffer, mask: int,
    group: Callable[[int, int], None],
) -> None:  # fmt: skip
    """The loops of the GEMM / 4-row kernels: per K block the RHS scales and nibbles (0xF0 mask in v<mask>), then
    ``group(grp, lhs_block)`` per group of mr LHS rows; finally clamp and store."""
    mr, nb = kern.mr, k // BL
    lhs_stride, rhs_stride = mr * nb * (BL + 2), 4 * nb * (BL // 2 + 2)
    neon.movi(m, mask, 0xF0)

    def block(m0: int, rows: int, n0: int, b: int) -> None:
        _neon_rhs_block(m, rhs, (n0 // 4) * rhs_stride + b * 4 * (BL // 2 + 2), mask)
        for grp in range(-(-rows // mr)):
            group(grp, (m0 // mr + grp) * lhs_stride + b * mr * (BL + 2))

    def finish(m0: int, rows: int, n0: int) -> None:
        common.neon_store_rows(m, rows, n0, n, dst, m0)

    common.neon_block_tiles(m, mm, n, nb, mr, kern.m_step, block, finish)


def _neon_i8mm(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``…4x8_qsi4c32p4x8_{16x4,8x4x32}_neon_i8mm``: SMMLA 2×8·8×2 on rows (r, r+1) × columns (c, c+1).

    Per block and group of 4 LHS rows: 4 chunks of [row r 8 K | row r+1 8 K]; RHS segment s (s = 0, 1: qs bytes
    8s..8s+7) is [col 0 | col 1] and [col 2 | col 3]; chunk c pairs with segment c % 2, low nibbles for c < 2.
    UZP1/UZP2 .2d turn the [r0c0 r0c1 r1c0 r1c1] / [r0c2 r0c3 r1c2 r1c3] accumulators into rows."""
    mr = kern.mr

    def group(grp: int, lhs_block: int) -> None:
        ints = (10, 11, 12, 14)  # [rows 0,1 | rows 2,3] x [cols 0,1 | cols 2,3]
        for acc in ints:
            neon.movi(m, acc, 0)
        for c in range(4):
            nibbles = (5 if c < 2 else 1) + 2 * (c % 2)
            for pair in range(2):
                neon.ldr(m, 16, 15, lhs, lhs_block + 2 * mr + 32 * c + 16 * pair)
                neon.smmla(m, ints[2 * pair], 15, nibbles)
                neon.smmla(m, ints[2 * pair + 1], 15, nibbles + 1)
        _neon_lhs_scales(m, lhs, lhs_block, mr)
        for pair in range(2):
            left, right = ints[2 * pair], ints[2 * pair + 1]
            common.neon_uzp_rows(m, left, right, 15, right)
            row = mr * grp + 2 * pair
            _neon_accumulate(m, NEON_ACC + row, 15, left, 2 * pair, mr)
            _neon_accumulate(m, NEON_ACC + row + 1, right, left, 2 * pair + 1, mr)

    _neon_blocks(m, kern, mm, n, k, rhs, dst, 13, group)


def _neon_dotprod(
    m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer
) -> None:
    """``…4x4_qsi4c32p4x4_16x4_neon_dotprod`` and ``…1x4_qsi4c32p4x4_1x4_neon_dotprod`` (kr = 8: chunks of 4 K).

    RHS segment s (s = 0..3: qs bytes 4s..4s+3) is 4 columns × 4 bytes; SDOT by element (lane c += Σ_t
    w[4c+t]·x[4·idx+t]) takes the low nibbles of segment s with K chunk s and the high ones with chunk s + 4.
    With 4 rows a chunk register holds the 4 rows (idx = row); the GEMV loads 16 K per LDR q (idx = chunk)."""
    mr = kern.mr

    def group(grp: int, lhs_block: int) -> None:
        _neon_lhs_scales(m, lhs, lhs_block, mr)
        ints = list(range(11, 11 + mr))
        for acc in ints:
            neon.movi(m, acc, 0)
        if mr == 1:
            neon.ldr(m, 16, 10, lhs, lhs_block + 2)
            neon.ldr(m, 16, 14, lhs, lhs_block + 18)
            for c in range(8):
                neon.sdot_elem(m, 11, (5 if c < 4 else 1) + c % 4, (10, 14)[c // 4], c % 4)
        else:
            for c in range(8):
                neon.ldr(m, 16, 10, lhs, lhs_block + 2 * mr + 16 * c)
                for r in range(mr):
                    neon.sdot_elem(m, ints[r], (5 if c < 4 else 1) + c % 4, 10, r)
        for r in range(mr):
            _neon_accumulate(m, NEON_ACC + mr * grp + r, ints[r], 10, r, mr)

    _neon_blocks(m, kern, mm, n, k, rhs, dst, 15, group)


def _neon_dotprod_1x8(
    m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer
) -> None:
    """``…1x8_qsi4c32p4x8_1x4x32_neon_dotprod`` (kr = 16: chunks of 8 K): SDOT (vector) of [col c 8 bytes |
    col c+1 8 bytes] with the 8-byte LHS chunk replicated (LD1R .2d) gives lanes [c K0–3, c K4–7, c+1 K0–3,
    c+1 K4–7]; ADDP folds the halves into the four columns."""
    nb = k // BL
    rhs_stride = 4 * nb * (BL // 2 + 2)
    neon.movi(m, 15, 0xF0)
    for n0 in range(0, n, 4):
        neon.movi(m, NEON_ACC, 0)
        for b in range(nb):
            m.trace_when(n0 == 0 and b == 0)
            m.section(f"N block {n0}, K block {b}")
            lhs_block = b * (BL + 2)
            _neon_rhs_block(m, rhs, (n0 // 4) * rhs_stride + b * 4 * (BL // 2 + 2), 15)
            _neon_lhs_scales(m, lhs, lhs_block, 1)
            neon.movi(m, 11, 0)
            neon.movi(m, 12, 0)
            for c in range(4):
                neon.ld1r(m, 8, 10, lhs, lhs_block + 2 + 8 * c)
                nibbles = (5 if c < 2 else 1) + 2 * (c % 2)
                neon.sdot(m, 11, nibbles, 10)
                neon.sdot(m, 12, nibbles + 1, 10)
            neon.addp(m, 11, 11, 12, 4)
            _neon_accumulate(m, NEON_ACC, 11, 10, 0, 1)
        m.trace_when(n0 == 0)
        common.neon_store_rows(m, 1, n0, n, dst, 0)
    m.trace_when(False)


PROGRAMS = {
    "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa": _sme_mopa,
    "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot": _sme_dot,
    "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme_mopa": _sme_mopa,
    "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme_dot": _sme_dot,
    "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm": _neon_i8mm,
    "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_8x4x32_neon_i8mm": _neon_i8mm,
    "matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod": _neon_dotprod,
    "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod": _neon_dotprod,
    "matmul_clamp_f32_qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod": _neon_dotprod_1x8,
}
