"""Pieces the family programs share: the kernels' constant tables and argument block, and NEON loop steps
(nibble split of packed int4 bytes, SMMLA tile → rows, the clamp-and-store tail).

Register use of the NEON programs: v0 RHS per-column values (scales), v1–v8 RHS bytes / nibbles, v9 LHS
per-row values, v10–v15 integer accumulators, LHS chunks and scale products, v16–v31 the output
accumulators (one per row of up to 16 rows, 4 columns each); v1/v2 take the clamp limits at the end.
"""

from __future__ import annotations

import numpy as np

from kleidipy.emulator import neon
from kleidipy.emulator.machine import Buffer, Machine
from kleidipy.numerics import FLT_MAX

#: first V register of the per-row output accumulators.
NEON_ACC = 16
#: ZT0 table of the SME2 kernels for unsigned Q4 codes: entry i = i − 8 (int32; LUTI4 takes the low byte).
LUT_U4 = np.arange(-8, 8, dtype="<i4").view(np.uint8)
#: ZT0 table for two's-complement int4 nibbles: entry i = i for i < 8, i − 16 otherwise.
LUT_S4 = np.concatenate([np.arange(0, 8), np.arange(-8, 0)]).astype("<i4").view(np.uint8)


def clamp_args() -> Buffer:
    """The kernels' (scalar_min, scalar_max) argument block for the unclamped run: [−FLT_MAX, FLT_MAX]
    (clamping to a finite range is applied by :meth:`MatmulKernel.run` after the emulation)."""
    return Buffer("args", np.array([-FLT_MAX, FLT_MAX], dtype="<f4").view(np.uint8))


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
    args = clamp_args()
    neon.ld1r(m, 4, 1, args, 0)
    neon.ld1r(m, 4, 2, args, 4)
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
