"""The Q8_0 NEON kernels (dotprod / i8mm: LHS ``lhs_quant_pack_qai8dxp_f32``, RHS ``rhs_pack_nxk_qsi8cxp_qsi8cx_neon``
with nr = 4, kr 4 or 8, sr 1) as native aarch64 tiles: ``sdot`` (DotProd) and ``smmla`` (I8MM), the instruction
sequence of KleidiAI's own kernels, with their arithmetic (the bits of ``jit.matmul_qai8dxp``).

How (as KleidiAI's ``matmul_clamp_f32_qai8dxp*_qsi8cxp4x*_neon_*`` kernels): per tile of rows × 4 columns, block
after block of 32 K values (k_int = roundup(k, 32)), the int8 products are summed into int32 lanes by

* kr 4 (``…qai8dxp1x4…_1x4_neon_dotprod``, ``…qai8dxp4x4…_16x4_neon_dotprod``): ``sdot`` of the 16 RHS bytes of
  a K group of 4 (4 columns × 4 bytes) with a row's 4 LHS bytes in every lane (indexed ``sdot``);
* kr 8, DotProd (``…qai8dxp1x8…_1x4_neon_dotprod``): ``sdot`` of 2 columns × 8 bytes with the row's 8 LHS bytes
  loaded broadcast (``ld1r``), the pairs of lanes of a column added by ``addp`` after the K loop;
* kr 8, I8MM (``…qai8dxp4x8…_16x4_neon_i8mm``): ``smmla`` of 2 rows × 2 columns × 8 bytes, the rows of a pair
  taken apart by ``uzp1``/``uzp2`` after the K loop.

The 16x4 kernels' tiles hold 16 rows (4 LHS groups of 4; the groups left over one at a time), the others one
LHS group. After the K loop, KleidiAI's epilogue: ``mla`` of the RHS row sums by the row's −zp (int32, wrapping),
F = ``scvtf``, S = f32(scale·recip) and out = f32(f32(F·S) + bias) (``fmul``, ``fadd``: ``Recipe.FMUL_FADD``),
unclamped.

:func:`tile_module` builds a tile's LLVM module for a :class:`~kleidipy.core.native.NativeIsa` (``kleidipy kernels
--asm`` cross-compiles it on any host, through :func:`kernel_tile`); on an aarch64 host with DotProd the four tiles are
compiled at import for the host's own features (``smmla`` with I8MM) and :func:`matmul` runs them (the family's tile
chain, ``ukernels.matmul_tiled``, takes them on such a host). Hand-written LLVM IR for the reason of
:mod:`kleidipy.core.native`: numba's code never uses these instructions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numba
from llvmlite import ir
from numba.core import cgutils

from kleidipy.core import native, neon_ir
from kleidipy.core.neon_ir import F32, I32, I64, SDOT, SMMLA, V2I64, V4F32, V4I32, V16I8
from kleidipy.kernels.qai8dxp_qsi8cxp import vnni as qai8dxp_qsi8cxp_vnni

#: columns of a group of the RHS layout (and of a tile)
NR = 4
#: K values of one iteration of a tile's block loop (k_int is a multiple)
BLOCK = 32
#: bytes of one block of a packed RHS group: 4 columns × 32 int8
RHS_BLOCK = NR * BLOCK
#: bytes after the data of a packed RHS group: 4 int32 row sums, 4 f32 scales, 4 f32 biases
RHS_PARAMS = NR * 12
#: the (mr, kr) of the family's NEON kernels: a tile each
SHAPES = ((1, 4), (1, 8), (4, 4), (4, 8))


def symbol(mr: int, kr: int) -> str:
    """The LLVM name of the tile for mr rows per LHS group and kr."""
    return f"kleidipy_q8_0_neon_mr{mr}_kr{kr}"


def instruction(mr: int, kr: int, isa: native.NativeIsa) -> str:
    """The int8 dot-product instruction the tile uses on ``isa``: ``smmla`` (kr 8, groups of 4 rows, I8MM) or
    ``sdot``."""
    return "smmla" if (mr, kr) == (4, 8) and isa.has("+i8mm") else "sdot"


def groups(mr: int, kr: int, isa: native.NativeIsa) -> int:
    """The LHS groups of mr rows a tile holds: 4 (16 rows, as KleidiAI's 16x4 kernels) for the layouts of those
    kernels, else 1 (the kr 8 layout of 4 rows on DotProd: ``sdot`` takes 2 accumulators per row)."""
    return 4 if mr == 4 and (kr == 4 or instruction(mr, kr, isa) == "smmla") else 1


@contextmanager
def block_loop(b: ir.IRBuilder, nb: ir.Value) -> Iterator[ir.Value]:
    """The body of a loop over blocks 0 … nb − 1 (nb ≥ 1: a loop tested at its end, as KleidiAI's ``subs``/``bgt``);
    yields the block index."""
    entry, body = b.basic_block, b.append_basic_block("block")
    b.branch(body)
    b.position_at_end(body)
    index = b.phi(I64)
    index.add_incoming(I64(0), entry)
    yield index
    after = b.add(index, I64(1))
    index.add_incoming(after, b.basic_block)
    done = b.append_basic_block("block.done")
    b.cbranch(b.icmp_signed("<", after, nb), body, done)
    b.position_at_end(done)


def _block(b: ir.IRBuilder, op: str, mr: int, kr: int, lbs: list, rb: ir.Value, accs: list) -> list:
    """The accumulators after one block: ``lbs`` the block's bytes of each LHS group of the tile (mr rows × 32 in
    chunks of kr per row), ``rb`` the block's RHS bytes (4 columns × 32 in chunks of kr per column), ``accs`` as
    :func:`tile_rows` reads them."""
    # 16 bytes v: kr 4, K group v of 4 columns; kr 8, K group v // 2 of columns 2(v % 2), 2(v % 2) + 1
    rhs = [neon_ir.load(b, rb, 16 * v, V16I8) for v in range(RHS_BLOCK // 16)]
    out = list(accs)
    for i, lb in enumerate(lbs):
        if kr == 4:  # row r of K group g: int32 word g·mr + r of the block
            lhs = [neon_ir.load(b, lb, 16 * v, V16I8) for v in range(mr * BLOCK // 16)]
            for r in range(mr):
                for g in range(BLOCK // 4):
                    word = g * mr + r
                    lanes = b.bitcast(lhs[word // 4], V4I32)
                    mask = neon_ir.vec(V4I32, [word % 4] * 4)
                    one = b.bitcast(b.shuffle_vector(lanes, ir.Constant(V4I32, ir.Undefined), mask), V16I8)
                    out[i * mr + r] = neon_ir.call(b, SDOT, V4I32, [out[i * mr + r], rhs[g], one])
        elif op == "smmla":  # rows 2p, 2p+1 of K group g: 16 bytes at g·mr·8 + 16p; accumulator (pair, column pair)
            for g in range(BLOCK // 8):
                for p in range(mr // 2):
                    pair = neon_ir.load(b, lb, g * mr * 8 + 16 * p, V16I8)
                    for h in range(2):
                        a = 2 * (i * mr // 2 + p) + h
                        out[a] = neon_ir.call(b, SMMLA, V4I32, [out[a], pair, rhs[2 * g + h]])
        else:  # row r of K group g: 8 bytes at (g·mr + r)·8 in both doublewords (one row: ld1r, as KleidiAI's 1x8
            # kernel; rows in pairs: dup of a doubleword of the pair's 16 bytes); accumulator (row, column pair)
            for r in range(mr):
                for g in range(BLOCK // 8):
                    if mr == 1:
                        one = neon_ir.splat(b, neon_ir.load(b, lb, g * 8, I64), V2I64)
                    else:
                        pair = neon_ir.load(b, lb, (g * mr + r - r % 2) * 8, V2I64)
                        one = b.shuffle_vector(pair, pair, neon_ir.vec(ir.VectorType(I32, 2), [r % 2] * 2))
                    one = b.bitcast(one, V16I8)
                    for h in range(2):
                        a = 2 * (i * mr + r) + h
                        out[a] = neon_ir.call(b, SDOT, V4I32, [out[a], rhs[2 * g + h], one])
    return out


def _accumulators(op: str, mr: int, kr: int, count: int) -> int:
    """int32 vectors a tile of ``count`` LHS groups accumulates in."""
    return count * mr * (1 if kr == 4 or op == "smmla" else 2)


def tile_rows(b: ir.IRBuilder, op: str, kr: int, accs: list) -> list:
    """The int32 dots of the tile's rows (4 columns each) from its accumulators."""
    if kr == 4:
        return accs
    if op == "smmla":  # (row pair, columns 0 1) ‖ (row pair, columns 2 3) → uzp1 / uzp2 of their doublewords
        rows = []
        for lo, hi in zip(accs[::2], accs[1::2], strict=True):
            rows.append(b.shuffle_vector(lo, hi, neon_ir.vec(V4I32, [0, 1, 4, 5])))
            rows.append(b.shuffle_vector(lo, hi, neon_ir.vec(V4I32, [2, 3, 6, 7])))
        return rows
    pairs = zip(accs[::2], accs[1::2], strict=True)  # (row, columns 0 1), (row, columns 2 3): lanes added pairwise
    return [neon_ir.call(b, "llvm.aarch64.neon.addp.v4i32", V4I32, [lo, hi]) for lo, hi in pairs]


def store_rows(
    b: ir.IRBuilder,
    dst: tuple,
    lhs0: list,
    g0: ir.Value,
    k_int: ir.Value,
    mr: int,
    params: ir.Value,
    gj: ir.Value,
    dots: list,
) -> None:
    """KleidiAI's epilogue of a tile's rows, the LHS groups at ``lhs0`` (from group g0) × column group gj: ``mla`` of
    the RHS row sums (at ``params``, then the scales and biases) by the row's −zp (after its group's k_int·mr
    bytes, then the recips), F = ``scvtf``, S = f32(scale·recip), out = f32(f32(F·S) + bias) into ``dst`` (m, n,
    out as :func:`~kleidipy.core.neon_ir.store_row` takes them); ``dots`` the int32 dots of the rows."""
    m, n, out = dst
    sums, scales, biases = (neon_ir.load(b, params, 16 * f, ty) for f, ty in enumerate((V4I32, V4F32, V4F32)))
    col0 = b.mul(gj, I64(NR))
    for i, lb in enumerate(lhs0):
        lparams = neon_ir.at(b, lb, b.mul(k_int, I64(mr)))
        for r in range(mr):
            row = b.add(b.mul(b.add(g0, I64(i)), I64(mr)), I64(r))
            offset = neon_ir.splat(b, neon_ir.load(b, lparams, 4 * r, I32), V4I32)
            recip = neon_ir.splat(b, neon_ir.load(b, lparams, 4 * (mr + r), F32), V4F32)
            f = b.sitofp(b.add(dots[i * mr + r], b.mul(sums, offset)), V4F32)
            res = b.fadd(b.fmul(f, b.fmul(scales, recip)), biases)
            neon_ir.store_row(b, out, m, n, row, col0, res)


def group_tiles(b: ir.IRBuilder, lgroups: ir.Value, per_tile: int, tile: Callable[[int, ir.Value], None]) -> None:
    """``tile(count, g0)`` over the ``lgroups`` LHS groups: ``per_tile`` groups at a time, then the groups left over
    one at a time."""
    full = b.udiv(lgroups, I64(per_tile))
    with cgutils.for_range(b, full, intp=I64) as t:
        tile(per_tile, b.mul(t.index, I64(per_tile)))
    if per_tile > 1:
        with cgutils.for_range(b, lgroups, start=b.mul(full, I64(per_tile)), intp=I64) as g:
            tile(1, g.index)


def tile_module(mr: int, kr: int, isa: native.NativeIsa) -> ir.Module:
    """The LLVM module of the tile ``void symbol(mr, kr)(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, i8* out)``: out
    [m, n] (float32 rows of n) = the packed LHS (m rows, groups of mr) × the packed RHS (n columns, groups of 4),
    k_int = 32·nb (nb ≥ 1), f32(f32(F·S) + bias), unclamped."""
    module, b, (m, n, nb, lhs, rhs, out) = neon_ir.tile_function(symbol(mr, kr), isa)
    op = instruction(mr, kr, isa)
    per_tile = groups(mr, kr, isa)
    k_int = b.mul(nb, I64(BLOCK))
    lstride = b.mul(b.add(k_int, I64(8)), I64(mr))
    rstride = b.add(b.mul(k_int, I64(NR)), I64(RHS_PARAMS))
    lgroups = b.udiv(b.add(m, I64(mr - 1)), I64(mr))
    col_groups = b.udiv(b.add(n, I64(NR - 1)), I64(NR))

    def tile(count: int, g0: ir.Value) -> None:
        """The rows of ``count`` LHS groups from group g0 × every group of 4 columns."""
        lhs0 = [neon_ir.at(b, lhs, b.mul(b.add(g0, I64(i)), lstride)) for i in range(count)]
        accs = [cgutils.alloca_once(b, V4I32) for _ in range(_accumulators(op, mr, kr, count))]
        with cgutils.for_range(b, col_groups, intp=I64) as gj:
            rhs0 = neon_ir.at(b, rhs, b.mul(gj.index, rstride))
            for acc in accs:
                b.store(ir.Constant(V4I32, None), acc)
            with block_loop(b, nb) as blk:
                lbs = [neon_ir.at(b, lb, b.mul(blk, I64(mr * BLOCK))) for lb in lhs0]
                rb = neon_ir.at(b, rhs0, b.mul(blk, I64(RHS_BLOCK)))
                for acc, value in zip(accs, _block(b, op, mr, kr, lbs, rb, [b.load(a) for a in accs]), strict=True):
                    b.store(value, acc)
            dots = tile_rows(b, op, kr, [b.load(a) for a in accs])
            params = neon_ir.at(b, rhs0, b.mul(k_int, I64(NR)))
            store_rows(b, (m, n, out), lhs0, g0, k_int, mr, params, gj.index, dots)

    group_tiles(b, lgroups, per_tile, tile)
    b.ret_void()
    return module


#: ``kernel_tile`` (the tile module of one of the family's NEON kernels for an aarch64 ISA with DotProd, None for the
#: SME kernels or another ISA); the native ISA of this host's tiles (None: no DotProd, or not aarch64 —
#: :func:`matmul` is not available); the tiles' caller
kernel_tile, HOST_ISA, _TILES = neon_ir.neon_tiles(
    tile_module, symbol, SHAPES, lambda kernel: (kernel.mr, kernel.kr), "+dotprod"
)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
    """Whether the tiles run a layout (given as to ``vnni.is_vnni_layout``): the int8 layout of
    ``rhs_pack_nxk_qsi8cxp_qsi8cx_neon`` (probed as that function does) with nr = 4 and the (mr, kr) of a tile
    (:data:`SHAPES`, kr = blen), the LHS in chunks of kbl = kr (any kbl for one row per group: K order)."""
    if nr != NR or not (mr == 1 or (mr == 4 and kbl == blen)) or not (blen == 4 or blen == 8):
        return False
    return qai8dxp_qsi8cxp_vnni.is_vnni_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi)


@numba.njit(cache=True, nogil=True)
def matmul(m, n, k_int, mr, kr, lhs_i8, rhs_u8, out):  # pragma: no cover - compiled (aarch64 with DotProd)
    """out[m, n] (C-contiguous float32, unclamped) of a layout :func:`is_native_layout` accepts on the tile of
    (mr, kr): f32(f32(F·S) + bias), the NEON kernels' recipe."""
    _TILES((mr, kr), (m, n, k_int // BLOCK), lhs_i8, rhs_u8, out)
