"""The Q4_0 SME1 kernels (``matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme_mopa``, the GEMM, and
``matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme_dot``, the GEMV: LHS ``lhs_quant_pack_qsi8d32p_f32_neon``,
RHS ``qsi4c32ps4s0sf16``) as native tiles for FEAT_SME without SME2 (e.g. Apple M4), in streaming mode, with the
instruction sequence of KleidiAI's own kernels and the arithmetic of ``jit.matmul_qsi8d32p_qsi4c32ps4s0sf16``.

How (as KleidiAI's kernels; SME1 only: no ``luti4``, no ZT0, no multi-vector forms): the RHS holds a uint32 per
(8-value packet p, column), byte j the signed nibbles of k = 8p + j (low) and 8p + j + 4 (high); ``lsl #4``
turns the low nibbles into int8 16·w, ``and #0xf0`` the high ones, so each int32 dot is 16 × the true dot (the
stored scales are d/16). Per block of 32 K values, 4 packets of 4 vectors (4·VL columns, VL = SVL/32):

* MOPA (mr = VL rows × nr = 4·VL columns), after ``zero {za}``: per packet the VL rows × 4 LHS bytes of its two
  K groups (2 vectors), 4 ``lsl`` + 4 ``smopa`` (4-way, into ZA0.S–ZA3.S: columns t·VL … t·VL + VL − 1 in tile
  t) with the first one, 4 ``and`` + 4 ``smopa`` with the second. Then per row i: 4 ``mova`` of ZAtH.S[i] (row i
  of tile t), ``scvtf``, the scales S = FMLALB/FMLALT(+0, s_L[i], s_R zipped by ``zip1``/``zip2``), and
  ``fmul`` (first block) or ``fmla`` into the dst row (``ld1w``/``st1w`` under the 4 column predicates): dst
  holds the partial sums.
* DOT (one row × nr = 4·VL columns; no ZA): twice ``ld1rqb`` 16 LHS bytes (2 packets), per packet 4 ``ld1b`` of
  RHS words, 4 ``lsl`` + 4 ``and`` and 8 indexed ``sdot`` into 4 int32 vectors; then ``scvtf``, S as above and
  ``fmla`` into 4 float accumulators (from +0), stored after the last block.

:func:`tile_module` gives the LLVM module (IR text: llvmlite's IR builder has no scalable vectors and no SME attributes)
for :func:`kleidipy.core.native.assembly` on any host; on an aarch64 host with SME it is compiled at import for the host
(:data:`AVAILABLE`) and :func:`compute_s4s0` (``ukernels.SME_COMPUTE`` there) runs the tiles whenever the kernel is
bound to the host's own SVL (the tiles' geometry is the streaming vector length they run at), else the portable jit.
Each entry point is a locally streaming function (``smstart sm``) calling the body, a streaming function; the MOPA entry
also turns ZA on and off itself (no SME ABI support routine is called: Debian bookworm's libgcc has none). Hand-written
for the reason of :mod:`kleidipy.core.native`: numba never emits SME instructions.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np

from kleidipy.core import native
from kleidipy.core.sme2_ir import B, F, H, IrText, P, W, sme1_module, sme_tiles
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit

#: the tiles' symbols: GEMM (MOPA), GEMV (DOT), and the streaming vector length in 32-bit lanes
MOPA = "kleidipy_q4_0_sme_mopa"
DOT = "kleidipy_q4_0_sme_dot"
VL = "kleidipy_q4_0_sme_vl"
#: the kernel of each tile
KERNELS = {
    MOPA: "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme_mopa",
    DOT: "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme_dot",
}

#: the predicate of 32-bit lanes
P32 = "<vscale x 4 x i1>"


class _Ir(IrText):
    """The lines of a function body and the declarations of the intrinsics it calls."""

    def splat(self, ty: str, element: str, value: str, name: str | None = None) -> str:
        """The vector ``ty`` of ``element value`` in every lane (``dup``)."""
        one = self(f"insertelement {ty} poison, {element} {value}, i64 0")
        lanes = ty.rsplit(" x ", 1)[0] + " x i32>"
        return self(f"shufflevector {ty} {one}, {ty} poison, {lanes} zeroinitializer", name)

    def rhs_words(self, at: str) -> list[tuple[str, str]]:
        """(low, high) int8 16·w of the 4 vectors of RHS words at ``at`` (4·VL columns of one packet): ``lsl #4``
        and ``and #0xf0``."""
        words = [self(f"load {B}, ptr {self.at(at, t, B)}, align 1") for t in range(4)]
        return [(self(f"shl {B} {x}, %four"), self(f"and {B} {x}, %high")) for x in words]

    def rhs_scales(self, at: str) -> list[str]:
        """The 4·VL fp16 s_R of a block (2 vectors at ``at``) zipped: the even halves of ``zip1`` and ``zip2`` pair
        with columns [0, VL) and [VL, 2·VL), the odd halves with [2·VL, 3·VL) and [3·VL, 4·VL)."""
        s_r = [self(f"load {H}, ptr {self.at(at, v, H)}, align 2") for v in range(2)]
        return [self.call(H, f"llvm.aarch64.sve.{zip_}.nxv8f16", (H, s_r[0]), (H, s_r[1])) for zip_ in ("zip1", "zip2")]

    def scales(self, s_l_at: str, s_r: list[str]) -> list[str]:
        """S = s_L · s_R + 0 (FMLALB/FMLALT from +0: exact, a −0 product becomes +0) of the 4 column ranges:
        ``s_l_at`` points to the row's fp16 s_L, ``s_r`` from :meth:`rhs_scales`."""
        s_l = self.splat(H, "half", self(f"load half, ptr {s_l_at}, align 2"))
        return [
            self.call(F, f"llvm.aarch64.sve.fmlal{half}", (F, "zeroinitializer"), (H, s_l), (H, s_r[v]))
            for half, v in (("b", 0), ("b", 1), ("t", 0), ("t", 1))
        ]

    def load_row(self, at: str) -> list[str]:
        """``ld1w`` of the 4 vectors of a dst row at ``at`` under the column predicates."""
        return [
            self.call(F, "llvm.aarch64.sve.ld1.nxv4f32", (P32, f"%p{t}"), ("ptr", self.at(at, t, F))) for t in range(4)
        ]

    def za_row(self, r: str) -> list[str]:
        """The float32 dots of row ``r`` of ZA0.S .. ZA3.S (``mova`` of each tile's row, ``scvtf``)."""
        slice_ = self(f"trunc i64 {r} to i32")
        dots = []
        for tile in range(4):
            args = ((W, "poison"), (P32, "%ptrue32"), ("i32", str(tile)), ("i32", slice_))
            dots.append(self(f"sitofp {W} {self.call(W, 'llvm.aarch64.sme.read.horiz.nxv4i32', *args)} to {F}"))
        return dots

    def column_predicates(self) -> None:
        """``%p0`` … ``%p3``: the columns < n of each vector of the column group, for the dst stores."""
        for t in range(4):
            start = self(f"add i64 %j0, {self(f'mul i64 %vl, {t}')}")
            self.call(P32, "llvm.aarch64.sve.whilelt.nxv4i1.i64", ("i64", start), ("i64", "%n"), name=f"p{t}")

    def store(self, values: list[str], at: str) -> None:
        """``st1w`` of 4 vectors of float32 at ``at`` under the column predicates ``%p0`` … ``%p3``."""
        for t, x in enumerate(values):
            self.call("void", "llvm.aarch64.sve.st1.nxv4f32", (F, x), (P32, f"%p{t}"), ("ptr", self.at(at, t, F)))


def _prologue(ir: _Ir) -> None:
    """The entry block's common part: the RHS group sizes (``%nr`` = 4·VL columns, 16 bytes each per block),
    ``%rowbytes`` of dst, the all-true predicate and the nibble constants."""
    ir.label("entry")
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir("shl i64 %vscale, 2", "vl")
    ir("shl i64 %vscale, 4", "nr")
    ir("shl i64 %nr, 4", "rblock")  # code bytes of a block: 4 packets of 4 bytes
    ir("shl i64 %nr, 1", "rscale")  # scale bytes of a block
    ir("mul i64 %rblock, %nb", "rdata")
    ir(f"add i64 %rdata, {ir('mul i64 %rscale, %nb')}", "rstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir.call(P, "llvm.aarch64.sve.ptrue.nxv16i1", ("i32", "31"), name="ptrue")
    ir.call(P32, "llvm.aarch64.sve.ptrue.nxv4i1", ("i32", "31"), name="ptrue32")
    ir.splat(B, "i8", "4", "four")
    ir.splat(B, "i8", "-16", "high")


def _mopa_products(ir: _Ir, lp: str, rp: str) -> None:
    """A block's products into ZA0.S .. ZA3.S (``lp``, ``rp``: its LHS and RHS codes): per packet of 2 K groups,
    ``smopa`` of the low and high nibbles."""
    for p in range(4):  # packet p: K groups 2p, 2p + 1 (VL rows × 4 int8 each), 4·VL columns × 4 words
        lhs = [ir(f"load {B}, ptr {ir.at(lp, 2 * p + h, B)}, align 1") for h in range(2)]
        rhs = ir.rhs_words(ir.at(rp, 4 * p, B))
        for h in range(2):
            for tile, values in enumerate(rhs):
                predicates = ((P, "%ptrue"), (P, "%ptrue"))
                args = (("i32", str(tile)), *predicates, (B, lhs[h]), (B, values[h]))
                ir.call("void", "llvm.aarch64.sme.smopa.wide.nxv16i8", *args)


def column_group(ir: IrText) -> None:
    """Start the loop over the groups of 4·VL columns (``%j0``, ``%rgroup``; the column predicates, for dst;
    ``%rscales``: the group's s_R; ``%dstcol``: its first dst column). It ends in ``ir.end_column_groups()``."""
    ir.begin_column_groups()
    ir("getelementptr i8, ptr %rgroup, i64 %rdata", "rscales")
    ir(f"getelementptr i8, ptr %out, i64 {ir('shl i64 %j0, 2')}", "dstcol")


def _mopa_block(
    ir: IrText, prefix: str, pred: str, at: tuple[str, str, str, str], products: Callable[[IrText, str, str], None]
) -> None:
    """One block of the MOPA tile (``at``: the block's LHS codes, RHS codes, LHS scales, RHS scales; the code
    starts in block ``pred``; ``products``: its products into ZA) into the dst rows of the row group: FMUL for
    ``prefix`` "first", else FMLA into the stored partial sums. Ends in block ``{prefix}.end``."""
    lp, rp, ls, rs = at
    ir.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
    products(ir, lp, rp)
    s_r = ir.rhs_scales(rs)
    rows = f"{prefix}.rows"
    ir.do(f"br label %{rows}")
    ir.label(rows)  # row r: row r of ZA0.S .. ZA3.S
    ir(f"phi i64 [0, %{pred}], [%{prefix}.r.next, %{rows}]", f"{prefix}.r")
    ir(f"phi ptr [%dst0, %{pred}], [%{prefix}.dst.next, %{rows}]", f"{prefix}.dst")
    ir(f"phi ptr [{ls}, %{pred}], [%{prefix}.sl.next, %{rows}]", f"{prefix}.sl")
    dots = ir.za_row(f"%{prefix}.r")
    scale = ir.scales(f"%{prefix}.sl", s_r)
    if prefix == "first":  # FMUL: a −0 product stays −0
        acc = [ir(f"fmul {F} {s}, {a}") for s, a in zip(scale, dots, strict=True)]
    else:
        partial = ir.load_row(f"%{prefix}.dst")
        acc = [ir.fma(a, s, old) for a, s, old in zip(dots, scale, partial, strict=True)]
    ir.store(acc, f"%{prefix}.dst")
    ir(f"add i64 %{prefix}.r, 1", f"{prefix}.r.next")
    ir(f"getelementptr i8, ptr %{prefix}.dst, i64 %rowbytes", f"{prefix}.dst.next")
    ir(f"getelementptr i8, ptr %{prefix}.sl, i64 2", f"{prefix}.sl.next")
    ir.do(f"br i1 {ir(f'icmp ult i64 %{prefix}.r.next, %rows')}, label %{rows}, label %{prefix}.end")
    ir.label(f"{prefix}.end")


def mopa_body(
    ir: IrText,
    rows: str,
    prologue: Callable[[IrText], None],
    products: Callable[[IrText, str, str], None],
) -> None:
    """The MOPA tile's loops, of the SME1 tile here and of the SME2 one (:mod:`.sme2`, with its own steps): out
    [m, n] from LHS groups of VL rows (``rows``, the value of VL set by ``prologue``: 4 bytes each per K group, one
    vector) and RHS groups of 4·VL columns, nb blocks: the first one, then blocks 1 .. nb − 1 (``products``: a
    block's products into ZA, from its LHS and RHS codes), per group of columns (:func:`column_group` …
    ``ir.end_column_groups()``); the rows of ZA read by ``ir.za_row``, scaled, summed into dst."""
    prologue(ir)
    ir(f"shl i64 {rows}, 5", "lblock")
    ir(f"shl i64 {rows}, 1", "lscale")
    ir("mul i64 %lblock, %nb", "ldata")
    ir(f"add i64 %ldata, {ir('mul i64 %lscale, %nb')}", "lstride")
    column_group(ir)
    ir.begin_row_groups(rows, "k_end")
    ir("getelementptr i8, ptr %lgroup, i64 %ldata", "lscales")
    _mopa_block(ir, "first", "m_loop", ("%lgroup", "%rgroup", "%lscales", "%rscales"), products)
    ir.do(f"br i1 {ir('icmp ugt i64 %nb, 1')}, label %k_loop, label %k_end")
    ir.label("k_loop")
    ir("phi i64 [1, %first.end], [%blk.next, %next.end]", "blk")
    offsets = [ir(f"mul i64 %blk, %{size}") for size in ("lblock", "rblock", "lscale", "rscale")]
    bases = ("%lgroup", "%rgroup", "%lscales", "%rscales")
    at = tuple(ir.at(b, o) for b, o in zip(bases, offsets, strict=True))
    _mopa_block(ir, "next", "k_loop", at, products)
    ir("add i64 %blk, 1", "blk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %blk.next, %nb')}, label %k_loop, label %k_end")
    ir.label("k_end")
    ir(f"add i64 %i0, {rows}", "i0.next")
    ir("getelementptr i8, ptr %lgroup, i64 %lstride", "lgroup.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i0.next, %m')}, label %m_loop, label %m_end")
    ir.end_column_groups()


def _mopa_body(ir: _Ir) -> None:
    """The MOPA tile: :func:`mopa_body` with this module's steps (``%vl``: VL rows per LHS group)."""
    mopa_body(ir, "%vl", _prologue, _mopa_products)


def dot_body(
    ir: IrText,
    prologue: Callable[[IrText], None],
    block_dots: Callable[[IrText, str, str], list[str]],
) -> None:
    """The DOT tile's loops, of the SME1 tile here and of the SME2 one (:mod:`.sme2`, with its own steps): out
    [m, n] from LHS groups of one row (34 bytes per block) and RHS groups of 4·VL columns, nb blocks, row after row;
    ``block_dots(ir, lhs, rhs)``: the float32 dots of a block's 4 column ranges (its LHS and RHS codes at ``lhs`` and
    ``rhs``), scaled into 4 accumulators from +0, stored after the last block."""
    prologue(ir)
    ir("shl i64 %nb, 5", "ldata")
    ir("mul i64 %nb, 34", "lstride")
    column_group(ir)
    ir.begin_rows()
    ir("getelementptr i8, ptr %lrow, i64 %ldata", "lscales")
    ir.begin_float_blocks()
    lp = ir.at("%lrow", ir("shl i64 %blk, 5"))
    rp = ir.at("%rgroup", ir("mul i64 %blk, %rblock"))
    dots = block_dots(ir, lp, rp)
    s_r = ir.rhs_scales(ir.at("%rscales", ir("mul i64 %blk, %rscale")))
    scale = ir.scales(ir.at("%lscales", ir("shl i64 %blk, 1")), s_r)
    for v in range(4):
        ir.fma(dots[v], scale[v], f"%acc{v}", name=f"acc{v}.next")
    ir("add i64 %blk, 1", "blk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %blk.next, %nb')}, label %k_loop, label %k_end")
    ir.label("k_end")
    ir.store(
        [f"%acc{v}.next" for v in range(4)], ir(f"getelementptr i8, ptr %dstcol, i64 {ir('mul i64 %i, %rowbytes')}")
    )
    ir.end_rows()
    ir.end_column_groups()


def _dot_block(ir: _Ir, lp: str, rp: str) -> list[str]:
    """The float32 dots of one block of the DOT tile (``sdot`` by lane of the RHS words' low and high nibbles)."""
    ints = ["zeroinitializer"] * 4
    for h in range(2):  # 16 LHS bytes (packets 2h, 2h + 1: K groups 4h .. 4h + 3) in every 128-bit segment
        lhs = ir.call(B, "llvm.aarch64.sve.ld1rq.nxv16i8", (P, "%ptrue"), ("ptr", ir.at(lp, 16 * h)))
        for q in range(2):  # packet 2h + q: the low nibbles with K group 2q of the segment, the high with 2q + 1
            rhs = ir.rhs_words(ir.at(rp, 4 * (2 * h + q), B))
            for half in range(2):
                for t in range(4):
                    args = ((W, ints[t]), (B, rhs[t][half]), (B, lhs), ("i32", str(2 * q + half)))
                    ints[t] = ir.call(W, "llvm.aarch64.sve.sdot.lane.nxv4i32", *args)
    return [ir(f"sitofp {W} {x} to {F}") for x in ints]


def _dot_body(ir: _Ir) -> None:
    """The DOT tile: :func:`dot_body` with this module's steps."""
    dot_body(ir, _prologue, _dot_block)


#: the tiles (IR text): ``void symbol(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float* out)`` (:data:`MOPA`, :data:`DOT`:
#: out [m, n] unclamped = the packed LHS × the packed RHS; m, n, nb at least 1, buffers of whole groups; the geometry
#: is the SVL it runs at: VL rows (MOPA) or one, 4·VL columns) and ``i64 VL()`` (:data:`VL`: the streaming vector
#: length in 32-bit lanes, ``rdsvl``), for ISAs with SME; installed on a host with SME (``HOST_ISA``; None: no SME, or
#: not aarch64 — the tiles are not available); ``_host_vl`` the vector length the tiles run at (read at each call)
tile_module, kernel_tile, HOST_ISA, (_MOPA, _DOT, _host_vl) = sme_tiles(
    native.host_isa("aarch64-sme"),
    ("aarch64-sme", "aarch64-sme2"),
    KERNELS.items(),
    VL,
    {MOPA: _mopa_body, DOT: _dot_body},
    _Ir,
    sme1_module(MOPA),
)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def compute_s4s0(m, n, k, mr, nr, lhs, rhs, first_block_fmul):  # pragma: no cover - compiled (aarch64 with SME)
    """``jit.matmul_qsi8d32p_qsi4c32ps4s0sf16`` (same signature, same bits): the MOPA tile for the GEMM
    (first-block FMUL) and the DOT tile for the GEMV when the kernel is bound to this host's SVL (mr = VL or 1,
    nr = 4·VL) and the buffers hold whole groups, else the portable jit."""
    vl = _host_vl()
    nb = k // 32
    whole = lhs.size >= (m + mr - 1) // mr * mr * nb * 34 and rhs.size >= (n + nr - 1) // nr * nr * nb * 18
    if nb >= 1 and k % 32 == 0 and whole and nr == 4 * vl and mr == (vl if first_block_fmul else 1):
        out = np.empty((m, n), np.float32)
        ints = (m, n, nb)
        if first_block_fmul:
            _MOPA(ints, lhs, rhs, out)
        else:
            _DOT(ints, lhs, rhs, out)
        return out
    return jit.matmul_qsi8d32p_qsi4c32ps4s0sf16(m, n, k, mr, nr, lhs, rhs, first_block_fmul)
