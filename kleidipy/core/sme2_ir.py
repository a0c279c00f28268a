"""LLVM IR text of the native SME2 tiles (``kleidipy/kernels/<family>/sme2.py``): the scalable vector types, an
emitter of function bodies (:class:`IrText`: values, labels, intrinsic calls with their declarations, predicated
multi-vector loads and stores, ``luti4`` through ZT0 and the GEMM / GEMV blocks of 4-bit codes it decodes,
multi-vector ``scvtf``, ``fma``, the loops every tile shares over column groups, row groups and rows), the module of
a tile (:func:`tile_module`: a locally streaming entry point that turns ZA, and ZT0, on and off itself around the body —
so no SME ABI support routine is called, which Debian bookworm's libgcc lacks), that of a tile without ZA
(:func:`streaming_module`: the SME1 GEMV tiles) and the streaming vector length
(:func:`vl_module`, read from numba code by :func:`vl_reader`); and :func:`sme_tiles` (:func:`sme2_tiles` for SME2),
what a family module declares its tiles with: their modules, the kernels they are, their installation on this host
and their callers.

Hand-written as text because llvmlite's IR builder has no scalable vector types and no SME function attributes;
for the reason of native tiles at all, see :mod:`kleidipy.core.native`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import native
from kleidipy.core.matmul import MatmulKernel

# scalable vector types (one vector register each), the predicate and the SME2 predicate-as-counter
B, W, F, H = "<vscale x 16 x i8>", "<vscale x 4 x i32>", "<vscale x 4 x float>", "<vscale x 8 x half>"
P, PN = "<vscale x 16 x i1>", 'target("aarch64.svcount")'
#: a tile's arguments (the interface of :func:`kleidipy.core.native.caller`)
ARGS = "i64 %m, i64 %n, i64 %nb, ptr %lhs, ptr %rhs, ptr %out"
_KINDS = {B: "nxv16i8", W: "nxv4i32", F: "nxv4f32", H: "nxv8f16"}
#: a tile's body runs in streaming mode and shares ZA (and ZT0) with its entry point
_STREAMING = '"aarch64_pstate_sm_enabled"'


def tuple_type(ty: str, count: int) -> str:
    """The aggregate type of ``count`` values of ``ty`` (the multi-vector intrinsics' operands and results)."""
    return "{" + ", ".join([ty] * count) + "}"


def lut_definition(name: str, table: str = "offset") -> str:
    """The global ``name`` holding ZT0's table for ``luti4``, 16 entries of 32 bits: ``table`` "offset", entry u is
    the int32 u − 8 (the offset value of code u); "signed", the int4 two's-complement value of nibble u (KleidiAI's
    ``lut`` of signed-nibble layouts); "f16", the F16 bits of u − 8 in the low halfword (``luti4`` .H reads it)."""
    if table == "f16":
        values = (int(np.array(u - 8, "<f2").view("<u2")) for u in range(16))
    else:
        values = (u - 16 * (u >> 3) if table == "signed" else u - 8 for u in range(16))
    return f"{name} = internal constant [16 x i32] [{', '.join(f'i32 {v}' for v in values)}], align 64"


class IrText:
    """The lines of a function body and the declarations of the intrinsics it calls."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.declarations: dict[str, str] = {}
        self.count = 0

    def __call__(self, text: str, name: str | None = None) -> str:
        """Emit ``%name = text`` (a fresh ``%vN`` without a name); the value's name."""
        if name is None:
            name = f"v{self.count}"
            self.count += 1
        self.lines.append(f"  %{name} = {text}")
        return f"%{name}"

    def do(self, text: str) -> None:
        self.lines.append(f"  {text}")

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")

    def call(self, ret: str, intrinsic: str, *args: tuple[str, str], name: str | None = None) -> str:
        """Call ``ret intrinsic(args)`` (``args``: (type, value) pairs); the result's name ("" if void)."""
        self.declarations[intrinsic] = f"declare {ret} @{intrinsic}({', '.join(ty for ty, _ in args)})"
        text = f"call {ret} @{intrinsic}({', '.join(f'{ty} {value}' for ty, value in args)})"
        if ret == "void":
            self.do(text)
            return ""
        return self(text, name)

    def parts(self, value: str, ty: str, count: int) -> list[str]:
        """The ``count`` members of an aggregate of ``ty``."""
        return [self(f"extractvalue {tuple_type(ty, count)} {value}, {i}") for i in range(count)]

    def at(self, base: str, offset: str | int, ty: str = "i8") -> str:
        """``base`` + ``offset`` elements of ``ty`` (a scalable vector type: whole vectors)."""
        return self(f"getelementptr {ty}, ptr {base}, i64 {offset}")

    def load(self, at: str, ty: str, count: int, pn: str) -> list[str]:
        """``ld1`` of ``count`` consecutive vectors of ``ty`` at ``at`` under the predicate-as-counter ``pn``."""
        intrinsic = f"llvm.aarch64.sve.ld1.pn.x{count}.{_KINDS[ty]}"
        return self.parts(self.call(tuple_type(ty, count), intrinsic, (PN, pn), ("ptr", at)), ty, count)

    def store(self, values: list[str], at: str) -> None:
        """``st1w`` of 4 vectors of float32 at ``at`` under the column predicate ``%pn``."""
        self.call("void", "llvm.aarch64.sve.st1.pn.x4.nxv4f32", *[(F, x) for x in values], (PN, "%pn"), ("ptr", at))

    def luti4(self, codes: str) -> list[str]:
        """``luti4 {2 vectors}, zt0, codes[0]``: the int8 u − 8 of the SVL/4 codes of a vector, in order."""
        intrinsic = "llvm.aarch64.sme.luti4.lane.zt.x2.nxv16i8"
        return self.parts(self.call(tuple_type(B, 2), intrinsic, ("i32", "0"), (B, codes), ("i32", "0")), B, 2)

    def luti4_group(self, rp: str, t: int) -> list[str]:
        """The 4 vectors of int8 of K group t of a block of 4-bit codes at ``rp`` (2 bytes per column and K group:
        2 vectors of codes, ``luti4`` each)."""
        return [x for codes in self.load(self.at(rp, 2 * t, B), B, 2, "%pn8") for x in self.luti4(codes)]

    def luti4_mopa(self, lp: str, rp: str) -> None:
        """A block's products into ZA0.S .. ZA3.S: per K group t of 8, ``smopa`` of VL rows × 4 int8 (one vector
        at ``lp``) by the 4·VL columns of :meth:`luti4_group` t (``rp``)."""
        for t in range(8):
            lhs = self(f"load {B}, ptr {self.at(lp, t, B)}, align 1")
            for tile, values in enumerate(self.luti4_group(rp, t)):
                args = (("i32", str(tile)), (P, "%ptrue"), (P, "%ptrue"), (B, lhs), (B, values))
                self.call("void", "llvm.aarch64.sme.smopa.wide.nxv16i8", *args)

    def luti4_groups(self, rp: str, h: int) -> Iterator[tuple[int, list[str]]]:
        """The K groups 4h + g, g = 0 .. 3 in turn, of a block of 4-bit codes at ``rp`` (2 bytes per column and K
        group: 2 vectors of codes a group): (g, its 4 vectors of int8), groups g and g + 1 ``luti4`` of the same 4
        vectors of codes."""
        for g in (0, 2):
            rhs = [x for codes in self.load(self.at(rp, 2 * (4 * h + g), B), B, 4, "%pn8") for x in self.luti4(codes)]
            for i in range(2):
                yield g + i, rhs[4 * i : 4 * i + 4]

    def luti4_sdot(self, lp: str, rp: str) -> list[str]:
        """The float32 dots of a block of 32 K values of one row (int8 at ``lp``) with 4·VL columns of 4-bit codes
        (:meth:`luti4_groups` at ``rp``): ``zero {za}``, per 16 LHS bytes (``ld1rqb``) the multi-vector ``sdot
        za.s[w8, 0, vgx4]`` indexed by the K group, ``mova`` of the 4 ZA vectors, ``scvtf``."""
        self.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
        for h in range(2):  # 16 LHS bytes (K groups 4h .. 4h + 3) in every 128-bit segment
            lhs = self.call(B, "llvm.aarch64.sve.ld1rq.nxv16i8", (P, "%ptrue"), ("ptr", self.at(lp, 16 * h)))
            for g, rhs in self.luti4_groups(rp, h):
                values = [(B, x) for x in rhs]
                intrinsic = "llvm.aarch64.sme.sdot.lane.za32.vg1x4.nxv16i8"
                self.call("void", intrinsic, ("i32", "0"), *values, (B, lhs), ("i32", str(g)))
        za = self.call(tuple_type(W, 4), "llvm.aarch64.sme.read.vg1x4.nxv4i32", ("i32", "0"))
        return self.scvtf(self.parts(za, W, 4))

    def scvtf(self, ints: list[str]) -> list[str]:
        """float32 of 4 vectors of int32 (exact: |dot| < 2^24), one multi-vector ``scvtf``."""
        floats = self.call(tuple_type(F, 4), "llvm.aarch64.sve.scvtf.x4.nxv4f32.nxv4i32", *[(W, x) for x in ints])
        return self.parts(floats, F, 4)

    def fma(self, a: str, b: str, c: str, name: str | None = None) -> str:
        """a·b + c rounded once (``fmla``)."""
        return self.call(F, "llvm.fma.nxv4f32", (F, a), (F, b), (F, c), name=name)

    def column_predicates(self) -> None:
        """``%pn``: the columns < n of the group of columns at ``%j0`` (4 vectors), for the dst stores."""
        self.call(PN, "llvm.aarch64.sve.whilelt.c32", ("i64", "%j0"), ("i64", "%n"), ("i32", "4"), name="pn")

    def begin_column_groups(self) -> None:
        """The start of a tile's loop over its groups of columns (block ``n_loop``: ``%j0`` from 0, ``%rgroup`` from
        ``%rhs``) and the group's :meth:`column_predicates`; it ends in :meth:`end_column_groups`."""
        self.do("br label %n_loop")
        self.label("n_loop")
        self("phi i64 [0, %entry], [%j0.next, %m_end]", "j0")
        self("phi ptr [%rhs, %entry], [%rgroup.next, %m_end]", "rgroup")
        self.column_predicates()

    def begin_row_groups(self, rows: str, end: str) -> None:
        """The start of a MOPA tile's loop over its groups of ``rows`` rows (block ``m_loop``, back from block
        ``end``): ``%i0`` from 0, ``%lgroup`` from ``%lhs``, ``%rows`` the group's rows below m (the last group is
        partial: its rows past m are not stored), ``%dst0`` its first dst row."""
        self.do("br label %m_loop")
        self.label("m_loop")
        self(f"phi i64 [0, %n_loop], [%i0.next, %{end}]", "i0")
        self(f"phi ptr [%lhs, %n_loop], [%lgroup.next, %{end}]", "lgroup")
        left = self("sub i64 %m, %i0")
        self(f"select i1 {self(f'icmp ult i64 {left}, {rows}')}, i64 {left}, i64 {rows}", "rows")
        self(f"getelementptr i8, ptr %dstcol, i64 {self('mul i64 %i0, %rowbytes')}", "dst0")

    def begin_rows(self) -> None:
        """The start of a GEMV tile's loop over the rows of its column group (block ``m_loop``, back from block
        ``k_end``): ``%i`` from 0, ``%lrow`` from ``%lhs``."""
        self.do("br label %m_loop")
        self.label("m_loop")
        self("phi i64 [0, %n_loop], [%i.next, %k_end]", "i")
        self("phi ptr [%lhs, %n_loop], [%lrow.next, %k_end]", "lrow")

    def end_rows(self) -> None:
        """The end of :meth:`begin_rows`' loop: ``%i`` += 1, ``%lrow`` += ``%lstride``, back to ``m_loop`` while
        ``%i`` < ``%m``, else on to block ``m_end``."""
        self("add i64 %i, 1", "i.next")
        self("getelementptr i8, ptr %lrow, i64 %lstride", "lrow.next")
        self.do(f"br i1 {self('icmp ult i64 %i.next, %m')}, label %m_loop, label %m_end")

    def begin_float_blocks(self) -> None:
        """The start of a GEMV row's block loop (block ``k_loop``): ``%blk`` from 0 and the float accumulators
        ``%acc0`` … ``%acc3`` of the 4 column ranges from +0 (``%acc{v}.next`` at the end of a block)."""
        self.do("br label %k_loop")
        self.label("k_loop")
        self("phi i64 [0, %m_loop], [%blk.next, %k_loop]", "blk")
        for v in range(4):
            self(f"phi {F} [zeroinitializer, %m_loop], [%acc{v}.next, %k_loop]", f"acc{v}")

    def end_column_groups(self) -> None:
        """The end of a tile's loop over its groups of columns (block ``m_end``: ``%j0`` += ``%nr``, ``%rgroup`` +=
        ``%rstride``, back to ``n_loop`` while ``%j0`` < ``%n``) and of the function."""
        self.label("m_end")
        self("add i64 %j0, %nr", "j0.next")
        self("getelementptr i8, ptr %rgroup, i64 %rstride", "rgroup.next")
        self.do(f"br i1 {self('icmp ult i64 %j0.next, %n')}, label %n_loop, label %exit")
        self.label("exit")
        self.do("ret void")


def tile_module(symbol: str, body: IrText, lut: str | None = None, table: str = "offset") -> str:
    """The module (IR text) of a tile ``void symbol(ARGS)`` whose body ``body`` emitted: the entry point, locally
    streaming (``smstart sm``), turns ZA on (and with it ZT0, which holds ``lut``'s table, :func:`lut_definition`,
    when the tile uses ``luti4``), calls the body — a streaming function sharing ZA (and ZT0) — and turns ZA off."""
    shared = '"aarch64_inout_za" "aarch64_inout_zt0"' if lut else '"aarch64_inout_za"'
    entry = IrText()
    entry.call("void", "llvm.aarch64.sme.za.enable")
    entry.do(f"call void @{symbol}.body(i64 %m, i64 %n, i64 %nb, ptr %lhs, ptr %rhs, ptr %out) {shared}")
    entry.call("void", "llvm.aarch64.sme.za.disable")
    entry.do("ret void")
    declarations = {**body.declarations, **entry.declarations}
    functions = [
        *([lut_definition(lut, table)] if lut else []),
        f'define void @{symbol}({ARGS}) "aarch64_pstate_sm_body" {{',
        *entry.lines,
        "}",
        f"define internal void @{symbol}.body({ARGS}) noinline {_STREAMING} {shared} {{",
        *body.lines,
        "}",
    ]
    return "\n".join([*functions, *declarations.values()]) + "\n"


def streaming_module(symbol: str, body: IrText) -> str:
    """The module of a tile that uses no ZA: a locally streaming entry point (``smstart sm``) calling the body, a
    streaming function."""
    functions = [
        f'define void @{symbol}({ARGS}) "aarch64_pstate_sm_body" {{',
        f"  call void @{symbol}.body(i64 %m, i64 %n, i64 %nb, ptr %lhs, ptr %rhs, ptr %out)",
        "  ret void",
        "}",
        f"define internal void @{symbol}.body({ARGS}) noinline {_STREAMING} {{",
        *body.lines,
        "}",
    ]
    return "\n".join([*functions, *body.declarations.values()]) + "\n"


def sme1_module(za: str) -> Callable[[str, IrText], str]:
    """The module of an SME1 tile (the ``wrap`` of :func:`sme_tiles`): the tile ``za`` (the MOPA) uses ZA
    (:func:`tile_module`), the others not (:func:`streaming_module`)."""
    return lambda symbol, body: tile_module(symbol, body) if symbol == za else streaming_module(symbol, body)


def vl_module(symbol: str) -> str:
    """The module of ``i64 symbol()``: the streaming vector length in 32-bit lanes (``rdsvl``)."""
    body = IrText()
    body.label("entry")
    doublewords = body.call("i64", "llvm.aarch64.sme.cntsd")
    body.do(f"ret i64 {body(f'shl i64 {doublewords}, 1')}")
    return "\n".join([f"define i64 @{symbol}() {{", *body.lines, "}", *body.declarations.values()]) + "\n"


def vl_reader(symbol: str) -> Callable:
    """A numba intrinsic ``vl()``: the streaming vector length the tiles run at, in 32-bit lanes, from the installed
    :func:`vl_module` ``symbol`` (read at each call: it is the thread's)."""

    @intrinsic
    def vl(typingctx):
        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(64), [])
            return builder.call(cgutils.get_or_insert_function(builder.module, fnty, symbol), [])

        return types.int64(), codegen

    return vl


class SmeTiles(NamedTuple):
    """A family module's SME tiles (:func:`sme_tiles`), unpacked into the module's ``tile_module``, ``kernel_tile``,
    ``HOST_ISA`` and the numba callers of its tiles."""

    #: the module (IR text) of a tile by symbol (or of the VL function)
    tile_module: Callable[[str], str]
    #: the module of a kernel's tile for an ISA, or None (``Family.native``: ``kleidipy kernels --asm``)
    kernel_tile: Callable[[MatmulKernel, native.NativeIsa], str | None]
    #: the ISA the tiles are installed for on this host (None: not installed, not available)
    host_isa: native.NativeIsa | None
    #: :func:`kleidipy.core.native.caller` of each tile, in the order of their bodies, then the :func:`vl_reader`
    callers: tuple[Callable, ...]


def sme_tiles(
    host: native.NativeIsa | None,
    isas: tuple[str, ...],
    kernels: Iterable[tuple[str, str]],
    vl: str,
    bodies: Mapping[str, Callable],
    new_ir: Callable[[], IrText],
    wrap: Callable[[str, IrText], str],
) -> SmeTiles:
    """A family module's SME tiles: the tile of each symbol of ``bodies`` is ``wrap(symbol, body)`` of the body
    ``bodies[symbol]`` emits into ``new_ir()`` (:func:`tile_module`, :func:`streaming_module`), ``vl`` the symbol of
    its :func:`vl_module`; a kernel's tile (``kernels``: (symbol, kernel name) pairs) exists for the ISAs named
    ``isas``; the tiles are installed for ``host`` (a :func:`~kleidipy.core.native.host_isa`; None: nothing is
    built)."""

    def tile_module(symbol: str) -> str:
        if symbol == vl:
            return vl_module(vl)
        body = new_ir()
        bodies[symbol](body)
        return wrap(symbol, body)

    def kernel_tile(kernel: MatmulKernel, isa: native.NativeIsa) -> str | None:
        symbol = next((s for s, name in kernels if name == kernel.name), None)
        return tile_module(symbol) if symbol and isa.name in isas else None

    installed = native.install_tiles(host, lambda _isa: (tile_module(symbol) for symbol in (*bodies, vl)))
    return SmeTiles(tile_module, kernel_tile, installed, (*(native.caller(s) for s in bodies), vl_reader(vl)))


def sme2_tiles(
    kernels: Iterable[tuple[str, str]],
    vl: str,
    bodies: Mapping[str, Callable],
    new_ir: Callable[[], IrText],
    lut: str | None,
    table: str = "offset",
) -> SmeTiles:
    """:func:`sme_tiles` of SME2 tiles: for ``aarch64-sme2``, installed on a host with SME2, each the
    :func:`tile_module` of its body with ZT0's table ``lut`` (``table``: :func:`lut_definition`'s; None: no
    ZT0)."""
    return sme_tiles(
        native.host_isa("aarch64-sme2"),
        ("aarch64-sme2",),
        kernels,
        vl,
        bodies,
        new_ir,
        lambda symbol, body: tile_module(symbol, body, lut, table),
    )
