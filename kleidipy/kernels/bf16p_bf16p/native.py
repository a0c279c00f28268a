"""The BF16 kernels (F16 weights) as native aarch64 tiles: ``matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa``
and its SME1 twin ``..._sme_mopa`` (``bfmopa`` into ZA.S tiles), ``..._bf16p8x4_bf16p12x4b_8x12_neon_mmla``
(``bfmmla``) and ``..._bf16p1x4_bf16p12x4b_1x36_neon_dot`` (``bfdot``), with the instruction sequence of
KleidiAI's own kernels and their arithmetic (FPCR.EBF = 0 ``BFDotAdd``, module docstring of ``ukernels``: the bits of
``jit.matmul_bf16``).

How (as KleidiAI's kernels):

* MOPA (2VL rows × 2VL columns, VL = SVL/32): ZA0.S–ZA3.S (rows 0/VL × columns 0/VL) start at the bias — its
  2 vectors written into every tile row (``mova`` to ZA: KleidiAI's ``fmopa`` of 1.0 with the bias would turn a −0
  bias into +0) — then each K pair is 2 LHS and 2 RHS vectors and 4 ``bfmopa``, 4 pairs per loop iteration
  (``ld1h`` of 4 vectors on SME2, one vector each on SME1), the pairs left one at a time; the rows leave through
  ``mova`` and ``st1w`` under the column predicates. One tile for both kernels: SME2 hosts run the SME2 variant.
* MMLA (8 × 12): 24 accumulators [r0c0 r0c1 r1c0 r1c1] started at the bias pairs (``zip1``/``zip2`` .2d), per
  chunk of 4 K values 4 LHS vectors (row pairs) × 6 RHS vectors (column pairs), 24 ``bfmmla``; ``uzp1``/``uzp2``
  .2d to rows at the end.
* DOT (one row × 36 columns: 3 groups of 12): per group 6 accumulators [c (k0,k1), c (k2,k3), c+1 (k0,k1),
  c+1 (k2,k3)] started at [bias, 0, bias, 0] (``zip1``/``zip2`` .4s with 0), per chunk the 4 LHS values
  broadcast (``ld1r`` .2d) and 18 ``bfdot``; ``faddp`` adds the two halves.

The NEON tiles store whole tiles straight to dst and partial ones through a stack buffer.

:func:`tile_module` gives a tile's LLVM module (IR text: llvmlite's IR builder has neither scalable vectors, SME
attributes nor ``bfloat``) for :func:`kleidipy.core.native.assembly` on any host; on an aarch64 host with BF16
(NEON) or SME the tiles are compiled at import (:data:`NEON_ISA`, :data:`SME_ISA`) and
:func:`matmul_bf16_native` runs them where they apply. The SME entry point is locally streaming and enables ZA
itself (:func:`kleidipy.core.sme2_ir.tile_module`, no ZT0, no SME ABI routine). Hand-written for the reason of
:mod:`kleidipy.core.native`: numba's code never uses these instructions.
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core import native
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.sme2_ir import ARGS, PN, F, IrText, vl_module, vl_reader
from kleidipy.core.sme2_ir import tile_module as sme_tile_module
from kleidipy.kernels.bf16p_bf16p import jit

#: the tiles' symbols: the SME MOPA GEMM, the NEON MMLA GEMM and DOT GEMV, the streaming vector length
MOPA = "kleidipy_bf16_sme_mopa"
MMLA = "kleidipy_bf16_neon_mmla"
DOT = "kleidipy_bf16_neon_dot"
VL = "kleidipy_bf16_sme_vl"
#: the kernels of each tile
KERNELS = {
    MOPA: (
        "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa",
        "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme_mopa",
    ),
    MMLA: ("matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla",),
    DOT: ("matmul_clamp_f32_bf16p1x4_bf16p12x4b_1x36_neon_dot",),
}
#: the ISAs each tile is compiled for (the MOPA tile uses SME2's multi-vector loads where it may)
TILE_ISAS = {MOPA: ("aarch64-sme2", "aarch64-sme"), MMLA: ("aarch64-bf16",), DOT: ("aarch64-bf16",)}

BF, P4, P8 = "<vscale x 8 x bfloat>", "<vscale x 4 x i1>", "<vscale x 8 x i1>"
V4F, V8BF, V2I64 = "<4 x float>", "<8 x bfloat>", "<2 x i64>"
BFMMLA, BFDOT = "llvm.aarch64.neon.bfmmla", "llvm.aarch64.neon.bfdot.v4f32.v8bf16"


def _loop(ir: IrText, name: str, pred: str, phis: dict[str, tuple[str, str]] | None = None, latch: str = "") -> None:
    """Open loop ``name`` counting ``%name.i`` from 0 (entered from block ``pred``, repeated from block ``latch``,
    by default the loop's own), with the extra ``phis`` {name: (type, initial value)} whose next values are
    ``%<name>.next``."""
    latch = latch or name
    ir.do(f"br label %{name}")
    ir.label(name)
    ir(f"phi i64 [0, %{pred}], [%{name}.i.next, %{latch}]", f"{name}.i")
    for var, (ty, init) in (phis or {}).items():
        ir(f"phi {ty} [{init}, %{pred}], [%{var}.next, %{latch}]", var)


def _end_loop(ir: IrText, name: str, step: str | int, end: str, after: str) -> None:
    """Close loop ``name``: ``%name.i`` += step, again while below ``end``, then block ``after``."""
    ir(f"add i64 %{name}.i, {step}", f"{name}.i.next")
    ir.do(f"br i1 {ir(f'icmp ult i64 %{name}.i.next, {end}')}, label %{name}, label %{after}")
    ir.label(after)


def _min(ir: IrText, a: str, b: str | int) -> str:
    return ir(f"select i1 {ir(f'icmp ult i64 {a}, {b}')}, i64 {a}, i64 {b}")


# --------------------------------------------------------------------------------------------- SME MOPA


def _mopa_pairs(ir: IrText, sme2: bool, lp: str, rp: str, pairs: int) -> None:
    """``pairs`` K pairs at ``lp`` / ``rp`` (2 vectors per pair each): loads, then 4 ``bfmopa`` per pair."""
    if sme2:  # ld1h of 4 vectors (2 pairs), or of 2 (one pair)
        count = min(4, 2 * pairs)
        agg = "{" + ", ".join([BF] * count) + "}"
        lhs, rhs = [], []
        for base, out in ((lp, lhs), (rp, rhs)):
            for v in range(0, 2 * pairs, count):
                at = ir.at(base, v, BF)
                out.extend(
                    ir.parts(
                        ir.call(agg, f"llvm.aarch64.sve.ld1.pn.x{count}.nxv8bf16", (PN, "%pn16"), ("ptr", at)),
                        BF,
                        count,
                    )
                )
    else:
        lhs = [ir(f"load {BF}, ptr {ir.at(lp, v, BF)}, align 2") for v in range(2 * pairs)]
        rhs = [ir(f"load {BF}, ptr {ir.at(rp, v, BF)}, align 2") for v in range(2 * pairs)]
    for p in range(pairs):
        for tile in range(4):
            zn, zm = lhs[2 * p + tile // 2], rhs[2 * p + tile % 2]
            ir.call(
                "void",
                "llvm.aarch64.sme.mopa.wide.nxv8bf16",
                ("i32", str(tile)),
                (P8, "%p8"),
                (P8, "%p8"),
                (BF, zn),
                (BF, zm),
            )


def _mopa_rows(ir: IrText, name: str, pred: str, half: int, count: str) -> None:
    """Store ``count`` rows of tiles ZA(2·half), ZA(2·half + 1) (dst rows half·VL + r) under the column
    predicates; entered from block ``pred``, ends in block ``{name}.end``."""
    _loop(ir, name, pred)
    row = f"%{name}.i"
    slice_ = ir(f"trunc i64 {row} to i32")
    dst = ir.at("%dst0", ir(f"mul i64 {ir(f'add i64 {row}, %vl') if half else row}, %rowbytes"))
    for t in range(2):
        value = ir.call(
            F,
            "llvm.aarch64.sme.read.horiz.nxv4f32",
            (F, "poison"),
            (P4, "%p4"),
            ("i32", str(2 * half + t)),
            ("i32", slice_),
        )
        ir.call("void", "llvm.aarch64.sve.st1.nxv4f32", (F, value), (P4, f"%pcol{t}"), ("ptr", ir.at(dst, t, F)))
    _end_loop(ir, name, 1, count, f"{name}.end")


def _mopa_body(ir: IrText, sme2: bool) -> None:
    """out [m, n] from LHS groups of 2VL rows and RHS groups of 2VL columns (the bias, then the bf16), nb K pairs:
    row groups outer, column groups inner (as KleidiAI)."""
    ir.label("entry")
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir("shl i64 %vscale, 2", "vl")
    ir("shl i64 %vl, 1", "mr")
    ir("shl i64 %vscale, 5", "pairbytes")  # one K pair of a group: 2 vectors (as the 2VL f32 biases)
    ir("mul i64 %pairbytes, %nb", "ldata")
    ir("add i64 %ldata, %pairbytes", "rstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir("lshr i64 %nb, 2", "quads")
    ir("and i64 %nb, 3", "odd")
    ir("shl i64 %pairbytes, 2", "quadbytes")
    ir.call(P4, "llvm.aarch64.sve.ptrue.nxv4i1", ("i32", "31"), name="p4")
    ir.call(P8, "llvm.aarch64.sve.ptrue.nxv8i1", ("i32", "31"), name="p8")
    if sme2:
        ir.call(PN, "llvm.aarch64.sve.ptrue.c16", name="pn16")
    ir.do("br label %m_loop")
    ir.label("m_loop")
    ir("phi i64 [0, %entry], [%i0.next, %n_end]", "i0")
    ir("phi ptr [%lhs, %entry], [%lgroup.next, %n_end]", "lgroup")
    ir("sub i64 %m, %i0", "left")
    top = _min(ir, "%left", "%vl")
    ir(f"getelementptr i8, ptr %out, i64 {ir('mul i64 %i0, %rowbytes')}", "dstrow")
    ir.do("br label %n_loop")
    ir.label("n_loop")
    ir("phi i64 [0, %m_loop], [%j0.next, %n_next]", "j0")
    ir("phi ptr [%rhs, %m_loop], [%rgroup.next, %n_next]", "rgroup")
    ir("add i64 %j0, %mr", "j0.next")
    ir("getelementptr i8, ptr %rgroup, i64 %rstride", "rgroup.next")
    ir.call(P4, "llvm.aarch64.sve.whilelt.nxv4i1.i64", ("i64", "%j0"), ("i64", "%n"), name="pcol0")
    ir.call(P4, "llvm.aarch64.sve.whilelt.nxv4i1.i64", ("i64", ir("add i64 %j0, %vl")), ("i64", "%n"), name="pcol1")
    ir(f"getelementptr i8, ptr %dstrow, i64 {ir('shl i64 %j0, 2')}", "dst0")
    bias = [ir(f"load {F}, ptr {ir.at('%rgroup', t, F)}, align 4") for t in range(2)]
    _loop(ir, "init", "n_loop")  # every row of the 4 tiles starts at the bias
    slice_ = ir("trunc i64 %init.i to i32")
    if sme2:  # 4 rows of a tile at a time
        for tile in range(4):
            values = [(F, bias[tile % 2])] * 4
            ir.call("void", "llvm.aarch64.sme.write.hor.vg4.nxv4f32", ("i32", str(tile)), ("i32", slice_), *values)
        step = 4
    else:
        for tile in range(4):
            ir.call(
                "void",
                "llvm.aarch64.sme.write.horiz.nxv4f32",
                ("i32", str(tile)),
                ("i32", slice_),
                (P4, "%p4"),
                (F, bias[tile % 2]),
            )
        step = 1
    _end_loop(ir, "init", step, "%vl", "k")
    rdata = ir("getelementptr i8, ptr %rgroup, i64 %pairbytes")
    ir.do(f"br i1 {ir('icmp eq i64 %quads, 0')}, label %tail, label %quad")
    ir.label("quad")  # 4 K pairs
    ir("phi i64 [0, %k], [%quad.i.next, %quad]", "quad.i")
    ir("phi ptr [%lgroup, %k], [%lp.next, %quad]", "lp")
    ir(f"phi ptr [{rdata}, %k], [%rp.next, %quad]", "rp")
    _mopa_pairs(ir, sme2, "%lp", "%rp", 4)
    ir("getelementptr i8, ptr %lp, i64 %quadbytes", "lp.next")
    ir("getelementptr i8, ptr %rp, i64 %quadbytes", "rp.next")
    _end_loop(ir, "quad", 1, "%quads", "tail")
    done = ir("mul i64 %quads, %quadbytes")
    ir(f"getelementptr i8, ptr %lgroup, i64 {done}", "lt")
    ir(f"getelementptr i8, ptr {rdata}, i64 {done}", "rt")
    ir.do(f"br i1 {ir('icmp eq i64 %odd, 0')}, label %store, label %pair")
    ir.label("pair")  # the K pairs left, one at a time
    ir("phi i64 [0, %tail], [%pair.i.next, %pair]", "pair.i")
    offset = ir("mul i64 %pair.i, %pairbytes")
    _mopa_pairs(
        ir, sme2, ir(f"getelementptr i8, ptr %lt, i64 {offset}"), ir(f"getelementptr i8, ptr %rt, i64 {offset}"), 1
    )
    _end_loop(ir, "pair", 1, "%odd", "store")
    _mopa_rows(ir, "top", "store", 0, top)
    ir.do(f"br i1 {ir('icmp ugt i64 %left, %vl')}, label %bottom.start, label %n_next")
    ir.label("bottom.start")
    _mopa_rows(ir, "bottom", "bottom.start", 1, _min(ir, ir("sub i64 %left, %vl"), "%vl"))
    ir.do("br label %n_next")
    ir.label("n_next")
    ir.do(f"br i1 {ir('icmp ult i64 %j0.next, %n')}, label %n_loop, label %n_end")
    ir.label("n_end")
    ir("add i64 %i0, %mr", "i0.next")
    ir("getelementptr i8, ptr %lgroup, i64 %ldata", "lgroup.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i0.next, %m')}, label %m_loop, label %exit")
    ir.label("exit")
    ir.do("ret void")


# --------------------------------------------------------------------------------------------- NEON MMLA / DOT


def _copy_out(ir: IrText, pred: str, rows: str, cols: str, width: int) -> None:
    """Copy rows × cols floats of the stack buffer ``%buf`` (rows of ``width``) to dst at ``%dst0`` (rows of
    ``%rowbytes``): a partial tile. Entered from block ``pred``, ends in block ``copy.end``."""
    _loop(ir, "copyr", pred, latch="copyc.end")
    src = ir.at("%buf", ir(f"mul i64 %copyr.i, {width}"), "float")
    dst = ir.at("%dst0", ir("mul i64 %copyr.i, %rowbytes"))
    _loop(ir, "copyc", "copyr")
    value = ir(f"load float, ptr {ir.at(src, '%copyc.i', 'float')}, align 4")
    ir.do(f"store float {value}, ptr {ir.at(dst, '%copyc.i', 'float')}, align 4")
    _end_loop(ir, "copyc", 1, cols, "copyc.end")
    _end_loop(ir, "copyr", 1, rows, "copy.end")


def _mask(lanes: list[int]) -> str:
    """A shufflevector mask."""
    return f"<{len(lanes)} x i32> <" + ", ".join(f"i32 {x}" for x in lanes) + ">"


def _mmla_body(ir: IrText) -> None:
    """out [m, n] from LHS groups of 8 rows and RHS groups of 12 columns (12 f32 biases, then the bf16), nb
    chunks of 4 K values."""
    ir.label("entry")
    ir("shl i64 %nb, 6", "lstride")
    ir(f"add i64 {ir('mul i64 %nb, 96')}, 48", "rstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir("alloca [96 x float], align 16", "buf")
    ir.do("br label %m_loop")
    ir.label("m_loop")
    ir("phi i64 [0, %entry], [%i0.next, %n_end]", "i0")
    ir("phi ptr [%lhs, %entry], [%lgroup.next, %n_end]", "lgroup")
    rows = _min(ir, ir("sub i64 %m, %i0"), 8)
    ir(f"getelementptr i8, ptr %out, i64 {ir('mul i64 %i0, %rowbytes')}", "dstrow")
    ir.do("br label %n_loop")
    ir.label("n_loop")
    ir("phi i64 [0, %m_loop], [%j0.next, %n_next]", "j0")
    ir("phi ptr [%rhs, %m_loop], [%rgroup.next, %n_next]", "rgroup")
    ir("add i64 %j0, 12", "j0.next")
    ir("getelementptr i8, ptr %rgroup, i64 %rstride", "rgroup.next")
    cols = _min(ir, ir("sub i64 %n, %j0"), 12)
    ir(f"getelementptr i8, ptr %dstrow, i64 {ir('shl i64 %j0, 2')}", "dst0")
    bias = [ir(f"load {V4F}, ptr {ir.at('%rgroup', 16 * q)}, align 1") for q in range(3)]
    phis = {"lp": ("ptr", "%lgroup"), "rp": ("ptr", ir.at("%rgroup", 48))}
    for rp in range(4):  # accumulator (row pair, column pair) = [r0c0 r0c1 r1c0 r1c1] from the bias pair
        for cp in range(6):
            h = 2 * (cp % 2)
            init = ir(f"shufflevector {V4F} {bias[cp // 2]}, {V4F} poison, {_mask([h, h + 1, h, h + 1])}")
            phis[f"acc{rp}_{cp}"] = (V4F, init)
    _loop(ir, "k", "n_loop", phis)
    lhs = [ir(f"load {V8BF}, ptr {ir.at('%lp', 16 * rp)}, align 1") for rp in range(4)]
    for cp in range(6):
        rhs = ir(f"load {V8BF}, ptr {ir.at('%rp', 16 * cp)}, align 1")
        for rp in range(4):
            acc = f"%acc{rp}_{cp}"
            ir.call(V4F, BFMMLA, (V4F, acc), (V8BF, lhs[rp]), (V8BF, rhs), name=f"acc{rp}_{cp}.next")
    ir("getelementptr i8, ptr %lp, i64 64", "lp.next")
    ir("getelementptr i8, ptr %rp, i64 96", "rp.next")
    _end_loop(ir, "k", 1, "%nb", "k.end")
    values = {}  # (row, column quad) -> <4 x float>: UZP1/UZP2 .2d of two accumulators
    for rp in range(4):
        for j in range(3):
            a, b = f"%acc{rp}_{2 * j}.next", f"%acc{rp}_{2 * j + 1}.next"
            for r in range(2):
                values[2 * rp + r, j] = ir(
                    f"shufflevector {V4F} {a}, {V4F} {b}, {_mask([2 * r, 2 * r + 1, 2 * r + 4, 2 * r + 5])}"
                )
    whole = ir(f"and i1 {ir(f'icmp eq i64 {rows}, 8')}, {ir(f'icmp eq i64 {cols}, 12')}")
    ir.do(f"br i1 {whole}, label %whole, label %part")
    ir.label("whole")
    for (row, j), value in values.items():
        at = ir.at(ir.at("%dst0", ir(f"mul i64 %rowbytes, {row}")), 16 * j)
        ir.do(f"store {V4F} {value}, ptr {at}, align 4")
    ir.do("br label %n_next")
    ir.label("part")
    for (row, j), value in values.items():
        ir.do(f"store {V4F} {value}, ptr {ir.at('%buf', 48 * row + 16 * j)}, align 16")
    _copy_out(ir, "part", rows, cols, 12)
    ir.do("br label %n_next")
    ir.label("n_next")
    ir.do(f"br i1 {ir('icmp ult i64 %j0.next, %n')}, label %n_loop, label %n_end")
    ir.label("n_end")
    ir("add i64 %i0, 8", "i0.next")
    ir("getelementptr i8, ptr %lgroup, i64 %lstride", "lgroup.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i0.next, %m')}, label %m_loop, label %exit")
    ir.label("exit")
    ir.do("ret void")


def _dot_block(ir: IrText, groups: int) -> None:
    """A block of ``groups`` RHS groups (12 columns each) of the row: block ``g{groups}`` to ``n_next`` (whole)
    or ``copy.start`` (partial: through ``%buf``)."""
    name = f"k{groups}"
    ir.label(f"g{groups}")
    phis = {f"{name}.lp": ("ptr", "%lrow"), f"{name}.rp": ("ptr", ir.at("%rblock", 48))}
    for g in range(groups):
        base = ir.at("%rblock", ir(f"mul i64 %rstride, {g}"))
        bias = [ir(f"load {V4F}, ptr {ir.at(base, 16 * t)}, align 1") for t in range(3)]
        for q in range(6):  # columns 2q, 2q+1: [bias, 0, bias, 0] (ZIP1/ZIP2 .4s with 0)
            h = 2 * (q % 2)
            init = ir(f"shufflevector {V4F} {bias[q // 2]}, {V4F} zeroinitializer, {_mask([h, h + 4, h + 1, h + 5])}")
            phis[f"{name}.acc{g}_{q}"] = (V4F, init)
    _loop(ir, name, f"g{groups}", phis)
    one = ir(f"insertelement {V2I64} poison, i64 {ir(f'load i64, ptr %{name}.lp, align 1')}, i64 0")
    lhs = ir(
        f"bitcast {V2I64} {ir(f'shufflevector {V2I64} {one}, {V2I64} poison, <2 x i32> zeroinitializer')} to {V8BF}"
    )
    for g in range(groups):
        base = ir.at(f"%{name}.rp", ir(f"mul i64 %rstride, {g}"))
        for q in range(6):
            rhs = ir(f"load {V8BF}, ptr {ir.at(base, 16 * q)}, align 1")
            acc = f"{name}.acc{g}_{q}"
            ir.call(V4F, BFDOT, (V4F, f"%{acc}"), (V8BF, rhs), (V8BF, lhs), name=f"{acc}.next")
    ir(f"getelementptr i8, ptr %{name}.lp, i64 8", f"{name}.lp.next")
    ir(f"getelementptr i8, ptr %{name}.rp, i64 96", f"{name}.rp.next")
    _end_loop(ir, name, 1, "%nb", f"{name}.end")
    values = []  # FADDP: columns 12g + 4j .. + 3
    for g in range(groups):
        for j in range(3):
            halves = [(V4F, f"%{name}.acc{g}_{2 * j + h}.next") for h in range(2)]
            values.append(ir.call(V4F, "llvm.aarch64.neon.faddp.v4f32", *halves))
    ir.do(f"br i1 {ir(f'icmp eq i64 %cols, {12 * groups}')}, label %whole{groups}, label %part{groups}")
    ir.label(f"whole{groups}")
    for v, value in enumerate(values):
        ir.do(f"store {V4F} {value}, ptr {ir.at('%dst0', 16 * v)}, align 4")
    ir.do("br label %n_next")
    ir.label(f"part{groups}")
    for v, value in enumerate(values):
        ir.do(f"store {V4F} {value}, ptr {ir.at('%buf', 16 * v)}, align 16")
    ir.do("br label %copy.start")


def _dot_body(ir: IrText) -> None:
    """out [m, n] from LHS rows (nb chunks of 4 bf16 each) and RHS groups of 12 columns, 36 columns at a time."""
    ir.label("entry")
    ir("shl i64 %nb, 3", "lstride")
    ir(f"add i64 {ir('mul i64 %nb, 96')}, 48", "rstride")
    ir("mul i64 %rstride, 3", "bstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir("alloca [36 x float], align 16", "buf")
    ir.do("br label %m_loop")
    ir.label("m_loop")
    ir("phi i64 [0, %entry], [%i.next, %n_end]", "i")
    ir("phi ptr [%lhs, %entry], [%lrow.next, %n_end]", "lrow")
    ir(f"getelementptr i8, ptr %out, i64 {ir('mul i64 %i, %rowbytes')}", "dstrow")
    ir.do("br label %n_loop")
    ir.label("n_loop")
    ir("phi i64 [0, %m_loop], [%j0.next, %n_next]", "j0")
    ir("phi ptr [%rhs, %m_loop], [%rblock.next, %n_next]", "rblock")
    ir("add i64 %j0, 36", "j0.next")
    ir("getelementptr i8, ptr %rblock, i64 %bstride", "rblock.next")
    left = ir("sub i64 %n, %j0")
    ir(f"select i1 {ir(f'icmp ult i64 {left}, 36')}, i64 {left}, i64 36", "cols")
    ir(f"getelementptr i8, ptr %dstrow, i64 {ir('shl i64 %j0, 2')}", "dst0")
    groups = ir(f"udiv i64 {ir('add i64 %cols, 11')}, 12")
    ir.do(f"switch i64 {groups}, label %g3 [i64 1, label %g1 i64 2, label %g2]")
    for count in (1, 2, 3):
        _dot_block(ir, count)
    ir.label("copy.start")
    _copy_out(ir, "copy.start", "1", "%cols", 36)
    ir.do("br label %n_next")
    ir.label("n_next")
    ir.do(f"br i1 {ir('icmp ult i64 %j0.next, %n')}, label %n_loop, label %n_end")
    ir.label("n_end")
    ir("add i64 %i, 1", "i.next")
    ir("getelementptr i8, ptr %lrow, i64 %lstride", "lrow.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i.next, %m')}, label %m_loop, label %exit")
    ir.label("exit")
    ir.do("ret void")


# --------------------------------------------------------------------------------------------- modules, host


def tile_module(symbol: str, isa: native.NativeIsa | None = None) -> str:
    """The LLVM module (IR text) of ``symbol``: a tile ``void symbol(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float*
    out)`` (out [m, n] unclamped = the packed LHS × the packed RHS, nb K pairs (:data:`MOPA`) or chunks of 4 K
    values (:data:`MMLA`, :data:`DOT`); m, n, nb at least 1, buffers of whole groups; :data:`MOPA`'s geometry is
    the SVL it runs at, its SME2 variant for an ``isa`` with SME2) or ``i64 VL()`` (the streaming vector length in
    32-bit lanes)."""
    if symbol == VL:
        return vl_module(VL)
    body = IrText()
    if symbol == MOPA:
        _mopa_body(body, isa is not None and isa.has("+sme2"))
        return sme_tile_module(MOPA, body)
    {MMLA: _mmla_body, DOT: _dot_body}[symbol](body)
    return "\n".join([f"define void @{symbol}({ARGS}) {{", *body.lines, "}", *body.declarations.values()]) + "\n"


def kernel_tile(kernel: MatmulKernel, isa: native.NativeIsa) -> str | None:
    """The tile module (IR text) of one of the family's kernels for ``isa`` (None: no tile for that ISA)."""
    symbol = next((s for s, names in KERNELS.items() if kernel.name in names), None)
    return tile_module(symbol, isa) if symbol and isa.name in TILE_ISAS[symbol] else None


#: the native ISAs of this host's tiles (None: not available — the kernels run ``jit.matmul_bf16``)
SME_ISA = native.install_tiles(native.host_isa(*TILE_ISAS[MOPA]), lambda isa: (tile_module(s, isa) for s in (MOPA, VL)))
NEON_ISA = native.install_tiles(
    native.host_isa(*TILE_ISAS[MMLA]), lambda isa: (tile_module(s, isa) for s in (MMLA, DOT))
)

_SME, _NEON = SME_ISA is not None, NEON_ISA is not None
_MOPA, _MMLA, _DOT = native.caller(MOPA), native.caller(MMLA), native.caller(DOT)
#: the streaming vector length the MOPA tile runs at, in 32-bit lanes (read at each call: it is the thread's)
_host_vl = vl_reader(VL)


@numba.njit(cache=True, nogil=True)
def matmul_bf16_native(m, n, k, lhs, rhs, mr, nr, kr, two_accumulators):  # pragma: no cover - compiled
    """``jit.matmul_bf16`` (same signature, same bits) on the native tiles where they apply on this host: the MOPA
    tile for mr = nr = 2·VL of this host's SVL, kr 2; MMLA for 8 × 12, kr 4; DOT for 1 × 12, kr 4, two
    accumulators. Otherwise ``jit.matmul_bf16``."""
    if m > 0 and n > 0 and k > 0:
        ints = (m, n, (k + kr - 1) // kr)
        a, b = np.ascontiguousarray(lhs), np.ascontiguousarray(rhs)
        if _SME and kr == 2 and not two_accumulators and mr == nr and mr == 2 * _host_vl():
            out = np.empty((m, n), np.float32)
            _MOPA(ints, a, b, out)
            return out
        if _NEON and kr == 4 and nr == 12 and (mr, two_accumulators) in ((8, False), (1, True)):
            out = np.empty((m, n), np.float32)
            if mr == 8:
                _MMLA(ints, a, b, out)
            else:
                _DOT(ints, a, b, out)
            return out
    return jit.matmul_bf16(m, n, k, lhs, rhs, mr, nr, kr, two_accumulators)
