"""The Q4_1 SME2 kernels (``matmul_clamp_f32_qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa``, the GEMM, and
``matmul_clamp_f32_qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot``, the GEMV: LHS
``lhs_quant_pack_qsi8d32pscalef32_f32_neon`` with kr/sr = 4, RHS ``qai4c32ps1s0nrx4``) as native SME2 tiles in
streaming mode, with the instruction sequence of KleidiAI's own kernels and the recipe of
:mod:`kleidipy.kernels.qsi8d32p_qai4c32p.ukernels` (the bits of ``jit.matmul``), as the Q4_0 tiles
(:mod:`kleidipy.kernels.qsi8d32p_qsi4c32p.sme2`).

How (as KleidiAI's kernels): ZT0 holds the 16 int32 {−8, …, 7}; ``luti4`` turns the uint16 of 4 unsigned codes
per (K group, column) into int8 u − 8, column j at bytes 4j..4j+3 of its vector. A block (32 K values) of an LHS
group of mr rows is mr·32 int8 (K group t: 4 bytes per row, one vector when mr = VL), mr f32 row sums rs and mr
f32 recips rc; of an RHS group of nr = 4·VL columns: 8 K groups × 2 vectors of codes, 4 vectors of f32 zeros and
4 of f32 scales; the group's 4 vectors of f32 biases follow its last block. Per block, after ``zero {za}``:

* MOPA (VL rows × 4·VL columns): for each of the 8 K groups, load the LHS vector, ``ld1b`` the 2 vectors of RHS
  codes, 2 ``luti4`` (2 registers each), 4 ``smopa`` (4-way, into ZA0.S–ZA3.S: columns t·VL … t·VL + VL − 1 in
  tile t). Then per row i: ``mova`` ZA0H.B[4i, 0:3] (row i of the four tiles), ``scvtf``, S = ``fmul``(scale,
  rc[i]) and into the dst row (``ld1w``/``st1w`` under the column predicate): the first block
  acc = fma(S, dot, fmul(zero, rs[i])) (KleidiAI's first-block FMUL), the others acc = fma(S, dot, fma(zero,
  rs[i], dst)). After the last block dst += bias, row by row.
* DOT (one row × 4·VL columns): twice ``ld1rqb`` 16 LHS bytes (4 K groups), each time twice ``ld1b`` 4 vectors of
  RHS codes (2 K groups), 4 ``luti4``, 2 multi-vector ``sdot za.s[w8, 0, vgx4]`` indexed by the K group; then
  ``mova`` the 4 ZA vectors out, ``scvtf``, and into 4 float accumulators (from +0): acc = fma(zero, rs, acc),
  acc = fma(fmul(scale, rc), dot, acc); after the last block acc + bias is stored.

:func:`tile_module` gives the LLVM module (IR text: llvmlite's IR builder has no scalable vectors and no SME
attributes) for :func:`kleidipy.core.native.assembly` on any host; on an aarch64 host with SME2 it is compiled at
import for the host (:data:`AVAILABLE`), and :func:`compute` (``ukernels.SME2_COMPUTE`` there) runs the tiles
whenever the kernel is bound to the host's own SVL (the tiles' geometry is the streaming vector length they run
at), else the portable loops. Each entry point is a locally streaming function that enables ZA itself and calls the
body, a streaming function sharing ZA and ZT0: no SME ABI support routine is needed.
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.sme2_ir import PN, B, F, IrText, P, W, sme2_tiles, tuple_type
from kleidipy.kernels.qsi8d32p_qai4c32p import jit as _jit

#: the tiles' symbols: GEMM (MOPA), GEMV (DOT), and the streaming vector length in 32-bit lanes
MOPA = "kleidipy_q4_1_sme2_mopa"
DOT = "kleidipy_q4_1_sme2_dot"
VL = "kleidipy_q4_1_sme2_vl"
#: the kernel of each tile
KERNELS = {
    MOPA: "matmul_clamp_f32_qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa",
    DOT: "matmul_clamp_f32_qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot",
}
BL = _jit.BL
LHS_BLOCK = _jit.LHS_BLOCK_BYTES  # per row: 32 int8, f32 row sum, f32 recip
RHS_BLOCK = _jit.RHS_BLOCK_BYTES  # per column: 16 bytes of codes, f32 zero, f32 scale

_LUT = "@kleidipy_q4_1_sme2_lut"
#: the global holding ZT0's table (:func:`~kleidipy.core.sme2_ir.lut_definition`)


class _Ir(IrText):
    """The lines of a function body and the declarations of the intrinsics it calls."""

    def splat(self, at: str) -> str:
        """The float32 at ``at`` in every lane (``ld1rw``)."""
        one = self(f"insertelement {F} poison, float {self(f'load float, ptr {at}, align 4')}, i64 0")
        return self(f"shufflevector {F} {one}, {F} poison, <vscale x 4 x i32> zeroinitializer")

    def params(self, rp: str) -> tuple[list[str], list[str]]:
        """The f32 zeros and scales of the RHS block at ``rp`` (4 vectors each: the 4·VL columns)."""
        return self.load(self.at(rp, "%zoff"), F, 4, "%pn32"), self.load(self.at(rp, "%soff"), F, 4, "%pn32")


def _prologue(ir: _Ir) -> None:
    """The entry block's common part: ZT0 ← the table, the RHS group sizes (``%nr`` = 4·VL columns: per block
    ``%rblock`` bytes, the zeros at ``%zoff``, the scales at ``%soff``; the biases at ``%rdata``), ``%rowbytes`` of
    dst and the all-true predicates."""
    ir.label("entry")
    ir.call("void", "llvm.aarch64.sme.ldr.zt", ("i32", "0"), ("ptr", _LUT))
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir("shl i64 %vscale, 4", "nr")
    ir("shl i64 %nr, 4", "zoff")  # code bytes of a block: 8 K groups × 2 bytes per column
    ir("mul i64 %nr, 20", "soff")
    ir(f"mul i64 %nr, {RHS_BLOCK}", "rblock")
    ir("mul i64 %rblock, %nb", "rdata")
    ir(f"add i64 %rdata, {ir('shl i64 %nr, 2')}", "rstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir.call(P, "llvm.aarch64.sve.ptrue.nxv16i1", ("i32", "31"), name="ptrue")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c8", name="pn8")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c32", name="pn32")


def _column_group(ir: _Ir) -> None:
    """Start the loop over the groups of 4·VL columns (``%j0``, ``%rgroup``; ``%pn``: the columns < n, for dst;
    ``%bias``: the group's 4 vectors of biases; ``%dstcol``: its first dst column). It ends in
    ``ir.end_column_groups()``."""
    ir.begin_column_groups()
    ir(f"getelementptr i8, ptr %out, i64 {ir('shl i64 %j0, 2')}", "dstcol")


def _bias(ir: _Ir) -> list[str]:
    """The 4 vectors of f32 biases of the column group (after its last block)."""
    return ir.load(ir.at("%rgroup", "%rdata"), F, 4, "%pn32")


def _mopa_block(ir: _Ir, prefix: str, pred: str, lp: str, rp: str) -> None:
    """One block of the MOPA tile (``lp``, ``rp``: the block's LHS and RHS; the code starts in block ``pred``) into
    the dst rows of the row group: the first-block FMUL of the zero term for ``prefix`` "first", else FMLA onto the
    stored partial sums. Ends in block ``{prefix}.end``."""
    ir.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
    ir.luti4_mopa(lp, rp)
    zero, scale = ir.params(rp)
    sums = ir.at(lp, "%lsum")
    rows = f"{prefix}.rows"
    ir.do(f"br label %{rows}")
    ir.label(rows)  # row r: ZA array vectors 4r .. 4r + 3, row r of ZA0.S .. ZA3.S
    ir(f"phi i64 [0, %{pred}], [%{prefix}.r.next, %{rows}]", f"{prefix}.r")
    ir(f"phi ptr [%dst0, %{pred}], [%{prefix}.dst.next, %{rows}]", f"{prefix}.dst")
    ir(f"phi ptr [{sums}, %{pred}], [%{prefix}.rs.next, %{rows}]", f"{prefix}.rs")
    rs = ir.splat(f"%{prefix}.rs")
    rc = ir.splat(ir.at(f"%{prefix}.rs", "%lfield"))
    slice_ = ir(f"trunc i64 {ir(f'shl i64 %{prefix}.r, 2')} to i32")
    za = ir.call(tuple_type(B, 4), "llvm.aarch64.sme.read.hor.vg4.nxv16i8", ("i32", "0"), ("i32", slice_))
    dots = ir.scvtf([ir(f"bitcast {B} {x} to {W}") for x in ir.parts(za, B, 4)])
    s = [ir(f"fmul {F} {x}, {rc}") for x in scale]
    if prefix == "first":  # FMUL of the zero term: a −0 product stays −0
        acc = [ir(f"fmul {F} {z}, {rs}") for z in zero]
    else:
        partial = ir.load(f"%{prefix}.dst", F, 4, "%pn")
        acc = [ir.fma(z, rs, old) for z, old in zip(zero, partial, strict=True)]
    ir.store([ir.fma(x, d, a) for x, d, a in zip(s, dots, acc, strict=True)], f"%{prefix}.dst")
    ir(f"add i64 %{prefix}.r, 1", f"{prefix}.r.next")
    ir(f"getelementptr i8, ptr %{prefix}.dst, i64 %rowbytes", f"{prefix}.dst.next")
    ir(f"getelementptr i8, ptr %{prefix}.rs, i64 4", f"{prefix}.rs.next")
    ir.do(f"br i1 {ir(f'icmp ult i64 %{prefix}.r.next, %rows')}, label %{rows}, label %{prefix}.end")
    ir.label(f"{prefix}.end")


def _mopa_body(ir: _Ir) -> None:
    """The MOPA tile: out [m, n] from LHS groups of VL rows (``%mr``) and RHS groups of 4·VL columns, nb blocks:
    the first one, then blocks 1 .. nb − 1, then the biases."""
    _prologue(ir)
    ir("shl i64 %vscale, 2", "mr")
    ir(f"mul i64 %mr, {LHS_BLOCK}", "lblock")
    ir(f"mul i64 %mr, {BL}", "lsum")  # the row sums after the int8, the recips after them
    ir("shl i64 %mr, 2", "lfield")
    ir("mul i64 %lblock, %nb", "lstride")
    _column_group(ir)
    bias = _bias(ir)
    ir.begin_row_groups("%mr", "bias.end")
    _mopa_block(ir, "first", "m_loop", "%lgroup", "%rgroup")
    ir.do(f"br i1 {ir('icmp ugt i64 %nb, 1')}, label %k_loop, label %k_end")
    ir.label("k_loop")
    ir("phi i64 [1, %first.end], [%blk.next, %next.end]", "blk")
    lp = ir.at("%lgroup", ir("mul i64 %blk, %lblock"))
    rp = ir.at("%rgroup", ir("mul i64 %blk, %rblock"))
    _mopa_block(ir, "next", "k_loop", lp, rp)
    ir("add i64 %blk, 1", "blk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %blk.next, %nb')}, label %k_loop, label %k_end")
    ir.label("k_end")
    ir.do("br label %bias")
    ir.label("bias")  # dst += bias, row by row
    ir("phi i64 [0, %k_end], [%b.r.next, %bias]", "b.r")
    ir("phi ptr [%dst0, %k_end], [%b.dst.next, %bias]", "b.dst")
    partial = ir.load("%b.dst", F, 4, "%pn")
    ir.store([ir(f"fadd {F} {x}, {y}") for x, y in zip(partial, bias, strict=True)], "%b.dst")
    ir("add i64 %b.r, 1", "b.r.next")
    ir("getelementptr i8, ptr %b.dst, i64 %rowbytes", "b.dst.next")
    ir.do(f"br i1 {ir('icmp ult i64 %b.r.next, %rows')}, label %bias, label %bias.end")
    ir.label("bias.end")
    ir("add i64 %i0, %mr", "i0.next")
    ir("getelementptr i8, ptr %lgroup, i64 %lstride", "lgroup.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i0.next, %m')}, label %m_loop, label %m_end")
    ir.end_column_groups()


def _dot_body(ir: _Ir) -> None:
    """The DOT tile: out [m, n] from LHS groups of one row (40 bytes per block) and RHS groups of 4·VL columns,
    nb blocks, row after row."""
    _prologue(ir)
    ir(f"mul i64 %nb, {LHS_BLOCK}", "lstride")
    _column_group(ir)
    bias = _bias(ir)
    ir.begin_rows()
    ir.begin_float_blocks()
    lp = ir.at("%lrow", ir(f"mul i64 %blk, {LHS_BLOCK}"))
    rp = ir.at("%rgroup", ir("mul i64 %blk, %rblock"))
    dots = ir.luti4_sdot(lp, rp)
    zero, scale = ir.params(rp)
    rs, rc = ir.splat(ir.at(lp, BL)), ir.splat(ir.at(lp, BL + 4))
    for v in range(4):  # the zero term, then the scale term, both fused
        acc = ir.fma(zero[v], rs, f"%acc{v}")
        ir.fma(ir(f"fmul {F} {scale[v]}, {rc}"), dots[v], acc, name=f"acc{v}.next")
    ir("add i64 %blk, 1", "blk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %blk.next, %nb')}, label %k_loop, label %k_end")
    ir.label("k_end")
    dst = ir(f"getelementptr i8, ptr %dstcol, i64 {ir('mul i64 %i, %rowbytes')}")
    ir.store([ir(f"fadd {F} %acc{v}.next, {bias[v]}") for v in range(4)], dst)
    ir.end_rows()
    ir.end_column_groups()


#: the tiles (IR text, :data:`MOPA`, :data:`DOT`, and ``i64 VL()``, :data:`VL`: the streaming vector length in 32-bit
#: lanes) for ``aarch64-sme2``; installed on a host with SME2 (``HOST_ISA``; None: no SME2, or not aarch64 — the
#: tiles are not available); ``_host_vl`` the vector length the tiles run at (read at each call: it is the thread's)
tile_module, kernel_tile, HOST_ISA, (_MOPA, _DOT, _host_vl) = sme2_tiles(
    KERNELS.items(), VL, {MOPA: _mopa_body, DOT: _dot_body}, _Ir, _LUT
)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def _tiles(m, n, k, lhs, rhs, first_block_fmul):  # pragma: no cover - compiled (aarch64 with SME2)
    """float32 [m, n] = unclamped dst of the MOPA (``first_block_fmul``) or DOT kernel on its tile."""
    out = np.empty((m, n), np.float32)
    ints = (m, n, k // BL)
    if first_block_fmul:
        _MOPA(ints, lhs, rhs, out)
    else:
        _DOT(ints, lhs, rhs, out)
    return out


@numba.njit(cache=True, nogil=True)
def compute(m, n, k, mr, nr, lhs, rhs, first_block_fmul):  # pragma: no cover - compiled (aarch64 with SME2)
    """The SME2 kernels (``jit.matmul_sme2``'s signature and bits): the MOPA (``first_block_fmul``) or DOT tile
    when the kernel is bound to this host's SVL (mr = VL or 1, nr = 4·VL), else the portable loops."""
    vl = _host_vl()
    if nr == 4 * vl and mr == (vl if first_block_fmul else 1):
        return _tiles(m, n, k, lhs, rhs, first_block_fmul)
    return _jit.matmul_sme2(m, n, k, mr, nr, lhs, rhs, first_block_fmul)
