"""Instruction programs of the ``qai8dxp × qsi8cxp`` family (llama.cpp's Q8_0 route) and of the per-channel
int4 family ``qai8dxp × qsi4cxp``, which shares its loops (:mod:`.qai8dxp_qsi4cxp` names them).

All kernels accumulate the whole K in int32 (SMOPA into ZA.S tiles, SDOT into ZA vector groups or Z/V
registers, SMMLA) and finish once per tile: acc += (−zp_L)·Σw_R (MLA), F = SCVTF(acc), S = scale_R·recip_L
(FMUL), then out = f32(F·S) + bias (FMUL, FADD: NEON and MOPA) or fma(S, F, bias) (FMLA into the bias: the SME
GEMVs). int4 weights: the NEON layout is read as 16·w with SHL #4 / AND #0xF0 (its sums and scales carry the
×16 / ÷16), the SME2 layout holds two's-complement nibbles that LUTI4 expands to int8.

Sources read: the SME1 MOPA and SME2 GEMV assembly of the int8 kernels (v1.2x). The SME2 MOPA (int8 and int4)
and the int4 SME2 GEMV follow them with SME2 multi-vector forms (LD1B/LD1W {…}, MOVA/SCVTF/FCLAMP ×4, LUTI4 with
the signed table for int4); the NEON programs follow the family's packed layouts with the Q4_0 NEON kernels'
instruction pattern.
"""

from __future__ import annotations

from kleidipy.core.matmul import MatmulKernel
from kleidipy.emulator import neon, sme
from kleidipy.emulator.common import (
    LUT_S4,
    NEON_ACC,
    neon_split_nibbles,
    neon_store_rows,
    neon_uzp_rows,
    sme2_luti4_sdot,
    sme_start,
)
from kleidipy.emulator.machine import Buffer, Machine
from kleidipy.kernels.qai8dxp_qsi8cxp.ukernels import k_internal


def _int4(kern: MatmulKernel) -> bool:
    return kern.family == "qai8dxp_qsi4cxp"


def _rhs_data_bytes(kern: MatmulKernel, k_int: int, nr: int) -> int:
    return nr * k_int // 2 if _int4(kern) else nr * k_int


# --------------------------------------------------------------------------------------------- SME


def sme_mopa(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme{,2}_mopa`` and ``qai8dxp1vlx8_qsi4cxp4vlx8_1vlx4vl_sme2_mopa``:
    per 4-value K chunk, one LHS vector (VL rows × 4) and four RHS vectors (4VL columns × 4) → 4 SMOPA."""
    sme2, int4 = kern.tier == "sme2", _int4(kern)
    vb, vl = m.vb, m.vl
    mr, nr, k_int = vl, 4 * vl, k_internal(k)
    lhs_stride = mr * (k_int + 8)
    data_bytes = _rhs_data_bytes(kern, k_int, nr)
    rhs_stride = data_bytes + 12 * nr
    row_bytes = 4 * n
    sme_start(m, 2, 1, limits=30, lut=LUT_S4 if int4 else None)
    for m0 in range(0, mm, mr):
        sme.whilelt(m, 0, m0, mm, 4)
        lhs_group = (m0 // mr) * lhs_stride
        rows = min(mm - m0, vl)
        for n0 in range(0, n, nr):
            m.trace_when(m0 == 0 and n0 == 0)
            m.section(f"M block {m0}, N block {n0}: K loop (first 8 K-chunks traced)")
            rhs_group = (n0 // nr) * rhs_stride
            sme.zero_za(m)
            for c in range(k_int // 4):
                m.trace_when(m0 == 0 and n0 == 0 and c < 8)
                sme.ld1(m, 4, 4, 0, lhs, lhs_group + c * vb)
                if int4:
                    sme.ld1_multi(m, 1, 0, 2, 8, rhs, rhs_group + c * 2 * vb)
                    sme.luti4_x2(m, 8, 0)
                    sme.luti4_x2(m, 10, 1)
                elif sme2:
                    sme.ld1_multi(m, 1, 8, 4, 8, rhs, rhs_group + c * 4 * vb)
                else:
                    for t in range(4):
                        sme.ld1(m, 2, 8 + t, 2, rhs, rhs_group + c * 4 * vb + t * vb)
                for t in range(4):
                    sme.smopa4(m, t, 2, 2, 4, 8 + t)
            m.trace_when(m0 == 0 and n0 == 0)
            params = rhs_group + data_bytes
            if sme2:
                sme.whilelt_pn(m, 9, n0, n, 4, 4)
                for j, first in enumerate((0, 4, 8)):  # row sums, scales, biases
                    sme.ld1_multi(m, 4, first, 4, 9, rhs, params + j * 4 * vb)
            else:
                for t in range(4):
                    sme.whilelt(m, 4 + t, n0 + t * vl, n, 4)
                for j in range(3):
                    for t in range(4):
                        sme.ld1(m, 4, 4 * j + t, 4 + t, rhs, params + j * 4 * vb + t * vb)
            offsets, recips = lhs_group + mr * k_int, lhs_group + mr * k_int + 4 * mr
            for i in range(rows):
                m.trace_when(m0 == 0 and n0 == 0 and i < 2)
                sme.ld1r(m, 4, 16, 2, lhs, offsets + 4 * i)
                sme.ld1r(m, 4, 17, 2, lhs, recips + 4 * i)
                if sme2:
                    sme.mova_tile_rows(m, 12, 4 * i)
                else:
                    for t in range(4):
                        sme.mova_tile_row(m, 12 + t, 4 * i + t)
                for t in range(4):
                    sme.fmul(m, 20 + t, 17, 4 + t)
                for t in range(4):
                    sme.mla(m, 12 + t, 2, 16, t)
                if sme2:
                    sme.scvtf_x4(m, 12)
                else:
                    for t in range(4):
                        sme.scvtf(m, 12 + t, 12 + t)
                for t in range(4):
                    sme.fmul(m, 24 + t, 20 + t, 12 + t)
                for t in range(4):
                    sme.fadd(m, 24 + t, 2, 8 + t)
                row_off = (m0 + i) * row_bytes + 4 * n0
                if sme2:
                    sme.fclamp_x4(m, 24, 30, 31)
                    sme.st1_multi(m, 4, 24, 4, 9, dst, row_off)
                else:
                    for t in range(4):
                        sme.fmax(m, 24 + t, 2, 30)
                        sme.fmin(m, 24 + t, 2, 31)
                    for t in range(4):
                        sme.st1(m, 4, 24 + t, 4 + t, dst, row_off + t * vb)
    m.trace_when(False)
    sme.smstop(m)


def sme_dot(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme{,2}_dot`` and ``qai8dxp1x4_qsi4cxp4vlx4_1x4vl_sme2_sdot`` (m = 1):
    per 16 K, the LHS bytes replicated per 128 bits (LD1RQB) and four K chunks of 4VL columns; SME2: SDOT into
    the ZA vector group, SME1: SVE SDOT (indexed) into z16–z19. Epilogue: MLA, SCVTF, FMUL, FMLA into the bias."""
    sme2, int4 = kern.tier == "sme2", _int4(kern)
    vb, vl = m.vb, m.vl
    nr, k_int = 4 * vl, k_internal(k)
    data_bytes = _rhs_data_bytes(kern, k_int, nr)
    rhs_stride = data_bytes + 12 * nr
    sme_start(m, 0, 1, limits=30, lut=LUT_S4 if int4 else None)
    for n0 in range(0, n, nr):
        rhs_group = (n0 // nr) * rhs_stride
        if sme2:
            sme.zero_za(m)
        else:
            for t in range(4):
                sme.dup_imm(m, 16 + t, 0, "<i4")
        for k0 in range(0, k_int, 16):
            m.trace_when(n0 == 0 and k0 < 32)
            if k0 == 0:
                m.section(f"N block {n0}: K loop (first 32 K traced)")
            sme.ld1rq(m, 0, 0, lhs, k0)
            chunk0 = rhs_group + (k0 // 4) * (2 if int4 else 4) * vb
            if int4:
                for half in range(2):
                    sme2_luti4_sdot(m, rhs, chunk0 + half * 4 * vb, 2 * half, esize=1, values=16)
            elif sme2:
                for c in range(4):
                    regs = (16, 20)[c % 2]
                    sme.ld1_multi(m, 1, regs, 4, 8, rhs, chunk0 + c * 4 * vb)
                    sme.sdot_za_vgx4(m, 0, regs, 0, c)
            else:
                for c in range(4):
                    for t in range(4):
                        sme.ld1(m, 1, 4 + t, 0, rhs, chunk0 + c * 4 * vb + t * vb)
                    for t in range(4):
                        sme.sdot_indexed(m, 16 + t, 4 + t, 0, c)
        m.trace_when(n0 == 0)
        sme.ld1r(m, 4, 2, 0, lhs, k_int)
        sme.ld1r(m, 4, 3, 0, lhs, k_int + 4)
        sme.whilelt_pn(m, 9, n0, n, 4, 4)
        params = rhs_group + data_bytes
        for j, first in enumerate((20, 24, 12)):  # row sums, scales, biases
            if sme2:
                sme.ld1_multi(m, 4, first, 4, 9, rhs, params + j * 4 * vb)
            else:
                for t in range(4):
                    sme.whilelt(m, 4, n0 + t * vl, n, 4)
                    sme.ld1(m, 4, first + t, 4, rhs, params + j * 4 * vb + t * vb)
        ints = 4 if sme2 else 16  # the int32 sums: moved out of ZA (SME2) or the SDOT accumulators (SME1)
        if sme2:
            sme.mova_vgx4(m, 4, 0)
        for t in range(4):
            sme.mla(m, ints + t, 0, 20 + t, 2)
        if sme2:
            sme.scvtf_x4(m, 4)
        else:
            for t in range(4):
                sme.scvtf(m, 16 + t, 16 + t)
        for t in range(4):
            sme.fmul(m, 24 + t, 24 + t, 3)
        for t in range(4):
            sme.fmla(m, 12 + t, 0, 24 + t, ints + t)
        if sme2:
            sme.fclamp_x4(m, 12, 30, 31)
            sme.st1_multi(m, 4, 12, 4, 9, dst, 4 * n0)
        else:
            for t in range(4):
                sme.fmax(m, 12 + t, 0, 30)
                sme.fmin(m, 12 + t, 0, 31)
            for t in range(4):
                sme.whilelt(m, 4, n0 + t * vl, n, 4)
                sme.st1(m, 4, 12 + t, 4, dst, 4 * n0 + t * vb)
    m.trace_when(False)
    sme.smstop(m)


# --------------------------------------------------------------------------------------------- NEON


def _neon_epilogue(m: Machine, ints: list[int], lhs: Buffer, lhs_group: int, rhs: Buffer, params: int, rows: int,
                   row0: int, mr: int, k_int: int) -> None:  # fmt: skip
    """Per row: acc += sums·(−zp) (MLA by element), F = SCVTF, S = scales·recip (FMUL by element),
    out = F·S (FMUL) + bias (FADD) into the row's output register. ``ints`` holds each row's int32 accumulator."""
    neon.ldr(m, 16, 0, rhs, params)  # row sums
    neon.ldr(m, 16, 1, rhs, params + 16)  # scales
    neon.ldr(m, 16, 2, rhs, params + 32)  # biases
    if mr == 1:
        neon.ld1r(m, 4, 9, lhs, lhs_group + k_int)
        neon.ld1r(m, 4, 3, lhs, lhs_group + k_int + 4)
    else:
        neon.ldr(m, 16, 9, lhs, lhs_group + mr * k_int)
        neon.ldr(m, 16, 3, lhs, lhs_group + mr * k_int + 4 * mr)
    for r in range(rows):
        acc, lane = ints[r], r % mr
        neon.mla_elem(m, acc, 0, 9, lane)
        neon.scvtf(m, acc, acc)
        neon.fmul_elem(m, 12, 1, 3, lane)
        neon.fmul(m, acc, acc, 12)
        neon.fadd(m, NEON_ACC + row0 + r, acc, 2)


def _neon_rhs_chunk(m: Machine, rhs: Buffer, rhs_group: int, k0: int, int4: bool) -> list[tuple[int, int]]:
    """The RHS bytes of one K step of the kr = 8 / 16 layouts, as (first register of [col c | col c+1] pairs, the
    K offset it pairs with): int8, 8 K of the 4 columns (2 × LDR q → v5, v6); int4, 32 K split into 16·w nibbles
    (v5–v8 low, v1–v4 high; the 0xF0 mask in v13) in 4 chunks of 8 K."""
    if int4:
        neon_split_nibbles(m, rhs, rhs_group + k0 * 2, 13)
        return [((5 if c < 2 else 1) + 2 * (c % 2), k0 + 8 * c) for c in range(4)]
    neon.ldr(m, 16, 5, rhs, rhs_group + k0 * 4)
    neon.ldr(m, 16, 6, rhs, rhs_group + k0 * 4 + 16)
    return [(5, k0)]


def neon_i8mm(m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer) -> None:
    """``qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm`` and ``qai8dxp4x8_qsi4cxp4x8_{4x4,8x4}x32_neon_i8mm``: SMMLA of
    [row r 8 K | row r+1 8 K] × [col c 8 K | col c+1 8 K] into 4 tiles per group of 4 rows, the whole K, then
    UZP1/UZP2 .2d to rows and the per-channel epilogue."""
    int4 = _int4(kern)
    mr, k_int, rows_step = 4, k_internal(k), kern.m_step
    lhs_stride = mr * (k_int + 8)
    data_bytes = _rhs_data_bytes(kern, k_int, 4)
    rhs_stride = data_bytes + 48
    if int4:
        neon.movi(m, 13, 0xF0)
    for m0 in range(0, mm, rows_step):
        rows = min(rows_step, mm - m0)
        groups = -(-rows // mr)
        for n0 in range(0, n, 4):
            rhs_group = (n0 // 4) * rhs_stride
            tiles = [NEON_ACC + r for r in range(4 * groups)]
            for reg in tiles:
                neon.movi(m, reg, 0)
            for k0 in range(0, k_int, 32 if int4 else 8):
                m.trace_when(m0 == 0 and n0 == 0 and k0 < 32)
                if k0 == 0:
                    m.section(f"M block {m0}, N block {n0}: K loop (first 32 K traced)")
                pairs = _neon_rhs_chunk(m, rhs, rhs_group, k0, int4)
                for grp in range(groups):
                    for cols, kc in pairs:
                        for pair in range(2):
                            neon.ldr(m, 16, 14, lhs, (m0 // mr + grp) * lhs_stride + kc * mr + 16 * pair)
                            neon.smmla(m, tiles[4 * grp + 2 * pair], 14, cols)
                            neon.smmla(m, tiles[4 * grp + 2 * pair + 1], 14, cols + 1)
            m.trace_when(m0 == 0 and n0 == 0)
            for grp in range(groups):
                for pair, temps in enumerate(((10, 11), (14, 15))):
                    neon_uzp_rows(m, tiles[4 * grp + 2 * pair], tiles[4 * grp + 2 * pair + 1], *temps)
                _neon_epilogue(
                    m, [10, 11, 14, 15], lhs, (m0 // mr + grp) * lhs_stride, rhs, rhs_group + data_bytes,
                    min(mr, rows - mr * grp), mr * grp, mr, k_int,
                )  # fmt: skip
            neon_store_rows(m, rows, n0, n, dst, m0)
    m.trace_when(False)


def _neon_dotprod(
    m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer
) -> None:
    """``qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod`` and ``qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod`` (kr = 4): per
    4-value K chunk, 4 columns × 4 bytes; SDOT by element into one int32 accumulator per row (4 rows: the
    chunk register holds the rows, idx = row; 1 row: 16 K per LDR q, idx = chunk)."""
    mr, k_int, rows_step = kern.mr, k_internal(k), kern.m_step
    lhs_stride = mr * (k_int + 8)
    rhs_stride = 4 * k_int + 48
    for m0 in range(0, mm, rows_step):
        rows = min(rows_step, mm - m0)
        groups = -(-rows // mr)
        for n0 in range(0, n, 4):
            rhs_group = (n0 // 4) * rhs_stride
            ints = [NEON_ACC + r for r in range(groups * mr)]
            for reg in ints:
                neon.movi(m, reg, 0)
            for c in range(k_int // 4):
                m.trace_when(m0 == 0 and n0 == 0 and c < 8)
                if c == 0:
                    m.section(f"M block {m0}, N block {n0}: K loop (first 32 K traced)")
                neon.ldr(m, 16, 5, rhs, rhs_group + 16 * c)
                for grp in range(groups):
                    lhs_group = (m0 // mr + grp) * lhs_stride
                    if mr == 1:
                        if c % 4 == 0:
                            neon.ldr(m, 16, 14, lhs, lhs_group + 4 * c)
                        neon.sdot_elem(m, ints[0], 5, 14, c % 4)
                    else:
                        neon.ldr(m, 16, 14, lhs, lhs_group + 16 * c)
                        for r in range(mr):
                            neon.sdot_elem(m, ints[mr * grp + r], 5, 14, r)
            m.trace_when(m0 == 0 and n0 == 0)
            for grp in range(groups):
                _neon_epilogue(
                    m, ints[mr * grp : mr * grp + mr], lhs, (m0 // mr + grp) * lhs_stride, rhs, rhs_group + 4 * k_int,
                    min(mr, rows - mr * grp), mr * grp, mr, k_int,
                )  # fmt: skip
            neon_store_rows(m, rows, n0, n, dst, m0)
    m.trace_when(False)


def neon_dotprod_1x8(
    m: Machine, kern: MatmulKernel, mm: int, n: int, k: int, lhs: Buffer, rhs: Buffer, dst: Buffer
) -> None:
    """``qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod`` (kr = 8) and ``qai8dxp1x8_qsi4cxp4x8_1x4x32_neon_dotprod``
    (kr = 16, int4): SDOT (vector) of [col c 8 K | col c+1 8 K] with the 8 LHS bytes replicated (LD1R .2d) into
    two accumulators, folded into the four columns by ADDP after the K loop."""
    int4 = _int4(kern)
    k_int = k_internal(k)
    data_bytes = _rhs_data_bytes(kern, k_int, 4)
    rhs_stride = data_bytes + 48
    if int4:
        neon.movi(m, 13, 0xF0)
    for n0 in range(0, n, 4):
        rhs_group = (n0 // 4) * rhs_stride
        neon.movi(m, 10, 0)
        neon.movi(m, 11, 0)
        for k0 in range(0, k_int, 32 if int4 else 8):
            m.trace_when(n0 == 0 and k0 < 32)
            if k0 == 0:
                m.section(f"N block {n0}: K loop (first 32 K traced)")
            pairs = _neon_rhs_chunk(m, rhs, rhs_group, k0, int4)
            for cols, kc in pairs:
                neon.ld1r(m, 8, 14, lhs, kc)
                neon.sdot(m, 10, cols, 14)
                neon.sdot(m, 11, cols + 1, 14)
        m.trace_when(n0 == 0)
        neon.addp(m, NEON_ACC, 10, 11, 4)
        _neon_epilogue(m, [NEON_ACC], lhs, 0, rhs, rhs_group + data_bytes, 1, 0, 1, k_int)
        neon_store_rows(m, 1, n0, n, dst, 0)
    m.trace_when(False)


PROGRAMS = {
    "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa": sme_mopa,
    "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot": sme_dot,
    "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa": sme_mopa,
    "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot": sme_dot,
    "matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm": neon_i8mm,
    "matmul_clamp_f32_qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod": neon_dotprod_1x8,
    "matmul_clamp_f32_qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod": _neon_dotprod,
    "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod": _neon_dotprod,
}
