"""The F16-LHS Q4_0 SME2 kernel (``matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa``: LHS
``lhs_pack_f16pmrx2_f32_neon``, RHS ``qsi4c32ps1s0scalef16``) as a native SME2 tile in streaming mode, with the
instruction sequence of KleidiAI's kernel and its arithmetic (the bits of :mod:`.jit`).

How (as KleidiAI's kernel): ZT0 holds the F16 values −8 … 7 (the low halfword of each entry); per group of 4·VL
columns and VL rows (VL = SVL/32), after ``zero {za}``, per block of 32 K values the 4·VL F16 scales (``ld1h`` of
two vectors) zipped with themselves (each scale for a column's K pair), then per K quad: ``ld2b`` of the columns'
uint16 codes (low bytes: the quad's first K pair, high bytes: its second), and per K pair the VL rows × 2 F16 of the
LHS (one vector), ``luti4`` (four registers) of the codes to F16 u − 8, four F16 ``fmul`` by the zipped scales and
four widening ``fmopa`` into ZA0.S–ZA3.S (columns t·VL … t·VL + VL − 1 in tile t). After the last block, per row
a ``mova`` of the four tiles' row and its ``st1w`` under the column predicate: the unclamped out.

:func:`tile_module` gives the LLVM module (IR text) for :func:`kleidipy.core.native.assembly` on any host; on an
aarch64 host with SME2 it is compiled at import for the host (:data:`AVAILABLE`) and :func:`compute` runs the tile
whenever the kernel is bound to the host's own SVL, else the portable jit (:mod:`.jit`). The tile's entry point is
locally streaming and enables ZA and ZT0 itself (:func:`kleidipy.core.sme2_ir.tile_module`).
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.sme2_ir import PN, B, F, H, IrText, P, sme2_tiles, tuple_type
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.f16p_qsi4c32p import avx512, jit

#: the tile's symbol (the GEMM: MOPA) and the streaming vector length in 32-bit lanes
MOPA = "kleidipy_f16p_q4_0_sme2_mopa"
VL = "kleidipy_f16p_q4_0_sme2_vl"
KERNELS = {MOPA: "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa"}

_LUT = "@kleidipy_f16p_q4_0_sme2_lut"
#: the predicate of 16-bit lanes (the widening FMOPA's)
P16 = "<vscale x 8 x i1>"


def _scales(ir: IrText, at: str) -> list[str]:
    """The 4·VL F16 scales of a block (2 vectors at ``at``), each zipped with itself: register t pairs with the
    columns of tile t, each scale twice (the column's K pair)."""
    s = ir.load(at, H, 2, "%pn16")
    zipped = [ir.call(tuple_type(H, 2), "llvm.aarch64.sve.zip.x2.nxv8f16", (H, x), (H, x)) for x in s]
    return [v for z in zipped for v in ir.parts(z, H, 2)]


def _quad(ir: IrText, lp: str, rp: str, q: int, scales: list[str]) -> None:
    """K quad q of a block (``lp``, ``rp``: the block's LHS and codes): ``ld2b`` of the codes, then per K pair the
    LHS vector, ``luti4`` to 4 vectors of F16 weights, ``fmul`` by the scales, ``fmopa`` into the 4 tiles."""
    at = ("ptr", ir.at(rp, 2 * q, B))
    pair = ir.call(tuple_type(B, 2), "llvm.aarch64.sve.ld2.sret.nxv16i8", (P, "%ptrue"), at)
    for h, codes in enumerate(ir.parts(pair, B, 2)):
        lhs = ir(f"load {H}, ptr {ir.at(lp, 2 * q + h, H)}, align 2")
        table = ("i32", "0"), (B, codes), ("i32", "0")
        weights = ir.parts(ir.call(tuple_type(H, 4), "llvm.aarch64.sme.luti4.lane.zt.x4.nxv8f16", *table), H, 4)
        for tile, (w, s) in enumerate(zip(weights, scales, strict=True)):
            args = ("i32", str(tile)), (P16, "%ph"), (P16, "%ph"), (H, lhs), (H, ir(f"fmul {H} {w}, {s}"))
            ir.call("void", "llvm.aarch64.sme.mopa.wide.nxv8f16", *args)


def _mopa_body(ir: IrText) -> None:
    """The tile's loops: column groups of 4·VL (RHS groups), row groups of VL (LHS groups), nb blocks into ZA, then
    the rows of the four tiles into out."""
    ir.label("entry")
    ir.call("void", "llvm.aarch64.sme.ldr.zt", ("i32", "0"), ("ptr", _LUT))
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir("shl i64 %vscale, 2", "vl")
    ir("shl i64 %vscale, 4", "nr")
    ir("shl i64 %nr, 4", "rblock")  # code bytes of a block: 8 K quads of 2 bytes per column
    ir("shl i64 %vl, 6", "lblock")  # LHS bytes of a block: 16 K pairs of VL rows x 2 F16
    ir("shl i64 %nr, 1", "rscale")  # scale bytes of a block
    ir("mul i64 %rblock, %nb", "rdata")
    ir(f"add i64 %rdata, {ir('mul i64 %rscale, %nb')}", "rstride")
    ir("mul i64 %lblock, %nb", "lstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir.call(P, "llvm.aarch64.sve.ptrue.nxv16i1", ("i32", "31"), name="ptrue")
    ir.call(P16, "llvm.aarch64.sve.ptrue.nxv8i1", ("i32", "31"), name="ph")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c16", name="pn16")
    ir.begin_column_groups()
    ir("getelementptr i8, ptr %rgroup, i64 %rdata", "rscales")
    ir(f"getelementptr i8, ptr %out, i64 {ir('shl i64 %j0, 2')}", "dstcol")
    ir.begin_row_groups("%vl", "rows_end")
    ir.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
    ir.do("br label %k_loop")
    ir.label("k_loop")
    ir("phi i64 [0, %m_loop], [%blk.next, %k_loop]", "blk")
    scales = _scales(ir, ir.at("%rscales", ir("mul i64 %blk, %rscale")))
    lp, rp = ir.at("%lgroup", ir("mul i64 %blk, %lblock")), ir.at("%rgroup", ir("mul i64 %blk, %rblock"))
    for q in range(8):
        _quad(ir, lp, rp, q, scales)
    ir("add i64 %blk, 1", "blk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %blk.next, %nb')}, label %k_loop, label %store")
    ir.label("store")  # row r of ZA0.S .. ZA3.S: ZA array vectors 4r .. 4r + 3
    ir("phi i64 [0, %k_loop], [%r.next, %store]", "r")
    ir("phi ptr [%dst0, %k_loop], [%dst.next, %store]", "dst")
    slice_ = ir(f"trunc i64 {ir('shl i64 %r, 2')} to i32")
    za = ir.call(tuple_type(B, 4), "llvm.aarch64.sme.read.hor.vg4.nxv16i8", ("i32", "0"), ("i32", slice_))
    ir.store([ir(f"bitcast {B} {x} to {F}") for x in ir.parts(za, B, 4)], "%dst")
    ir("add i64 %r, 1", "r.next")
    ir("getelementptr i8, ptr %dst, i64 %rowbytes", "dst.next")
    ir.do(f"br i1 {ir('icmp ult i64 %r.next, %rows')}, label %store, label %rows_end")
    ir.label("rows_end")
    ir("add i64 %i0, %vl", "i0.next")
    ir("getelementptr i8, ptr %lgroup, i64 %lstride", "lgroup.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i0.next, %m')}, label %m_loop, label %m_end")
    ir.end_column_groups()


#: the tile (IR text) ``void MOPA(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float* out)`` (out [m, n] unclamped; m, n,
#: nb at least 1, buffers of whole groups; the geometry is the SVL it runs at) and ``i64 VL()``, for
#: ``aarch64-sme2``; installed on a host with SME2 (``HOST_ISA``, else None)
tile_module, kernel_tile, HOST_ISA, (_MOPA, _host_vl) = sme2_tiles(
    KERNELS.items(), VL, {MOPA: _mopa_body}, IrText, _LUT, table="f16"
)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def _compute(m, n, k, mr, nr, lhs, rhs):  # pragma: no cover - compiled (aarch64 with SME2)
    """The native tile when the kernel is bound to this host's SVL (mr = VL, nr = 4·VL), else the portable jit."""
    vl = _host_vl()
    if mr == vl and nr == 4 * vl:
        out = np.empty((m, n), np.float32)
        _MOPA((m, n, k // 32), lhs, rhs, out)
        return out
    return jit.matmul(m, n, k, mr, nr, lhs, rhs)


def compute(m: int, n: int, k: int, mr: int, nr: int, lhs_u8: np.ndarray, rhs_u8: np.ndarray) -> np.ndarray:
    """Unclamped float32 [m, n] = packed LHS (mr rows per group) × packed RHS (nr columns per group): on the SME2
    tile when this host has SME2 and the kernel is bound to its SVL, on x86 the AVX-512 tiles (:mod:`.avx512`), else
    the portable jit; the same bits."""
    if m < 1 or n < 1 or k < 32 or k % 32 or nr % 4 or mr < 1:
        raise KernelShapeError(f"m={m}, n={n}, k={k}, mr={mr}, nr={nr}: need positive sizes, k a multiple of 32")
    lhs_u8, rhs_u8 = np.asarray(lhs_u8), np.asarray(rhs_u8)
    if AVAILABLE:
        return _compute(m, n, k, mr, nr, lhs_u8, rhs_u8)
    if avx512.runs(nr):
        return avx512.compute(m, n, k, mr, nr, lhs_u8, rhs_u8)
    return jit.matmul(m, n, k, mr, nr, lhs_u8, rhs_u8)
