"""llvmlite IR building blocks of the native aarch64 NEON tiles (``kleidipy/kernels/<family>/neon.py``): the 128-bit
vector types, constants, calls of LLVM intrinsics, unaligned loads at byte offsets, lane broadcasts (the operands
of an indexed ``sdot`` or of ``ld1r``), the int4 nibbles of packed bytes, the loops over a tile's row and column
groups and the store of one tile row of 4 float32 columns with its row and column tails; and :func:`neon_tiles`,
what a family module declares its tiles with: the kernels they are, their installation on this host and their
caller.

Hand-written for the reason of :mod:`kleidipy.core.native` (numba's own code never uses these instructions); the
VNNI tiles' helpers (:mod:`kleidipy.core.vnni`) are 512-bit and x86-only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from llvmlite import ir
from numba.core import cgutils

from kleidipy.core import native
from kleidipy.core.matmul import MatmulKernel

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
F16, F32 = ir.HalfType(), ir.FloatType()
V16I8, V4I32, V2I64, V4F32 = ir.VectorType(I8, 16), ir.VectorType(I32, 4), ir.VectorType(I64, 2), ir.VectorType(F32, 4)
#: the intrinsics of the int8 dot products (exact int32 sums of 4 or 8 byte products per lane)
SDOT, SMMLA = "llvm.aarch64.neon.sdot.v4i32.v16i8", "llvm.aarch64.neon.smmla.v4i32.v16i8"
#: columns of a tile row (one <4 x float>)
COLS = 4


def tile_function(name: str, isa: native.NativeIsa) -> tuple[ir.Module, ir.IRBuilder, list[ir.Argument]]:
    """A tile's module for ``isa`` with its function ``void name(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float*
    out)`` (the interface of :func:`kleidipy.core.native.caller`): the module, a builder at the function's entry
    block and its 6 arguments."""
    module = ir.Module(name=name)
    module.triple = isa.triple
    ptr = I8.as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64] * 3 + [ptr] * 3), name)
    return module, ir.IRBuilder(fn.append_basic_block("entry")), list(fn.args)


def const(ty: ir.Type, value: int | float) -> ir.Constant:
    return ir.Constant(ty, value)


def vec(ty: ir.VectorType, values: list) -> ir.Constant:
    """A constant vector of ``values``."""
    return ir.Constant(ty, [ir.Constant(ty.element, v) for v in values])


def call(b: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    """A call of the function (an LLVM intrinsic) ``name``, declared on first use."""
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return b.call(cgutils.get_or_insert_function(b.module, fnty, name), args)


def at(b: ir.IRBuilder, base: ir.Value, offset: ir.Value | int) -> ir.Value:
    """base (i8*) + offset bytes."""
    return b.gep(base, [offset if isinstance(offset, ir.Value) else const(I64, offset)])


def load(b: ir.IRBuilder, base: ir.Value, offset: ir.Value | int, ty: ir.Type) -> ir.Value:
    """An unaligned load of a ``ty`` at base (i8*) + offset bytes."""
    return b.load(b.bitcast(at(b, base, offset), ty.as_pointer()), align=1)


def splat(b: ir.IRBuilder, value: ir.Value, ty: ir.VectorType) -> ir.Value:
    """``value`` in every lane of ``ty`` (``dup``; of a load: ``ld1r``)."""
    one = b.insert_element(ir.Constant(ty, ir.Undefined), value, const(I32, 0))
    return b.shuffle_vector(one, ir.Constant(ty, ir.Undefined), vec(ir.VectorType(I32, ty.count), [0] * ty.count))


def lane(b: ir.IRBuilder, value: ir.Value, lanes: ir.VectorType, index: int) -> ir.Value:
    """Lane ``index`` of ``value`` seen as ``lanes``, in every lane (an indexed ``sdot``/``fmul`` operand)."""
    as_lanes = b.bitcast(value, lanes) if value.type != lanes else value
    mask = vec(ir.VectorType(I32, lanes.count), [index] * lanes.count)
    return b.shuffle_vector(as_lanes, ir.Constant(lanes, ir.Undefined), mask)


def nibble_codes(b: ir.IRBuilder, base: ir.Value, offset: int) -> list[tuple[ir.Value, ir.Value]]:
    """The 4 × 16 packed int4 bytes at base (i8*) + offset, each as (low nibbles ``shl #4``, high nibbles ``and
    #0xf0``): 16 × the signed codes."""
    segs = []
    for s in range(4):
        codes = load(b, base, offset + 16 * s, V16I8)
        segs.append((b.shl(codes, vec(V16I8, [4] * 16)), b.and_(codes, vec(V16I8, [0xF0] * 16))))
    return segs


@contextmanager
def group_pairs(
    b: ir.IRBuilder,
    m: ir.Value,
    n: ir.Value,
    mr: int,
    lhs: ir.Value,
    rhs: ir.Value,
    strides: tuple,
    accs: list,
    nr: int = COLS,
) -> Iterator[tuple[ir.Value, ir.Value, ir.Value, ir.Value]]:
    """The body of the loops over a tile's LHS groups of mr rows × RHS groups of nr columns (``strides``: the bytes of
    an LHS group and of an RHS group); yields the two group indices and the groups' first bytes (gi, gj, lhs0,
    rhs0), the <4 x float> accumulators ``accs`` set to +0 for each pair."""
    groups = b.udiv(b.add(m, const(I64, mr - 1)), const(I64, mr))
    col_groups = b.udiv(b.add(n, const(I64, nr - 1)), const(I64, nr))
    with cgutils.for_range(b, groups, intp=I64) as gi, cgutils.for_range(b, col_groups, intp=I64) as gj:
        lhs0 = b.gep(lhs, [b.mul(gi.index, strides[0])])
        rhs0 = b.gep(rhs, [b.mul(gj.index, strides[1])])
        for acc in accs:
            b.store(ir.Constant(V4F32, None), acc)
        yield gi.index, gj.index, lhs0, rhs0


def store_row(
    b: ir.IRBuilder, out: ir.Value, m: ir.Value, n: ir.Value, row: ir.Value, col0: ir.Value, value: ir.Value
) -> None:
    """out[row, col0 : col0 + 4] = value (a <4 x float>; out: float32 rows of n, as i8*) when row < m — only its
    first n − col0 lanes when fewer columns are left."""
    cols = b.sub(n, col0)
    with b.if_then(b.icmp_signed("<", row, m)):
        first = b.bitcast(at(b, out, b.mul(b.add(b.mul(row, n), col0), const(I64, 4))), F32.as_pointer())
        with b.if_else(b.icmp_signed(">=", cols, const(I64, COLS))) as (whole, part):
            with whole:
                b.store(value, b.bitcast(first, V4F32.as_pointer()), align=4)
            with part:
                for j in range(COLS - 1):
                    with b.if_then(b.icmp_signed(">", cols, const(I64, j))):
                        b.store(b.extract_element(value, const(I32, j)), b.gep(first, [const(I64, j)]))


class NeonTiles(NamedTuple):
    """A family module's NEON tiles (:func:`neon_tiles`), unpacked into the module's ``kernel_tile``, ``HOST_ISA`` and
    the numba caller of its tiles."""

    #: the module of a kernel's tile for an ISA, or None (``Family.native``: ``kleidipy kernels --asm``)
    kernel_tile: Callable[[MatmulKernel, native.NativeIsa], ir.Module | None]
    #: the ISA the tiles are installed for on this host (None: not installed, not available)
    host_isa: native.NativeIsa | None
    #: :func:`kleidipy.core.native.shape_caller` of the tiles: ``call(shape, ints, lhs, rhs, out)`` runs that of
    #: ``shape``
    call: Callable


def neon_tiles(
    tile_module: Callable[[int, int, native.NativeIsa], ir.Module],
    symbol: Callable[[int, int], str],
    shapes: tuple[tuple[int, int], ...],
    shape_of: Callable[[MatmulKernel], tuple[int, int]],
    feature: str = "+neon",
) -> NeonTiles:
    """A family module's NEON tiles: ``tile_module(*shape, isa)`` the module of the tile ``symbol(*shape)``; a
    kernel's tile is that of ``shape_of(kernel)`` on an aarch64 ISA with ``feature`` (none for the SME kernels); the
    tiles of ``shapes`` are installed on a host with DotProd, for its own features (I8MM or not)."""

    def kernel_tile(kernel: MatmulKernel, isa: native.NativeIsa) -> ir.Module | None:
        if kernel.is_sme or not (isa.triple.startswith("aarch64") and isa.has(feature)):
            return None
        return tile_module(*shape_of(kernel), isa)

    host = native.install_tiles(
        native.host_isa("aarch64-i8mm", "aarch64-dotprod"),
        lambda isa: (tile_module(*shape, isa) for shape in shapes),
    )
    return NeonTiles(kernel_tile, host, native.shape_caller(symbol, shapes))
