"""The Q8_0 SME2 kernels (``matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa``, the GEMM, and
``matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot``, the GEMV: LHS ``lhs_quant_pack_qai8dxp_f32``, RHS
``rhs_pack_nxk_qsi8cxp_qsi8cx_neon`` with nr = 4·VL, kr = 4) as native SME2 tiles in streaming mode, with the
instruction sequence of KleidiAI's own kernels and their arithmetic (the bits of ``jit.matmul_qai8dxp``).

How (as KleidiAI's kernels), per group of 4·VL columns (VL = SVL/32) and after ``zero {za}``, over the whole K
(k_int = 32·nb; per-channel scales: the int32 sums of all of K stay in ZA):

* MOPA (mr = VL rows): per K group of 4, the VL rows × 4 LHS bytes (one vector), the 4·VL columns × 4 RHS bytes
  (4 vectors, one ``ld1b``) and 4 ``smopa`` (4-way, into ZA0.S–ZA3.S: columns t·VL … t·VL + VL − 1 in tile t),
  8 K groups per iteration of the block loop. Then per row i: ``mova`` ZA0H.B[4i, 0:3] (row i of the four
  tiles), ``mla`` of the RHS row sums by the row's −zp (int32, wrapping), ``scvtf``, S = f32(scale·recip) and
  out = f32(f32(F·S) + bias) (``fmul``, ``fadd``: ``Recipe.FMUL_FADD``).
* SDOT (one row): per 16 K values ``ld1rqb`` of the row's 16 LHS bytes, 4 × ``ld1b`` of 4 vectors of RHS bytes
  (a K group each) and 4 multi-vector ``sdot za.s[w8, 0, vgx4]`` indexed by the K group, twice per block; then
  ``mova`` of the 4 ZA vectors, ``mla`` by −zp, ``scvtf`` and out = fma(S, F, bias) (``fmla`` into the bias:
  ``Recipe.FMA_BIAS``).

Both unclamped (the caller clamps). :func:`tile_module` gives the LLVM module (IR text: llvmlite's IR builder has
no scalable vectors and no SME attributes) for :func:`kleidipy.core.native.assembly` on any host; on an aarch64
host with SME2 the tiles are compiled at import (:data:`AVAILABLE`) and run whenever the kernel is bound to the
host's own SVL (the tiles' geometry is the streaming vector length they run at): :func:`matmul`, in the family's
tile chain (``ukernels.matmul_tiled``), which also runs the SME1 tiles of :mod:`.sme` on a host with SME but not
SME2 (the same symbols). As the Q4_0 family's SME2 tiles, they
need none of the SME ABI's support routines: each entry point is a locally streaming function that enables ZA
itself and calls the body, a streaming function sharing ZA.
"""

from __future__ import annotations

from collections.abc import Iterator

import numba

from kleidipy.core.sme2_ir import PN, B, F, IrText, P, W, sme2_tiles, tuple_type
from kleidipy.kernels.qai8dxp_qsi8cxp import vnni as qai8dxp_qsi8cxp_vnni

#: the tiles' symbols: GEMM (MOPA), GEMV (SDOT), and the streaming vector length in 32-bit lanes; those of the SME1
#: tiles (:mod:`.sme`) too, which a host with SME but not SME2 installs instead, so that :func:`matmul` calls
#: whichever tiles the host has
MOPA = "kleidipy_q8_0_sme_mopa"
SDOT = "kleidipy_q8_0_sme_dot"
VL = "kleidipy_q8_0_sme_vl"
#: the kernel of each tile
KERNELS = {
    MOPA: "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa",
    SDOT: "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot",
}
#: the SME kernels of the same layouts and recipes, which the tiles also run on an SME2 host
SME_KERNELS = {
    MOPA: "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa",
    SDOT: "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot",
}
#: K values of one iteration of a tile's block loop (k_int is a multiple)
BLOCK = 32
#: kr of the SME layouts (and the LHS chunk kbl of the MOPA one)
KR = 4


class Ir(IrText):
    """The lines of a function body and the declarations of the intrinsics it calls, with the parts of the tiles
    (:func:`mopa_body`, :func:`sdot_body`) that depend on the RHS layout — here int8, 4 bytes per column and K group;
    the int4 per-channel family's SME2 tiles read codes through ZT0 — and on the instructions: here SME2 (the SME1
    tiles of :mod:`.sme` have single-vector predicates, ZA reads and ``sdot`` into registers)."""

    #: vectors of RHS data of a block (32 K values of the 4·VL columns)
    rhs_block = 32

    def load_table(self) -> None:
        """The entry block's loads of what decoding the RHS needs (int8: nothing)."""

    def rhs_data(self) -> str:
        """The RHS data bytes per column (``%rdata`` = nr × this): k_int."""
        return "%kint"

    def mopa_rhs(self, rp: str, t: int) -> list[str]:
        """The 4 vectors of int8 of the block's K group t (4 bytes of each of the 4·VL columns) at ``rp``."""
        return self.load(self.at(rp, 4 * t, B), B, 4, "%pn8")

    def sdot_rhs(self, rp: str, h: int) -> Iterator[tuple[int, list[str]]]:
        """The block's K groups 4h + g at ``rp``, g = 0 .. 3 in turn: (g, its 4 vectors of int8) for the ``sdot``
        indexed by g."""
        for g in range(4):
            yield g, self.load(self.at(rp, 4 * (4 * h + g), B), B, 4, "%pn8")

    def vl_value(self) -> None:
        """The entry block's values after ``%vscale`` that the column predicates need (SME2: none)."""

    def predicates(self) -> None:
        """The entry block's all-true predicates after ``%ptrue``: predicates-as-counter of bytes and of words."""
        self.call(PN, "llvm.aarch64.sve.ptrue.c8", name="pn8")
        self.call(PN, "llvm.aarch64.sve.ptrue.c32", name="pn32")

    def za_row(self, r: str) -> list[str]:
        """The int32 dots of row ``r`` of ZA0.S .. ZA3.S (ZA array vectors 4r .. 4r + 3: one ``mova``)."""
        slice_ = self(f"trunc i64 {self(f'shl i64 {r}, 2')} to i32")
        za = self.call(tuple_type(B, 4), "llvm.aarch64.sme.read.hor.vg4.nxv16i8", ("i32", "0"), ("i32", slice_))
        return [self(f"bitcast {B} {x} to {W}") for x in self.parts(za, B, 4)]

    def dot_loop(self, lhs: str) -> tuple[str, str, list[str]]:
        """The SDOT tile's row: ZA zeroed, then :func:`block_loop` from ``lhs``; (LHS, RHS pointers, the
        accumulators: none, they are ZA's)."""
        self.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
        lp, rp = block_loop(self, "m_loop", lhs)
        return lp, rp, []

    def dot_group(self, acc: list[str], lhs: str, g: int, rhs: list[str], last: bool) -> list[str]:
        """Accumulate the 4 vectors ``rhs`` of a K group by lane g of ``lhs``: one multi-vector ``sdot`` into ZA."""
        values = [(B, x) for x in rhs]
        intrinsic = "llvm.aarch64.sme.sdot.lane.za32.vg1x4.nxv16i8"
        self.call("void", intrinsic, ("i32", "0"), *values, (B, lhs), ("i32", str(g)))
        return acc

    def dot_result(self, acc: list[str]) -> list[str]:
        """The row's 4 vectors of int32 dots (after the block loop): read from ZA."""
        return self.parts(self.call(tuple_type(W, 4), "llvm.aarch64.sme.read.vg1x4.nxv4i32", ("i32", "0")), W, 4)

    def splat(self, scalar: str, ty: str, elem: str) -> str:
        """``scalar`` (of type ``elem``) in every lane of ``ty`` (of a load: ``ld1rw``)."""
        one = self(f"insertelement {ty} poison, {elem} {scalar}, i64 0")
        return self(f"shufflevector {ty} {one}, {ty} poison, <vscale x 4 x i32> zeroinitializer")

    def column_params(self, params: str) -> tuple[list[str], list[str], list[str]]:
        """The column group's 4·VL int32 row sums, f32 scales and f32 biases (4 vectors each) at ``params``."""
        sums = self.load(params, W, 4, "%pn32")
        scales = self.load(self.at(params, 4, W), F, 4, "%pn32")
        biases = self.load(self.at(params, 8, W), F, 4, "%pn32")
        return sums, scales, biases

    def epilogue(self, za: list[str], params: tuple, lparams: str, row: str, fma_bias: bool) -> list[str]:
        """The 4 float32 vectors of a row's 4·VL columns from its int32 dots ``za``: ``params`` the column group's
        :meth:`column_params`; ``lparams`` points to the LHS group's mr int32 −zp then mr f32 recip, ``row`` the
        row's index in the group (an i64 value)."""
        off = self(f"load i32, ptr {self.at(lparams, row, 'i32')}, align 4")
        recip_at = self.at(self.at(lparams, "%mr", "i32"), row, "float")
        recip = self(f"load float, ptr {recip_at}, align 4")
        sums, scales, biases = params
        offs, recips = self.splat(off, W, "i32"), self.splat(recip, F, "float")
        acc = [self(f"add {W} {x}, {self(f'mul {W} {s}, {offs}')}") for x, s in zip(za, sums, strict=True)]
        floats = self.call(tuple_type(F, 4), "llvm.aarch64.sve.scvtf.x4.nxv4f32.nxv4i32", *[(W, x) for x in acc])
        f = self.parts(floats, F, 4)
        s = [self(f"fmul {F} {x}, {recips}") for x in scales]  # S = f32(scale·recip)
        if fma_bias:  # fma(S, F, bias): one rounding
            return [
                self.call(F, "llvm.fma.nxv4f32", (F, sv), (F, fv), (F, b))
                for sv, fv, b in zip(s, f, biases, strict=True)
            ]
        return [self(f"fadd {F} {self(f'fmul {F} {fv}, {sv}')}, {b}") for fv, sv, b in zip(f, s, biases, strict=True)]


def _prologue(ir: Ir, mr: str) -> None:
    """The entry block's common part: the group sizes (``%mr`` rows, ``%nr`` = 4·VL columns; their data and
    strides), ``%rowbytes`` of dst and the all-true predicates."""
    ir.label("entry")
    ir.load_table()
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir.vl_value()
    ir(mr, "mr")
    ir("shl i64 %vscale, 4", "nr")
    ir("shl i64 %nb, 5", "kint")
    ir("mul i64 %mr, %kint", "ldata")
    ir(f"add i64 %ldata, {ir('shl i64 %mr, 3')}", "lstride")
    ir(f"mul i64 %nr, {ir.rhs_data()}", "rdata")
    ir(f"add i64 %rdata, {ir('mul i64 %nr, 12')}", "rstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir.call(P, "llvm.aarch64.sve.ptrue.nxv16i1", ("i32", "31"), name="ptrue")
    ir.predicates()


def column_group(ir: Ir) -> None:
    """Start the loop over the groups of 4·VL columns (``%j0``, ``%rgroup``; ``%pn``: the columns < n, for the
    dst stores; ``%rparams``: the group's sums, scales, biases; ``%dstcol``: its first dst column). It ends in
    ``ir.end_column_groups()``."""
    ir.begin_column_groups()
    ir("getelementptr i8, ptr %rgroup, i64 %rdata", "rparams")
    ir(f"getelementptr i8, ptr %out, i64 {ir('shl i64 %j0, 2')}", "dstcol")


def block_loop(ir: Ir, pred: str, lhs: str) -> tuple[str, str]:
    """Start the block loop (block ``k_loop``, entered from ``pred``): the LHS pointer from ``lhs`` and the RHS
    pointer from the column group's, both advanced by :func:`_block_end`; returns them."""
    ir.do("br label %k_loop")
    ir.label("k_loop")
    ir("phi i64 [0, %" + pred + "], [%blk.next, %k_loop]", "blk")
    lp = ir(f"phi ptr [{lhs}, %{pred}], [%lp.next, %k_loop]", "lp")
    rp = ir(f"phi ptr [%rgroup, %{pred}], [%rp.next, %k_loop]", "rp")
    return lp, rp


def _block_end(ir: Ir, lhs_bytes: str | int) -> None:
    """Advance the block loop's pointers by a block (``lhs_bytes`` of LHS, ``ir.rhs_block`` vectors of RHS) and
    loop."""
    ir(f"getelementptr i8, ptr %lp, i64 {lhs_bytes}", "lp.next")
    ir(f"getelementptr {B}, ptr %rp, i64 {ir.rhs_block}", "rp.next")
    ir("add i64 %blk, 1", "blk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %blk.next, %nb')}, label %k_loop, label %k_end")
    ir.label("k_end")


def mopa_body(ir: Ir) -> None:
    """The MOPA tile: out [m, n] from LHS groups of VL rows (4 bytes each per K group: one vector) and RHS groups
    of 4·VL columns (4 int8 each per K group: 4 vectors, :meth:`Ir.mopa_rhs`)."""
    _prologue(ir, "shl i64 %vscale, 2")
    column_group(ir)
    ir.begin_row_groups("%mr", "rows_end")
    ir.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
    lp, rp = block_loop(ir, "m_loop", "%lgroup")
    for t in range(BLOCK // KR):  # K group t: VL rows × 4 int8 (1 vector), 4·VL columns × 4 int8 (4 vectors)
        lhs = ir(f"load {B}, ptr {ir.at(lp, t, B)}, align 1")
        for tile, values in enumerate(ir.mopa_rhs(rp, t)):
            predicates = ((P, "%ptrue"), (P, "%ptrue"))
            ir.call(
                "void", "llvm.aarch64.sme.smopa.wide.nxv16i8", ("i32", str(tile)), *predicates, (B, lhs), (B, values)
            )
    _block_end(ir, ir("shl i64 %mr, 5"))
    ir("getelementptr i8, ptr %lgroup, i64 %ldata", "lparams")
    params = ir.column_params("%rparams")  # loaded once for the rows of the group
    ir.do("br label %rows_loop")
    ir.label("rows_loop")  # row r: ZA array vectors 4r .. 4r + 3, row r of ZA0.S .. ZA3.S
    ir("phi i64 [0, %k_end], [%r.next, %rows_loop]", "r")
    ir("phi ptr [%dst0, %k_end], [%dst.next, %rows_loop]", "dst")
    ir.store(ir.epilogue(ir.za_row("%r"), params, "%lparams", "%r", fma_bias=False), "%dst")
    ir("add i64 %r, 1", "r.next")
    ir("getelementptr i8, ptr %dst, i64 %rowbytes", "dst.next")
    ir.do(f"br i1 {ir('icmp ult i64 %r.next, %rows')}, label %rows_loop, label %rows_end")
    ir.label("rows_end")
    ir("add i64 %i0, %mr", "i0.next")
    ir("getelementptr i8, ptr %lgroup, i64 %lstride", "lgroup.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i0.next, %m')}, label %m_loop, label %m_end")
    ir.end_column_groups()


def sdot_body(ir: Ir) -> None:
    """The SDOT tile: out [m, n] from LHS rows (k_int bytes in K order, −zp, recip) and RHS groups of 4·VL columns
    (4 int8 each per K group: 4 vectors, :meth:`Ir.sdot_rhs`), row after row."""
    _prologue(ir, "add i64 0, 1")
    column_group(ir)
    ir.begin_rows()
    lp, rp, acc = ir.dot_loop("%lrow")
    for h in range(BLOCK // 16):  # 16 LHS bytes (K groups 4h .. 4h + 3) in every 128-bit segment
        lhs = ir.call(B, "llvm.aarch64.sve.ld1rq.nxv16i8", (P, "%ptrue"), ("ptr", ir.at(lp, 16 * h)))
        for g, rhs in ir.sdot_rhs(rp, h):  # K group 4h + g: 4 vectors of int8
            acc = ir.dot_group(acc, lhs, g, rhs, last=h == BLOCK // 16 - 1 and g == 3)
    _block_end(ir, BLOCK)
    dots = ir.dot_result(acc)
    lparams = ir("getelementptr i8, ptr %lrow, i64 %kint")
    dst = ir(f"getelementptr i8, ptr %dstcol, i64 {ir('mul i64 %i, %rowbytes')}")
    ir.store(ir.epilogue(dots, ir.column_params("%rparams"), lparams, "0", fma_bias=True), dst)
    ir.end_rows()
    ir.end_column_groups()


#: the tiles (IR text): ``void symbol(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float* out)`` (:data:`MOPA`,
#: :data:`SDOT`: out [m, n] unclamped = the packed LHS × the packed RHS, k_int = 32·nb; m, n, nb at least 1, buffers
#: of whole groups; the geometry is the SVL it runs at: VL rows (MOPA) or one, 4·VL columns) and ``i64 VL()``
#: (:data:`VL`), for ``aarch64-sme2``, of the family's SME2 kernels and of the SME kernels they also run; installed
#: on a host with SME2 (``HOST_ISA``; None: no SME2, or not aarch64 — the tiles are not available); ``_host_vl`` the
#: vector length the tiles run at (read at each call: it is the thread's)
tile_module, kernel_tile, HOST_ISA, (_MOPA, _SDOT, _host_vl) = sme2_tiles(
    (*KERNELS.items(), *SME_KERNELS.items()), VL, {MOPA: mopa_body, SDOT: sdot_body}, Ir, None
)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):  # pragma: no cover - compiled (SME)
    """Whether the tiles run a layout (given as to ``vnni.is_vnni_layout``): the int8 layout of
    ``rhs_pack_nxk_qsi8cxp_qsi8cx_neon`` (probed as that function does) of the SME kernels bound to this host's SVL:
    nr = 4·VL, kr = kbl = 4 and VL rows (MOPA) or one (SDOT) per LHS group. Needs the tiles installed. The tile also
    needs the kernel's own recipe (:func:`tile_runs`)."""
    vl = _host_vl()
    if nr != 4 * vl or kbl != KR or blen != KR or not (mr == vl or mr == 1):
        return False
    return qai8dxp_qsi8cxp_vnni.is_vnni_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi)


@numba.njit(cache=True, nogil=True)
def tile_runs(mr, nr, kbl, kr, fma_bias):  # pragma: no cover - compiled (aarch64 with SME)
    """Whether :func:`matmul` runs a tile for this geometry and recipe (of the int8 SME layout): the MOPA tile for
    VL rows with f32(f32(F·S) + bias), the SDOT tile for one row with fma(S, F, bias), at the host's VL."""
    vl = _host_vl()
    if nr != 4 * vl or kbl != KR or kr != KR:
        return False
    return (mr == vl and not fma_bias) or (mr == 1 and fma_bias)


@numba.njit(cache=True, nogil=True)
def matmul(m, n, k_int, lhs_i8, rhs_u8, fma_bias, out):  # pragma: no cover - compiled (aarch64 with SME)
    """out[m, n] (C-contiguous float32, unclamped; m, n ≥ 1, k_int ≥ 32) of a layout :func:`is_native_layout` accepts
    and :func:`tile_runs` runs: the SDOT tile (``fma_bias``, one row per LHS group) or the MOPA tile. Needs the tiles
    installed (:data:`AVAILABLE` or ``sme.AVAILABLE``)."""
    ints = (m, n, k_int // BLOCK)
    if fma_bias:
        _SDOT(ints, lhs_i8, rhs_u8, out)
    else:
        _MOPA(ints, lhs_i8, rhs_u8, out)
