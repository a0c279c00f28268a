"""Pieces the family programs share: the kernels' constant tables and argument block, the SME set-up and the
SME2 LUTI4 steps of the 4-bit kernels, the output tile loop, and NEON loop steps (the K-block loop nest of the
blocked 4-bit kernels, nibble split of packed int4 bytes, SMMLA tile → rows, the clamp-and-store tail).

Register use of the NEON programs: v0 RHS per-column values (scales), v1–v8 RHS bytes / nibbles, v9 LHS
per-row values, v10–v15 integer accumulators, LHS chunks and scale products, v16–v31 the output
accumulators (one per row of up to 16 rows, 4 columns each); v1/v2 take the clamp limits at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from kleidipy.core.numerics import FLT_MAX
from kleidipy.emulator import neon, sme
from kleidipy.emulator.machine import Buffer, Machine

#: first V register of the per-row output accumulators.
NEON_ACC = 16
#: ZT0 table of the SME2 kernels for unsigned Q4 codes: entry i = i − 8 (int32; LUTI4 takes the low byte).
LUT_U4 = np.arange(-8, 8, dtype="<i4").view(np.uint8)
#: ZT0 table for two's-complement int4 nibbles: entry i = i for i < 8, i − 16 otherwise.
LUT_S4 = np.concatenate([np.arange(0, 8), np.arange(-8, 0)]).astype("<i4").view(np.uint8)
#: ZT0 of the F16 4-bit kernels: entry u holds the F16 bits of u − 8 in its low halfword (LUTI4 .H reads those)
LUT_F16 = np.arange(-8, 8).astype("<f2").view("<u2").astype("<u4").view(np.uint8)


def clamp_args() -> Buffer:
    """The kernels' (scalar_min, scalar_max) argument block for the unclamped run: [−FLT_MAX, FLT_MAX]
    (clamping to a finite range is applied by :meth:`MatmulKernel.run` after the emulation)."""
    return Buffer("args", np.array([-FLT_MAX, FLT_MAX], dtype="<f4").view(np.uint8))


def neon_limits(m: Machine, first: int) -> None:
    """The clamp limits (LD1R .4s from the argument block): min into v<first>, max into v<first + 1>."""
    args = clamp_args()
    neon.ld1r(m, 4, first, args, 0)
    neon.ld1r(m, 4, first + 1, args, 4)


def sme_start(m: Machine, pg: int, pn_esize: int, limits: int | None = None, lut: np.ndarray | None = None) -> None:
    """SMSTART, PTRUE p<pg>.B, PTRUE pn8 (``pn_esize``-byte elements); then optionally the clamp limits (LD1RW
    from the argument block under p<pg>: min into z<limits>, max into z<limits + 1>) and the ZT0 table."""
    sme.smstart(m)
    sme.ptrue(m, pg, 1)
    sme.ptrue_pn(m, 8, pn_esize)
    if limits is not None:
        args = clamp_args()
        sme.ld1r(m, 4, limits, pg, args, 0)
        sme.ld1r(m, 4, limits + 1, pg, args, 4)
    if lut is not None:
        sme.ldr_zt0(m, Buffer("lut", lut), 0)


def sme2_luti4_smopa(m: Machine, rhs: Buffer, rhs_off: int, lhs: Buffer, lhs_off: int, lhs_esize: int) -> None:
    """One K-quad of the SME2 4-bit MOPA kernels: the 4VL columns' codes (LD1H {z2, z3}), the VL rows × 4 int8 of
    the LHS (LD1H or LD1W z8), LUTI4 of the codes to int8 in z4–z7 and one SMOPA per ZA.S tile."""
    sme.ld1_multi(m, 4, 2, 2, 8, rhs, rhs_off)
    sme.ld1(m, lhs_esize, 8, 0, lhs, lhs_off)
    sme.luti4_x2(m, 4, 2)
    sme.luti4_x2(m, 6, 3)
    for t in range(4):
        sme.smopa4(m, t, 0, 0, 8, 4 + t)


def sme2_luti4_sdot(
    m: Machine, rhs: Buffer, rhs_off: int, index: int, esize: int = 2, codes: int = 12, values: int = 4
) -> None:
    """Two K chunks of the SME2 4-bit GEMVs: 4 vectors of codes (LD1B/LD1H z<codes>..+3), LUTI4 to int8 in
    z<values>..+7 and two SDOT into ZA VGx4 slice 0 with the LHS quads ``index``, ``index + 1`` of z0."""
    sme.ld1_multi(m, esize, codes, 4, 8, rhs, rhs_off)
    for r in range(4):
        sme.luti4_x2(m, values + 2 * r, codes + r)
    sme.sdot_za_vgx4(m, 0, values, 0, index)
    sme.sdot_za_vgx4(m, 0, values + 4, 0, index + 1)


def output_tiles(m: Machine, mm: int, mr: int, n: int, nr: int, what: str) -> Iterator[tuple[int, int, int]]:
    """(m0, rows, n0) of every mr × nr output tile, M blocks outer; the first tile is traced, under a section
    "M block …, N block …: ``what``". Tracing stops after the last tile."""
    for m0 in range(0, mm, mr):
        rows = min(mr, mm - m0)
        for n0 in range(0, n, nr):
            m.trace_when(m0 == 0 and n0 == 0)
            m.section(f"M block {m0}, N block {n0}: {what}")
            yield m0, rows, n0
    m.trace_when(False)


def neon_block_tiles(
    m: Machine,
    mm: int,
    n: int,
    nb: int,
    mr: int,
    rows_step: int,
    block: Callable[[int, int, int, int], None],
    finish: Callable[[int, int, int], None],
    cols: int = 4,
) -> None:
    """The loop nest of the blocked NEON kernels: per M block of ``rows_step`` rows (groups of mr) and N block of
    ``cols`` columns, the row accumulators v16.. (cols/4 per row) are zeroed (MOVI), ``block(m0, rows, n0, b)``
    emits each K block (the first block of the first tile traced), then ``finish(m0, rows, n0)`` the tail (traced
    for the first tile)."""
    for m0 in range(0, mm, rows_step):
        rows = min(rows_step, mm - m0)
        for n0 in range(0, n, cols):
            for r in range(-(-rows // mr) * mr * (cols // 4)):
                neon.movi(m, NEON_ACC + r, 0)
            for b in range(nb):
                m.trace_when(m0 == 0 and n0 == 0 and b == 0)
                m.section(f"M block {m0}, N block {n0}, K block {b}")
                block(m0, rows, n0, b)
            m.trace_when(m0 == 0 and n0 == 0)
            finish(m0, rows, n0)
    m.trace_when(False)


def neon_split_nibbles(m: Machine, rhs: Buffer, off: int, mask: int) -> None:
    """64 RHS bytes (4 × LDR q → v1–v4) split into 16·w int8 values: SHL #4 → v5–v8 (low nibbles),
    AND with the 0xF0 mask register → v1–v4 in place (high nibbles)."""
    for q in range(4):
        neon.ldr(m, 16, 1 + q, rhs, off + 16 * q)
    for q in range(4):
        neon.shl(m, 5 + q, 1 + q, 4)
        neon.and_(m, 1 + q, 1 + q, mask)


def neon_uzp_rows(m: Machine, left: int, right: int, row0: int, row1: int) -> None:
    """SMMLA / BFMMLA tiles [r0c0 r0c1 r1c0 r1c1] (left: columns 0, 1) and [r0c2 r0c3 r1c2 r1c3] (right) to rows:
    UZP1 .2d → row0, UZP2 .2d → row1."""
    neon.uzp(m, 1, row0, left, right, 8)
    neon.uzp(m, 2, row1, left, right, 8)


def neon_store_rows(m: Machine, rows: int, n0: int, n: int, dst: Buffer, m0: int, cols: int = 4) -> None:
    """FMAX/FMIN of the accumulators v16.. with the run's limits (LD1R from the argument block), then the row
    stores: STR q, or ST1 d/s lanes for a column tail."""
    neon_limits(m, 1)
    vecs = -(-cols // 4)
    regs = [NEON_ACC + r * vecs + v for r in range(rows) for v in range(vecs)]
    for reg in regs:
        neon.fmax(m, reg, reg, 1)
    for reg in regs:
        neon.fmin(m, reg, reg, 2)
    for r in range(rows):
        for v in range(vecs):
            lanes = min(4, n - n0 - 4 * v)
            if lanes > 0:
                neon.store(m, NEON_ACC + r * vecs + v, lanes, 4, dst, ((m0 + r) * n + n0 + 4 * v) * 4)
