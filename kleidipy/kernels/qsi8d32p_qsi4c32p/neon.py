"""The Q4_0 NEON kernels (dotprod / i8mm: LHS ``lhs_quant_pack_qsi8d32p_f32``, RHS ``qsi4c32pscalef16`` with
nr = 4, kr 8 or 16) as native aarch64 tiles: ``sdot`` (DotProd) and ``smmla`` (I8MM), the instruction sequence of
KleidiAI's own kernels, with their arithmetic (§5.2 from +0: the bits of ``jit.matmul_qsi8d32p_qsi4c32pscalef16``).

How (as KleidiAI's ``matmul_clamp_f32_qsi8d32p*_qsi4c32p4x*_neon_*`` kernels): per group of mr rows and group of
4 columns, block after block, the packed RHS bytes are split into low nibbles ``shl #4`` and high nibbles
``and #0xf0`` (16 × the signed values), multiplied into int32 lanes by ``sdot`` (kr 8: 4 columns × 4 bytes, the
LHS word of each row broadcast; kr 16: 2 columns × 8 bytes, the LHS doubleword broadcast, lanes paired by
``addp``) or ``smmla`` (kr 16, pairs of rows × pairs of columns × 8 bytes), converted ``scvtf #4`` (exactly the
int32 dot), and accumulated ``fmla`` with the block's scale product ``d_R · d_L``.

:func:`tile_module` builds a tile's LLVM module for a :class:`~kleidipy.core.native.NativeIsa` (``kleidipy
kernels --asm`` cross-compiles it on any host); on an aarch64 host with DotProd the four tiles are compiled at
import for the host's own features (``smmla`` with I8MM) and :func:`compute` runs them. Hand-written LLVM IR for
the reason of :mod:`kleidipy.core.native`: numba's code never uses these instructions.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils

from kleidipy.core import native, neon_ir
from kleidipy.core.neon_ir import F16, F32, I32, I64, SDOT, SMMLA, V2I64, V4F32, V4I32, V16I8

#: columns of a group of the NEON RHS layout (and of a tile)
NR = 4
#: bytes of one block of a packed RHS group: 4 fp16 d, then 4 columns × 16 bytes of codes
RHS_BLOCK = NR * 18
#: the (mr, kr) of the family's NEON kernels: a tile each
SHAPES = ((1, 8), (1, 16), (4, 8), (4, 16))


def symbol(mr: int, kr: int) -> str:
    """The LLVM name of the tile for mr rows per LHS group and kr."""
    return f"kleidipy_q4_0_neon_mr{mr}_kr{kr}"


def instruction(mr: int, kr: int, isa: native.NativeIsa) -> str:
    """The int8 dot-product instruction the tile uses on ``isa``: ``smmla`` (kr 16, pairs of rows, I8MM) or ``sdot``."""
    return "smmla" if kr == 16 and mr % 2 == 0 and isa.has("+i8mm") else "sdot"


def _block_dots(b: ir.IRBuilder, mr: int, kr: int, op: str, lb: ir.Value, segs: list[ir.Value]) -> list:
    """The int32 dots ×16 of one block, a <4 x i32> of the 4 columns per row: ``lb`` the block's packed LHS (mr fp16
    scales, then mr × 32 codes in chunks of kr/2 per row), ``segs`` the RHS codes (shifted low / masked high
    nibbles: ``(lo, hi)`` per 16 bytes)."""
    zero = ir.Constant(V4I32, None)
    kbl = kr // 2  # LHS bytes per row per chunk (sr = 2)
    lhs_data = [neon_ir.load(b, lb, 2 * mr + 16 * v, V16I8) for v in range(2 * mr)]

    def chunk(c: int, r: int, lanes: ir.VectorType) -> ir.Value:  # chunk c of row r in every lane
        word = c * mr + r
        if lanes is V2I64:  # loaded broadcast (ld1r): no indexed sdot for doublewords
            undef = ir.Constant(V2I64, ir.Undefined)
            one = b.insert_element(undef, neon_ir.load(b, lb, 2 * mr + 8 * word, I64), I32(0))
            return b.bitcast(b.shuffle_vector(one, undef, neon_ir.vec(ir.VectorType(I32, 2), [0, 0])), V16I8)
        per = 16 // kbl
        return b.bitcast(neon_ir.lane(b, lhs_data[word // per], lanes, word % per), V16I8)

    if op == "smmla":  # chunk c of rows (2p, 2p+1) is one vector; lo of segment o ↔ chunk o, hi ↔ chunk o + 2
        rows = []
        for p in range(mr // 2):
            acc = []
            for h in range(2):
                a = zero
                for o in range(2):
                    lo, hi = segs[2 * o + h]
                    a = neon_ir.call(b, SMMLA, V4I32, [a, lhs_data[o * mr // 2 + p], lo])
                    a = neon_ir.call(b, SMMLA, V4I32, [a, lhs_data[(o + 2) * mr // 2 + p], hi])
                acc.append(a)
            rows.append(b.shuffle_vector(acc[0], acc[1], neon_ir.vec(V4I32, [0, 1, 4, 5])))
            rows.append(b.shuffle_vector(acc[0], acc[1], neon_ir.vec(V4I32, [2, 3, 6, 7])))
        return rows

    rows = []
    for r in range(mr):
        if kr == 8:  # segment o: 4 columns × 4 bytes; lo ↔ chunk o, hi ↔ chunk o + 4
            a = zero
            for o in range(4):
                lo, hi = segs[o]
                a = neon_ir.call(b, SDOT, V4I32, [a, lo, chunk(o, r, V4I32)])
                a = neon_ir.call(b, SDOT, V4I32, [a, hi, chunk(o + 4, r, V4I32)])
            rows.append(a)
        else:  # 16 bytes: 2 columns × 8 bytes (h: columns 2h, 2h+1); lo of segment o ↔ chunk o, hi ↔ chunk o + 2
            pair = []
            for h in range(2):
                a = zero
                for o in range(2):
                    lo, hi = segs[2 * o + h]
                    a = neon_ir.call(b, SDOT, V4I32, [a, lo, chunk(o, r, V2I64)])
                    a = neon_ir.call(b, SDOT, V4I32, [a, hi, chunk(o + 2, r, V2I64)])
                pair.append(a)
            rows.append(neon_ir.call(b, "llvm.aarch64.neon.addp.v4i32", V4I32, pair))
    return rows


def tile_module(mr: int, kr: int, isa: native.NativeIsa) -> ir.Module:
    """The LLVM module of the tile ``void symbol(mr, kr)(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float* out)``:
    out [m, n] (rows of n floats) = the packed LHS (m rows, groups of mr) × the packed RHS (n columns, groups of 4),
    nb blocks of 32 values each, unclamped."""
    module, b, (m, n, nb, lhs, rhs, out) = neon_ir.tile_function(symbol(mr, kr), isa)
    op = instruction(mr, kr, isa)
    lstride = b.mul(nb, I64(mr * 34))
    rstride = b.mul(nb, I64(RHS_BLOCK))
    accs = [cgutils.alloca_once(b, V4F32) for _ in range(mr)]
    with neon_ir.group_pairs(b, m, n, mr, lhs, rhs, (lstride, rstride), accs) as (gi, gj, lhs0, rhs0):
        with cgutils.for_range(b, nb, intp=I64) as blk:
            rb = b.gep(rhs0, [b.mul(blk.index, I64(RHS_BLOCK))])
            lb = b.gep(lhs0, [b.mul(blk.index, I64(mr * 34))])
            segs = neon_ir.nibble_codes(b, rb, 2 * NR)
            d_r = b.fpext(neon_ir.load(b, rb, 0, ir.VectorType(F16, NR)), V4F32)
            d_l = b.fpext(neon_ir.load(b, lb, 0, ir.VectorType(F16, mr)), ir.VectorType(F32, mr))
            for r, dots in enumerate(_block_dots(b, mr, kr, op, lb, segs)):
                value = neon_ir.call(b, "llvm.aarch64.neon.vcvtfxs2fp.v4f32.v4i32", V4F32, [dots, I32(4)])  # 16·a → a
                scale = b.fmul(
                    d_r, b.shuffle_vector(d_l, ir.Constant(d_l.type, ir.Undefined), neon_ir.vec(V4I32, [r] * 4))
                )
                b.store(neon_ir.call(b, "llvm.fma.v4f32", V4F32, [value, scale, b.load(accs[r])]), accs[r])
        col0 = b.mul(gj, I64(NR))
        for r in range(mr):
            neon_ir.store_row(b, out, m, n, b.add(b.mul(gi, I64(mr)), I64(r)), col0, b.load(accs[r]))
    b.ret_void()
    return module


#: ``kernel_tile`` (the tile module of one of the family's NEON kernels for an aarch64 ISA, None for the SME kernels
#: or x86); the native ISA of this host's tiles (None: no DotProd, or not aarch64 — :func:`compute` is not
#: available); the tiles' caller
kernel_tile, HOST_ISA, _TILES = neon_ir.neon_tiles(tile_module, symbol, SHAPES, lambda kernel: (kernel.mr, kernel.kr))
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def compute(m, n, k, mr, nr, kr, sr, lhs, rhs):  # pragma: no cover - compiled (aarch64 with DotProd)
    """Unclamped float32 [m, n] of the NEON kernels on the native tiles (the signature and bits of
    ``jit.matmul_qsi8d32p_qsi4c32pscalef16``; mr 1 or 4, nr 4, kr 8 or 16, sr 2)."""
    out = np.empty((m, n), np.float32)
    _TILES((mr, kr), (m, n, k // 32), lhs, rhs, out)
    return out
