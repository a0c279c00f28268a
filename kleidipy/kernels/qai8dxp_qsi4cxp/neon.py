"""The int4 per-channel NEON kernels (dotprod / i8mm: LHS ``lhs_quant_pack_qai8dxp_f32``, RHS
``rhs_pack_nxk_qsi4cxp_qs4cxs1s0`` with nr = 4, kr 16, sr 2) as native aarch64 tiles: ``sdot`` (DotProd) and
``smmla`` (I8MM), the instruction sequence of KleidiAI's own kernels, with their arithmetic (the bits of
``kleidipy.kernels.qai8dxp_qsi8cxp.jit.matmul_qai8dxp``).

How (as KleidiAI's ``matmul_clamp_f32_qai8dxp*_qsi4cxp4x8_*_neon_*`` kernels): per tile of rows × 4 columns, block
after block of 32 K values (k_int = roundup(k, 32)), the block's 64 RHS bytes (4 × 16: K chunk 0 or 1 of 8 values,
columns 0 1 or 2 3) are split into low nibbles ``shl #4`` (K chunk 0 / 1) and high nibbles ``and #0xf0`` (K chunk
2 / 3), 16 × the signed weights, and multiplied into int32 lanes with the LHS chunks of 8 values by

* ``sdot`` (``…qai8dxp1x8…_1x4x32_neon_dotprod``, and the I8MM kernels on a DotProd-only CPU) of 2 columns × 8
  bytes with the row's 8 LHS bytes in both doublewords (``ld1r``), the pairs of lanes of a column added by ``addp``
  after the K loop;
* ``smmla`` (``…qai8dxp4x8…_4x4x32_neon_i8mm``, ``…_8x4x32_neon_i8mm``) of 2 rows × 2 columns × 8 bytes, the rows
  of a pair taken apart by ``uzp1``/``uzp2`` after the K loop.

The accumulators hold 16 × the int32 dot (wrapping), as the packer's row sums (16·Σw) and scales (scale·0.0625)
expect. After the K loop, the epilogue of the Q8_0 tiles (:mod:`kleidipy.kernels.qai8dxp_qsi8cxp.neon`): ``mla``
of the row sums by the row's −zp (int32, wrapping), F = ``scvtf``, S = f32(scale·recip), out = f32(f32(F·S) +
bias), unclamped. A tile holds m_step rows (8x4x32: 2 LHS groups of 4, the group left over alone) with ``smmla``,
one LHS group with ``sdot``.

:func:`tile_module` builds a tile's LLVM module for a :class:`~kleidipy.core.native.NativeIsa` (``kleidipy kernels
--asm`` cross-compiles it on any host, through :func:`kernel_tile`); on an aarch64 host with DotProd the three
tiles are compiled at import for the host's own features (``smmla`` with I8MM), :func:`matmul` runs a kernel's tile
and :func:`tiles` (the jit's signature) the family's NEON layouts. Hand-written LLVM IR for
the reason of :mod:`kleidipy.core.native`: numba's code never uses these instructions.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba.core import cgutils

from kleidipy.core import native, neon_ir
from kleidipy.core.neon_ir import I32, I64, SDOT, SMMLA, V2I64, V4I32, V16I8
from kleidipy.kernels.qai8dxp_qsi8cxp import jit
from kleidipy.kernels.qai8dxp_qsi8cxp import neon as qai8dxp_qsi8cxp_neon

#: columns of a group of the RHS layout (and of a tile)
NR = 4
#: LHS values per row of a chunk (kr / sr) and RHS bytes per column of a chunk (blen)
KBL = 8
#: K values of one iteration of a tile's block loop (k_int is a multiple)
BLOCK = 32
#: bytes of one block of a packed RHS group: 4 columns × 32 int4
RHS_BLOCK = NR * BLOCK // 2
#: bytes after the data of a packed RHS group: 4 int32 row sums, 4 f32 scales, 4 f32 biases
RHS_PARAMS = NR * 12
#: weight of a nibble as the kernels read it (``shl #4`` / ``and #0xf0``)
NIBBLE_FACTOR = 16
#: the (mr, m_step) of the family's NEON kernels: a tile each
SHAPES = ((1, 1), (4, 4), (4, 8))
#: the m_step of the tile :func:`tiles` runs groups of 4 rows on (the 8x4x32 kernel's)
GEMM_M_STEP = 8


def symbol(mr: int, m_step: int) -> str:
    """The LLVM name of the tile for mr rows per LHS group and m_step rows per kernel step."""
    return f"kleidipy_qsi4cx_neon_mr{mr}_m{m_step}"


def instruction(mr: int, isa: native.NativeIsa) -> str:
    """The int8 dot-product instruction the tile uses on ``isa``: ``smmla`` (groups of 4 rows, I8MM) or ``sdot``."""
    return "smmla" if mr == 4 and isa.has("+i8mm") else "sdot"


def groups(mr: int, m_step: int, isa: native.NativeIsa) -> int:
    """The LHS groups of mr rows a tile holds: m_step / mr with ``smmla`` (as KleidiAI's kernels), else 1 (``sdot``
    takes 2 accumulators per row)."""
    return m_step // mr if instruction(mr, isa) == "smmla" else 1


def _block(b: ir.IRBuilder, op: str, mr: int, lbs: list, rb: ir.Value, accs: list) -> list:
    """The accumulators after one block: ``lbs`` the block's bytes of each LHS group of the tile (4 K chunks of mr
    rows × 8), ``rb`` the block's RHS bytes, ``accs`` as ``qai8dxp_qsi8cxp.neon.tile_rows`` reads them (kr 8)."""
    low_mask = neon_ir.vec(V16I8, [0xF0] * 16)
    # 16 bytes s: columns 2(s % 2), 2(s % 2) + 1 of K chunk s // 2 (low nibbles) and s // 2 + 2 (high nibbles)
    codes = [neon_ir.load(b, rb, 16 * s, V16I8) for s in range(RHS_BLOCK // 16)]
    segs = [(b.shl(c, neon_ir.vec(V16I8, [4] * 16)), b.and_(c, low_mask)) for c in codes]

    def rhs(c: int, h: int) -> ir.Value:  # K chunk c of columns 2h, 2h + 1
        return segs[2 * (c % 2) + h][c // 2]

    out = list(accs)
    for i, lb in enumerate(lbs):
        if op == "smmla":  # rows 2p, 2p+1 of K chunk c: 16 bytes at c·mr·8 + 16p; accumulator (pair, column pair)
            for c in range(BLOCK // KBL):
                for p in range(mr // 2):
                    pair = neon_ir.load(b, lb, c * mr * KBL + 16 * p, V16I8)
                    for h in range(2):
                        a = 2 * (i * mr // 2 + p) + h
                        out[a] = neon_ir.call(b, SMMLA, V4I32, [out[a], pair, rhs(c, h)])
        else:  # row r of K chunk c: 8 bytes at (c·mr + r)·8 in both doublewords (one row: ld1r, as KleidiAI's 1x4x32
            # kernel; rows in pairs: dup of a doubleword of the pair's 16 bytes); accumulator (row, column pair)
            for r in range(mr):
                for c in range(BLOCK // KBL):
                    if mr == 1:
                        one = neon_ir.splat(b, neon_ir.load(b, lb, c * KBL, I64), V2I64)
                    else:
                        pair = neon_ir.load(b, lb, (c * mr + r - r % 2) * KBL, V2I64)
                        one = b.shuffle_vector(pair, pair, neon_ir.vec(ir.VectorType(I32, 2), [r % 2] * 2))
                    one = b.bitcast(one, V16I8)
                    for h in range(2):
                        a = 2 * (i * mr + r) + h
                        out[a] = neon_ir.call(b, SDOT, V4I32, [out[a], rhs(c, h), one])
    return out


def tile_module(mr: int, m_step: int, isa: native.NativeIsa) -> ir.Module:
    """The LLVM module of the tile ``void symbol(mr, m_step)(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, i8* out)``:
    out [m, n] (float32 rows of n) = the packed LHS (m rows, groups of mr) × the packed RHS (n columns, groups of 4),
    k_int = 32·nb (nb ≥ 1), f32(f32(F·S) + bias), unclamped."""
    module, b, (m, n, nb, lhs, rhs, out) = neon_ir.tile_function(symbol(mr, m_step), isa)
    op = instruction(mr, isa)
    per_tile = groups(mr, m_step, isa)
    k_int = b.mul(nb, I64(BLOCK))
    lstride = b.mul(b.add(k_int, I64(8)), I64(mr))
    data = b.mul(nb, I64(RHS_BLOCK))
    rstride = b.add(data, I64(RHS_PARAMS))
    lgroups = b.udiv(b.add(m, I64(mr - 1)), I64(mr))
    col_groups = b.udiv(b.add(n, I64(NR - 1)), I64(NR))

    def tile(count: int, g0: ir.Value) -> None:
        """The rows of ``count`` LHS groups from group g0 × every group of 4 columns."""
        lhs0 = [neon_ir.at(b, lhs, b.mul(b.add(g0, I64(i)), lstride)) for i in range(count)]
        accs = [cgutils.alloca_once(b, V4I32) for _ in range(count * mr * (1 if op == "smmla" else 2))]
        with cgutils.for_range(b, col_groups, intp=I64) as gj:
            rhs0 = neon_ir.at(b, rhs, b.mul(gj.index, rstride))
            for acc in accs:
                b.store(ir.Constant(V4I32, None), acc)
            with qai8dxp_qsi8cxp_neon.block_loop(b, nb) as blk:
                lbs = [neon_ir.at(b, lb, b.mul(blk, I64(mr * BLOCK))) for lb in lhs0]
                rb = neon_ir.at(b, rhs0, b.mul(blk, I64(RHS_BLOCK)))
                for acc, value in zip(accs, _block(b, op, mr, lbs, rb, [b.load(a) for a in accs]), strict=True):
                    b.store(value, acc)
            dots = qai8dxp_qsi8cxp_neon.tile_rows(b, op, KBL, [b.load(a) for a in accs])
            params = neon_ir.at(b, rhs0, data)
            qai8dxp_qsi8cxp_neon.store_rows(b, (m, n, out), lhs0, g0, k_int, mr, params, gj.index, dots)

    qai8dxp_qsi8cxp_neon.group_tiles(b, lgroups, per_tile, tile)
    b.ret_void()
    return module


#: ``kernel_tile`` (the tile module of one of the family's NEON kernels for an aarch64 ISA with DotProd, None for the
#: SME kernels or another ISA; an I8MM kernel on a DotProd-only ISA gets an ``sdot`` tile); the native ISA of this
#: host's tiles (None: no DotProd, or not aarch64 — :func:`matmul` is not available); the tiles' caller
kernel_tile, HOST_ISA, _TILES = neon_ir.neon_tiles(
    tile_module, symbol, SHAPES, lambda kernel: (kernel.mr, kernel.m_step), "+dotprod"
)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
    """Whether the tiles run a layout (the layout arguments of ``jit.matmul_qai8dxp``): the int4 layout of
    ``rhs_pack_nxk_qsi4cxp_qs4cxs1s0`` with nr = 4, kr 16, sr 2 (byte e of a group's data: column (e // 8) % 4,
    t = (e // 32)·8 + e % 8, K index 32·(t // 16) + t % 16 in the low nibble, 16 more in the high one, each weighing
    16), the LHS in groups of mr 1 (any kbl: K order) or 4 (chunks of kbl = 8)."""
    if nr != NR or blen != KBL or nibble_factor != NIBBLE_FACTOR or not (mr == 1 or (mr == 4 and kbl == KBL)):
        return False
    if k_int <= 0 or k_int % BLOCK != 0 or k_lo.size != NR * k_int // 2 or k_hi.size != k_lo.size:
        return False
    for e in range(k_lo.size):
        t = (e // (NR * KBL)) * KBL + e % KBL
        lo = 32 * (t // 16) + t % 16
        if k_lo[e] != lo or k_hi[e] != lo + 16:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def matmul(m, n, k_int, mr, m_step, lhs_i8, rhs_u8, out):  # pragma: no cover - compiled (aarch64)
    """out[m, n] (C-contiguous float32, f32(f32(F·S) + bias), unclamped) of a layout :func:`is_native_layout`
    accepts, on the tile of the kernel with this mr and m_step (every tile gives the same bits)."""
    _TILES((mr, 1 if mr == 1 else m_step), (m, n, k_int // BLOCK), lhs_i8, rhs_u8, out)  # mr 1: the 1x4x32 tile


def tiles(m, n, k_int, lhs_i8, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out) -> bool:
    """Run a call of ``jit.matmul_qai8dxp`` on the tiles and return True if they take it (the layouts of the family's
    NEON kernels with their recipe, FMUL_FADD; groups of 4 rows on the 8x4x32 kernel's tile), else return False: the
    NEON link of the family's tile chain (``ukernels.MATMUL_COMPUTE``). Needs :data:`AVAILABLE`."""
    if recipe == jit.RECIPE_FMUL_FADD and is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
        matmul(m, n, k_int, mr, GEMM_M_STEP, lhs_i8, rhs_u8, out)
        return True
    return False
