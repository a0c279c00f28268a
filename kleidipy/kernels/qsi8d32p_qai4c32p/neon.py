"""The Q4_1 NEON kernels (dotprod / i8mm: LHS ``lhs_quant_pack_qsi8d32pscalef32_f32_neon``, RHS
``rhs_pack_nxk_qai4c32p_qau4c32s0s1_f32_f32_f32_neon`` with nr = 4, kr 8 or 16) as native aarch64 tiles: ``sdot``
(DotProd) and ``smmla`` (I8MM), the instruction sequence of KleidiAI's own kernels, with their arithmetic (the
recipe of :mod:`kleidipy.kernels.qsi8d32p_qai4c32p.ukernels`: the bits of ``jit.matmul_neon``).

How (as KleidiAI's ``matmul_clamp_f32_qsi8d32p*_qai4c32p4x*_neon_*`` kernels): per group of mr rows and group of
4 columns, block after block, the packed RHS bytes are split into low nibbles ``shl #4`` and high nibbles
``and #0xf0`` (16·(u − 8), the scale is stored /16), multiplied into int32 lanes by ``sdot`` (kr 8: 4 columns ×
4 bytes, the LHS word of each row broadcast; kr 16: 2 columns × 8 bytes, the LHS doubleword broadcast, lanes
paired by ``addp``) or ``smmla`` (kr 16, pairs of rows × pairs of columns × 8 bytes, rows split by ``uzp1/2``),
converted ``scvtf`` (exact), and accumulated from +0: ``fmla`` of the zeros by the row sum, then ``fmla`` of the dot
by ``fmul(scale, recip)``; at the end the bias is added (``fadd``), unclamped.

:func:`tile_module` builds a tile's LLVM module for a :class:`~kleidipy.core.native.NativeIsa` (``kleidipy
kernels --asm`` cross-compiles it on any host, through :func:`kernel_tile`); on an aarch64 host with DotProd the
four tiles are compiled at import for the host's own features (``smmla`` with I8MM) and :func:`compute`
(``ukernels.NEON_COMPUTE`` there) runs them. Hand-written LLVM IR for the reason of :mod:`kleidipy.core.native`:
numba's code never uses these instructions.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils

from kleidipy.core import native, neon_ir
from kleidipy.core.neon_ir import F32, I32, I64, SDOT, SMMLA, V2I64, V4F32, V4I32, V16I8
from kleidipy.kernels.qsi8d32p_qai4c32p import jit as _jit

BL = _jit.BL
#: columns of a group of the NEON RHS layout (and of a tile)
NR = 4
#: bytes of one block of a packed RHS group: 4 columns × 16 bytes of codes, 4 f32 zeros, 4 f32 scales
RHS_BLOCK = NR * _jit.RHS_BLOCK_BYTES
#: bytes of one row of one block of a packed LHS group: 32 int8 (then, per group, mr f32 row sums and mr recips)
LHS_BLOCK = _jit.LHS_BLOCK_BYTES
#: the (mr, kr) of the family's NEON kernels: a tile each
SHAPES = ((1, 8), (1, 16), (4, 8), (4, 16))


def symbol(mr: int, kr: int) -> str:
    """The LLVM name of the tile for mr rows per LHS group and kr."""
    return f"kleidipy_q4_1_neon_mr{mr}_kr{kr}"


def instruction(mr: int, kr: int, isa: native.NativeIsa) -> str:
    """The int8 dot-product instruction the tile uses on ``isa``: ``smmla`` (kr 16, pairs of rows, I8MM) or ``sdot``."""
    return "smmla" if kr == 16 and mr % 2 == 0 and isa.has("+i8mm") else "sdot"


def _block_dots(b: ir.IRBuilder, mr: int, kr: int, op: str, lb: ir.Value, segs: list) -> list:
    """The int32 dots of one block (16·(u − 8) by q), a <4 x i32> of the 4 columns per row: ``lb`` the block's
    packed LHS (mr × 32 int8 in chunks of kr/2 per row), ``segs`` the RHS codes (``(lo, hi)`` nibbles per 16 bytes:
    kr 8, 4 columns × 4 bytes; kr 16, 2 columns × 8 bytes, columns 0-1 then 2-3)."""
    zero = ir.Constant(V4I32, None)
    kbl = kr // 2  # LHS bytes per row per chunk (sr = 2)
    lhs_data = [neon_ir.load(b, lb, 16 * v, V16I8) for v in range(2 * mr)] if kbl == 4 or op == "smmla" else []

    def chunk(c: int, r: int) -> ir.Value:  # chunk c of row r in every lane
        if kbl == 8:  # loaded broadcast (ld1r): no indexed sdot for doublewords
            one = b.insert_element(ir.Constant(V2I64, ir.Undefined), neon_ir.load(b, lb, 8 * (c * mr + r), I64), I32(0))
            return b.bitcast(neon_ir.lane(b, one, V2I64, 0), V16I8)
        word = c * mr + r
        return b.bitcast(neon_ir.lane(b, lhs_data[word // 4], V4I32, word % 4), V16I8)

    if op == "smmla":  # rows (2p, 2p+1) of chunk c are one vector; segments 2o + h: lo ↔ chunk o, hi ↔ chunk o + 2
        smmla = SMMLA
        rows = []
        for p in range(mr // 2):
            acc = []
            for h in range(2):  # columns (2h, 2h+1)
                a = zero
                for c in range(4):
                    a = neon_ir.call(b, smmla, V4I32, [a, lhs_data[c * mr // 2 + p], segs[2 * (c % 2) + h][c // 2]])
                acc.append(a)
            pairs = [b.bitcast(a, V2I64) for a in acc]
            for half in range(2):  # uzp1 / uzp2: row 2p + half
                rows.append(
                    b.bitcast(b.shuffle_vector(*pairs, neon_ir.vec(ir.VectorType(I32, 2), [half, 2 + half])), V4I32)
                )
        return rows
    rows = []
    for r in range(mr):
        if kbl == 4:  # segment o: 4 columns × 4 bytes; lo ↔ chunk o, hi ↔ chunk o + 4
            a = zero
            for c in range(8):
                a = neon_ir.call(b, SDOT, V4I32, [a, segs[c % 4][c // 4], chunk(c, r)])
            rows.append(a)
        else:  # segments 2o + h: columns (2h, 2h+1) × 8 bytes; lo ↔ chunk o, hi ↔ chunk o + 2
            pair = []
            for h in range(2):
                a = zero
                for c in range(4):
                    a = neon_ir.call(b, SDOT, V4I32, [a, segs[2 * (c % 2) + h][c // 2], chunk(c, r)])
                pair.append(a)
            rows.append(neon_ir.call(b, "llvm.aarch64.neon.addp.v4i32", V4I32, pair))
    return rows


def tile_module(mr: int, kr: int, isa: native.NativeIsa) -> ir.Module:
    """The LLVM module of the tile ``void symbol(mr, kr)(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float* out)``:
    out [m, n] (rows of n floats) = the packed LHS (m rows, groups of mr) × the packed RHS (n columns, groups of 4),
    nb blocks of 32 values each, plus the bias, unclamped."""
    module, b, (m, n, nb, lhs, rhs, out) = neon_ir.tile_function(symbol(mr, kr), isa)
    op = instruction(mr, kr, isa)
    lstride = b.mul(nb, I64(mr * LHS_BLOCK))
    rstride = b.add(b.mul(nb, I64(RHS_BLOCK)), I64(4 * NR))
    accs = [cgutils.alloca_once(b, V4F32) for _ in range(mr)]
    fields = ir.VectorType(F32, mr)
    with neon_ir.group_pairs(b, m, n, mr, lhs, rhs, (lstride, rstride), accs) as (gi, gj, lhs0, rhs0):
        with cgutils.for_range(b, nb, intp=I64) as blk:
            rb = b.gep(rhs0, [b.mul(blk.index, I64(RHS_BLOCK))])
            lb = b.gep(lhs0, [b.mul(blk.index, I64(mr * LHS_BLOCK))])
            dots = _block_dots(b, mr, kr, op, lb, neon_ir.nibble_codes(b, rb, 0))
            zero = neon_ir.load(b, rb, 16 * NR, V4F32)
            scale = neon_ir.load(b, rb, 20 * NR, V4F32)
            row_sum = neon_ir.load(b, lb, BL * mr, fields)
            recip = neon_ir.load(b, lb, (BL + 4) * mr, fields)
            undef = ir.Constant(fields, ir.Undefined)
            for r in range(mr):
                pick = neon_ir.vec(V4I32, [r] * 4)
                acc = neon_ir.call(
                    b, "llvm.fma.v4f32", V4F32, [zero, b.shuffle_vector(row_sum, undef, pick), b.load(accs[r])]
                )
                s = b.fmul(scale, b.shuffle_vector(recip, undef, pick))
                b.store(neon_ir.call(b, "llvm.fma.v4f32", V4F32, [b.sitofp(dots[r], V4F32), s, acc]), accs[r])
        bias = neon_ir.load(b, rhs0, b.mul(nb, I64(RHS_BLOCK)), V4F32)
        col0 = b.mul(gj, I64(NR))
        for r in range(mr):
            row = b.add(b.mul(gi, I64(mr)), I64(r))
            neon_ir.store_row(b, out, m, n, row, col0, b.fadd(b.load(accs[r]), bias))
    b.ret_void()
    return module


#: ``kernel_tile`` (the tile module of one of the family's NEON kernels for an aarch64 ISA, None for the SME2 kernels
#: or x86); the native ISA of this host's tiles (None: no DotProd, or not aarch64 — :func:`compute` is not
#: available); the tiles' caller
kernel_tile, HOST_ISA, _TILES = neon_ir.neon_tiles(tile_module, symbol, SHAPES, lambda kernel: (kernel.mr, kernel.kr))
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def compute(  # pragma: no cover - compiled (aarch64 with DotProd)
    m: int, n: int, k: int, mr: int, nr: int, kbl: int, lhs: np.ndarray, rhs: np.ndarray
) -> np.ndarray:
    """Unclamped float32 [m, n] of the NEON kernels on the native tiles (the signature and bits of
    ``jit.matmul_neon``; mr 1 or 4, nr 4, kbl = kr/sr 4 or 8)."""
    out = np.empty((m, n), np.float32)
    _TILES((mr, 2 * kbl), (m, n, k // BL), lhs, rhs, out)  # the tile of (mr, kr): kr = 2·kbl (sr 2)
    return out
