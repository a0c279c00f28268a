"""The Q8_0 SME1 kernels (``matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa``, the GEMM, and
``matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot``, the GEMV: LHS ``lhs_quant_pack_qai8dxp_f32``, RHS
``rhs_pack_nxk_qsi8cxp_qsi8cx_neon`` with nr = 4·VL, kr = 4) as native tiles for FEAT_SME without SME2 (e.g. Apple
M4), in streaming mode, with the instruction sequence of KleidiAI's own kernels and their arithmetic (the bits of
``jit.matmul_qai8dxp``). On an SME2 host the SME2 tiles (:mod:`.sme2`) run these kernels.

How (as KleidiAI's kernels; SME1 only: no multi-vector loads, stores, ``scvtf`` or ``mova``, no predicate-as-counter,
no ZA ``sdot``), per group of 4·VL columns (VL = SVL/32) over the whole K (k_int = 32·nb; per-channel scales: the
int32 sums of all of K are kept):

* MOPA (mr = VL rows), after ``zero {za}``: per K group of 4, the VL rows × 4 LHS bytes (one vector), the 4·VL
  columns × 4 RHS bytes (4 single-vector ``ld1b``) and 4 ``smopa`` (4-way, into ZA0.S–ZA3.S: columns t·VL …
  t·VL + VL − 1 in tile t), 8 K groups per iteration of the block loop. Then per row i: 4 ``mova`` of ZAtH.S[i]
  (row i of tile t), ``mla`` of the RHS row sums by the row's −zp (int32, wrapping), ``scvtf``, S =
  f32(scale·recip) and out = f32(f32(F·S) + bias) (``fmul``, ``fadd``: ``Recipe.FMUL_FADD``), ``st1w`` under the 4
  column predicates.
* DOT (one row; no ZA): per 16 K values ``ld1rqb`` of the row's 16 LHS bytes, per K group 4 ``ld1b`` of RHS bytes
  and 4 indexed ``sdot`` into 4 int32 vectors, twice per block; then ``mla`` by −zp, ``scvtf`` and out = fma(S, F,
  bias) (``fmla`` into the bias: ``Recipe.FMA_BIAS``).

Both unclamped (the caller clamps). :func:`tile_module` gives the LLVM module (IR text: llvmlite's IR builder has
no scalable vectors and no SME attributes) for :func:`kleidipy.core.native.assembly` on any host; on an aarch64
host with SME but not SME2 the tiles are compiled at import (:data:`AVAILABLE`) and run whenever the kernel is
bound to the host's own SVL, through ``sme2.matmul`` (both sets of tiles have the same symbols, the same layouts
and the same bits). Each entry point is a locally streaming function (``smstart
sm``) calling the body, a streaming function; the MOPA entry also turns ZA on and off itself (no SME ABI support
routine is called: Debian bookworm's libgcc has none). Hand-written for the reason of :mod:`kleidipy.core.native`:
numba never emits SME instructions.
"""

from __future__ import annotations

from kleidipy.core import native
from kleidipy.core.sme2_ir import B, F, W, sme1_module, sme_tiles
from kleidipy.kernels.qai8dxp_qsi8cxp import sme2
from kleidipy.kernels.qai8dxp_qsi8cxp.sme2 import Ir, block_loop, mopa_body, sdot_body

#: the tiles' symbols: GEMM (MOPA), GEMV (DOT), and the streaming vector length in 32-bit lanes — the SME2 tiles'
#: (an SME2 host installs those instead), so that ``sme2.matmul`` calls either
MOPA, DOT, VL = sme2.MOPA, sme2.SDOT, sme2.VL
#: the kernel of each tile
KERNELS = {
    MOPA: "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa",
    DOT: "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot",
}
#: the predicate of 32-bit lanes
P32 = "<vscale x 4 x i1>"


class _Ir(Ir):
    """:class:`sme2.Ir` with SME1's instructions: single-vector loads, stores, predicates, ZA reads and conversions,
    and the DOT tile's ``sdot`` into 4 vector accumulators (no ZA)."""

    def load(self, at: str, ty: str, count: int, pn: str = "") -> list[str]:
        """``ld1`` of ``count`` consecutive vectors of ``ty`` at ``at``, one instruction each (``pn`` unused: the
        whole vectors are loaded)."""
        return [self(f"load {ty}, ptr {self.at(at, v, ty)}, align 1") for v in range(count)]

    def store(self, values: list[str], at: str) -> None:
        """``st1w`` of 4 vectors of float32 at ``at`` under the column predicates ``%p0`` … ``%p3``."""
        for t, x in enumerate(values):
            self.call("void", "llvm.aarch64.sve.st1.nxv4f32", (F, x), (P32, f"%p{t}"), ("ptr", self.at(at, t, F)))

    def vl_value(self) -> None:
        """``%vl``: VL, the columns of a vector (for the column predicates)."""
        self("shl i64 %vscale, 2", "vl")

    def predicates(self) -> None:
        """``%ptrue32``: all 32-bit lanes."""
        self.call(P32, "llvm.aarch64.sve.ptrue.nxv4i1", ("i32", "31"), name="ptrue32")

    def column_predicates(self) -> None:
        """``%p0`` … ``%p3``: the columns < n of each vector of the column group, for the dst stores."""
        for t in range(4):
            start = self(f"add i64 %j0, {self(f'mul i64 %vl, {t}')}")
            self.call(P32, "llvm.aarch64.sve.whilelt.nxv4i1.i64", ("i64", start), ("i64", "%n"), name=f"p{t}")

    def za_row(self, r: str) -> list[str]:
        """The int32 dots of row ``r`` of ZA0.S .. ZA3.S: one ``mova`` per tile."""
        slice_ = self(f"trunc i64 {r} to i32")
        read = "llvm.aarch64.sme.read.horiz.nxv4i32"
        return [
            self.call(W, read, (W, "poison"), (P32, "%ptrue32"), ("i32", str(t)), ("i32", slice_)) for t in range(4)
        ]

    def dot_loop(self, lhs: str) -> tuple[str, str, list[str]]:
        """The DOT tile's row: ``block_loop`` from ``lhs`` and the 4 int32 accumulators (vectors, from 0; no ZA)."""
        lp, rp = block_loop(self, "m_loop", lhs)
        return (
            lp,
            rp,
            [self(f"phi {W} [zeroinitializer, %m_loop], [%acc{t}.next, %k_loop]", f"acc{t}") for t in range(4)],
        )

    def dot_group(self, acc: list[str], lhs: str, g: int, rhs: list[str], last: bool) -> list[str]:
        """The accumulators after a K group: an indexed ``sdot`` (lane g of ``lhs``) per vector of ``rhs`` (the
        block's ``last`` K group's named ``%acc<t>.next``, the values the loop carries)."""
        sdot = "llvm.aarch64.sve.sdot.lane.nxv4i32"
        return [
            self.call(W, sdot, (W, a), (B, x), (B, lhs), ("i32", str(g)), name=f"acc{t}.next" if last else None)
            for t, (a, x) in enumerate(zip(acc, rhs, strict=True))
        ]

    def dot_result(self, acc: list[str]) -> list[str]:
        """The row's int32 dots: the accumulators."""
        return acc

    def epilogue(self, za: list[str], params: tuple, lparams: str, row: str, fma_bias: bool) -> list[str]:
        """As :meth:`sme2.Ir.epilogue`, with one ``scvtf`` per vector."""
        off = self(f"load i32, ptr {self.at(lparams, row, 'i32')}, align 4")
        recip = self(f"load float, ptr {self.at(self.at(lparams, '%mr', 'i32'), row, 'float')}, align 4")
        sums, scales, biases = params
        offs, recips = self.splat(off, W, "i32"), self.splat(recip, F, "float")
        acc = [self(f"add {W} {x}, {self(f'mul {W} {s}, {offs}')}") for x, s in zip(za, sums, strict=True)]
        f = [self(f"sitofp {W} {x} to {F}") for x in acc]
        s = [self(f"fmul {F} {x}, {recips}") for x in scales]  # S = f32(scale·recip)
        if fma_bias:  # fma(S, F, bias): one rounding
            return [self.fma(sv, fv, b) for sv, fv, b in zip(s, f, biases, strict=True)]
        return [self(f"fadd {F} {self(f'fmul {F} {fv}, {sv}')}, {b}") for fv, sv, b in zip(f, s, biases, strict=True)]


#: the tiles (IR text, :data:`MOPA`, :data:`DOT` and :data:`VL`, as ``sme2.tile_module``'s) for ``aarch64-sme``;
#: installed on a host with SME but not SME2 (``HOST_ISA``; None: SME2 — the SME2 tiles serve — no SME, or not
#: aarch64), where ``sme2.matmul`` calls them (its callers are these tiles' symbols)
tile_module, kernel_tile, HOST_ISA, _ = sme_tiles(
    None if native.host_isa("aarch64-sme2") else native.host_isa("aarch64-sme"),
    ("aarch64-sme",),
    KERNELS.items(),
    VL,
    {MOPA: mopa_body, DOT: sdot_body},
    _Ir,
    sme1_module(MOPA),
)
AVAILABLE = HOST_ISA is not None
