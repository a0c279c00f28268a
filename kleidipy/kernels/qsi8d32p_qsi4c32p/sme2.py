"""The Q4_0 SME2 kernels (``matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa``, the GEMM, and
``matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot``, the GEMV: LHS ``lhs_quant_pack_qsi8d32p_f32_neon``,
RHS ``qsi4c32ps1s0scalef16``) as native SME2 tiles in streaming mode, with the instruction sequence of KleidiAI's
own kernels (spec §5.3, §5.4) and their arithmetic (§5.2: the bits of ``vnni.compute``).

How (as KleidiAI's kernels): ZT0 holds the 16 int32 {−8, …, 7}; ``luti4`` turns the packed uint16 of 4 unsigned
codes per (K group, column) into int8 u − 8, column j at bytes 4j..4j+3 of its vector. Per block of 32 K values
and after ``zero {za}``:

* MOPA (mr = VL rows × nr = 4·VL columns, VL = SVL/32): for each of the 8 K groups, load the VL rows × 4
  LHS bytes (one vector), ``ld1b`` the 2 vectors of RHS codes, 2 ``luti4`` (2 registers each), 4 ``smopa``
  (4-way, into ZA0.S–ZA3.S: columns t·VL … t·VL + VL − 1 in tile t). Then per row i: ``mova`` ZA0H.B[4i, 0:3]
  (row i of the four tiles), ``scvtf``, the scales S = FMLALB/FMLALT(+0, s_L[i], s_R zipped), and ``fmul``
  (first block) or ``fmla`` into the dst row (``ld1w``/``st1w`` under the column predicate): dst holds the
  partial sums.
* SDOT (one row × nr = 4·VL columns): twice ``ld1rqb`` 16 LHS bytes (4 K groups), each time twice ``ld1b`` 4
  vectors of RHS codes (2 K groups), 4 ``luti4``, 2 multi-vector ``sdot za.s[w8, 0, vgx4]`` indexed by the K
  group; then ``mova`` the 4 ZA vectors out, ``scvtf``, S as above and ``fmla`` into 4 float accumulators (from
  +0), stored after the last block.

:func:`tile_module` gives the LLVM module (IR text: llvmlite's IR builder has no scalable vectors and no SME
attributes) for :func:`kleidipy.core.native.assembly` on any host; on an aarch64 host with SME2 it is compiled
at import for the host (:data:`AVAILABLE`) and :func:`compute_into` (``ukernels.SME2_COMPUTE`` there) runs the
tiles whenever the kernel is bound to the host's own SVL (the tiles' geometry is the streaming vector length they
run at), else the VNNI tiles' portable IR.
The tiles need none of the SME ABI's support routines (Debian bookworm's libgcc has none): each entry point is
a locally streaming function (``smstart sm``) that enables ZA itself (``smstart za``) and calls the body, a
streaming function sharing ZA and ZT0. Nothing above it has live ZA state (it is called from numba code), so
there is no lazy save to commit. Hand-written for the reason of :mod:`kleidipy.core.native`.
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.node import store_clamped
from kleidipy.core.sme2_ir import PN, B, F, H, IrText, P, W, sme2_tiles, tuple_type
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni
from kleidipy.kernels.qsi8d32p_qsi4c32p.sme import dot_body, mopa_body

#: the tiles' symbols: GEMM (MOPA), GEMV (SDOT), and the streaming vector length in 32-bit lanes
MOPA = "kleidipy_q4_0_sme2_mopa"
SDOT = "kleidipy_q4_0_sme2_sdot"
VL = "kleidipy_q4_0_sme2_vl"
#: the kernel of each tile
KERNELS = {
    MOPA: "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa",
    SDOT: "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot",
}

_LUT = "@kleidipy_q4_0_sme2_lut"
#: the global holding ZT0's table (:func:`~kleidipy.core.sme2_ir.lut_definition`)


class _Ir(IrText):
    """The lines of a function body and the declarations of the intrinsics it calls."""

    def rhs_scales(self, at: str) -> list[str]:
        """The 4·VL fp16 s_R of a block (2 vectors at ``at``) zipped: the even halves of the two results pair with
        columns [0, VL) and [VL, 2·VL), the odd halves with [2·VL, 3·VL) and [3·VL, 4·VL)."""
        s_r = self.load(at, H, 2, "%pn16")
        return self.parts(
            self.call(tuple_type(H, 2), "llvm.aarch64.sve.zip.x2.nxv8f16", (H, s_r[0]), (H, s_r[1])), H, 2
        )

    def za_row(self, r: str) -> list[str]:
        """The float32 dots of row ``r`` of ZA0.S .. ZA3.S (ZA array vectors 4r .. 4r + 3: one ``mova``, ``scvtf``)."""
        slice_ = self(f"trunc i64 {self(f'shl i64 {r}, 2')} to i32")
        za = self.call(tuple_type(B, 4), "llvm.aarch64.sme.read.hor.vg4.nxv16i8", ("i32", "0"), ("i32", slice_))
        return self.scvtf([self(f"bitcast {B} {x} to {W}") for x in self.parts(za, B, 4)])

    def load_row(self, at: str) -> list[str]:
        """``ld1w`` of the 4 vectors of a dst row at ``at`` under the column predicate ``%pn``."""
        return self.load(at, F, 4, "%pn")

    def scales(self, s_l_at: str, s_r: list[str]) -> list[str]:
        """S = s_L · s_R + 0 (FMLALB/FMLALT from +0: exact, a −0 product becomes +0) of the 4 column ranges:
        ``s_l_at`` points to the row's fp16 s_L, ``s_r`` from :meth:`rhs_scales`."""
        one = self(f"insertelement {H} poison, half {self(f'load half, ptr {s_l_at}, align 2')}, i64 0")
        s_l = self(f"shufflevector {H} {one}, {H} poison, <vscale x 8 x i32> zeroinitializer")
        return [
            self.call(F, f"llvm.aarch64.sve.fmlal{half}", (F, "zeroinitializer"), (H, s_l), (H, s_r[v]))
            for half, v in (("b", 0), ("b", 1), ("t", 0), ("t", 1))
        ]


def _prologue(ir: _Ir) -> None:
    """The entry block's common part: ZT0 ← the table, the RHS group sizes (``%nr`` = 4·VL columns, 2 bytes
    each per K group: 2 vectors), ``%rowbytes`` of dst and the all-true predicates."""
    ir.label("entry")
    ir.call("void", "llvm.aarch64.sme.ldr.zt", ("i32", "0"), ("ptr", _LUT))
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir("shl i64 %vscale, 4", "nr")
    ir("shl i64 %nr, 4", "rblock")  # code bytes of a block: 8 K groups
    ir("shl i64 %nr, 1", "rscale")  # scale bytes of a block
    ir("mul i64 %rblock, %nb", "rdata")
    ir(f"add i64 %rdata, {ir('mul i64 %rscale, %nb')}", "rstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir.call(P, "llvm.aarch64.sve.ptrue.nxv16i1", ("i32", "31"), name="ptrue")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c8", name="pn8")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c16", name="pn16")


def _mopa_prologue(ir: _Ir) -> None:
    """:func:`_prologue` and ``%mr``: VL, the rows of an LHS group (the MOPA tile's)."""
    _prologue(ir)
    ir("shl i64 %vscale, 2", "mr")


def _mopa_body(ir: _Ir) -> None:
    """The MOPA tile: the loops of ``sme.mopa_body`` (the SME1 tile's) with this module's steps."""
    mopa_body(ir, "%mr", _mopa_prologue, _Ir.luti4_mopa)


def _sdot_body(ir: _Ir) -> None:
    """The SDOT tile: the loops of ``sme.dot_body`` (the SME1 DOT tile's) with this module's steps."""
    dot_body(ir, _prologue, _Ir.luti4_sdot)


#: the tiles (IR text): ``void symbol(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float* out)`` (:data:`MOPA`,
#: :data:`SDOT`: out [m, n] unclamped = the packed LHS × the packed RHS; m, n, nb at least 1, buffers of whole groups;
#: the geometry is the SVL it runs at: VL rows (MOPA) or one, 4·VL columns) and ``i64 VL()`` (:data:`VL`: the
#: streaming vector length in 32-bit lanes, ``rdsvl``), for ``aarch64-sme2``; installed on a host with SME2
#: (``HOST_ISA``; None: no SME2, or not aarch64 — the tiles are not available); ``_host_vl`` the vector length the
#: tiles run at (read at each call: it is the thread's)
tile_module, kernel_tile, HOST_ISA, (_MOPA, _SDOT, _host_vl) = sme2_tiles(
    KERNELS.items(), VL, {MOPA: _mopa_body, SDOT: _sdot_body}, _Ir, _LUT
)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def compute_into(m, n, k, mr, nr, lhs, rhs, first_block_fmul, dst, ld):  # pragma: no cover - compiled (SME2)
    """``vnni.compute_into_host``'s signature and bits (the result clamped to ±FLT_MAX into the flat rows dst, row i
    at dst[i·ld :]): the MOPA tile for the GEMM (first-block FMUL) and the SDOT tile for the GEMV when the kernel is
    bound to this host's SVL (mr = VL or 1, nr = 4·VL), else the VNNI tiles' portable IR."""
    vl = _host_vl()
    if k >= 32 and nr == 4 * vl and mr == (vl if first_block_fmul else 1):
        out = np.empty((m, n), np.float32)
        ints = (m, n, k // 32)
        if first_block_fmul:
            _MOPA(ints, lhs, rhs, out)
        else:
            _SDOT(ints, lhs, rhs, out)
        store_clamped(out, dst, ld)
    else:
        vnni.compute_into_host(m, n, k, mr, nr, lhs, rhs, first_block_fmul, dst, ld)
