"""The F32 MOPA GEMM (``matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa``: LHS ``lhs_pack_f32p2vlx1_f32_sme``,
RHS ``rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme``) as a native SME2 tile in streaming mode, with the instruction
sequence of KleidiAI's kernel and its arithmetic (the bits of :func:`kleidipy.kernels.pack.f32p_jit.matmul_f32_fma`
from +0 + bias).

How (as KleidiAI's kernel): per group of 2·VL columns (VL = SVL/32) the group's 2·VL biases (``ld1w`` of two
vectors); per group of 2·VL rows ``zero {za}`` and four ``fmopa`` of a vector of 1.0 by the biases into ZA0.S–ZA3.S
(rows 0..VL-1 and VL..2VL-1 by columns 0..VL-1 and VL..2VL-1), then per k the 2·VL LHS values and the 2·VL RHS
values (``ld1w`` of two vectors each) and four ``fmopa``; then per row a ``mova`` of its two tiles' row and its
``st1w`` under the column predicate: the unclamped out.

:func:`tile_module` gives the LLVM module (IR text) for :func:`kleidipy.core.native.assembly` on any host; on an
aarch64 host with SME2 it is compiled at import for the host (:data:`AVAILABLE`) and :func:`compute` runs the tile
whenever the kernel is bound to the host's own SVL, else the portable jit.
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.sme2_ir import PN, F, IrText, sme2_tiles
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.f32p_f32p import jit
from kleidipy.kernels.pack import f32p_jit

#: the tile's symbol (the GEMM: MOPA) and the streaming vector length in 32-bit lanes
MOPA = "kleidipy_f32p_f32p_sme2_mopa"
VL = "kleidipy_f32p_f32p_sme2_vl"
KERNELS = {MOPA: "matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa"}
#: the predicate of 32-bit lanes
P32 = "<vscale x 4 x i1>"


def _fmopa(ir: IrText, lhs: list[str], rhs: list[str]) -> None:
    """``fmopa`` of the 2·VL rows ``lhs`` by the 2·VL columns ``rhs`` into the four tiles (tile 2·h + c: row half h,
    column half c)."""
    for tile in range(4):
        args = ("i32", str(tile)), (P32, "%p32"), (P32, "%p32"), (F, lhs[tile // 2]), (F, rhs[tile % 2])
        ir.call("void", "llvm.aarch64.sme.mopa.nxv4f32", *args)


def _store_rows(ir: IrText, half: int, rows: tuple[str, str], dst0: str, blocks: tuple[str, str]) -> str:
    """Rows ``rows`` (first, end: at least one) of the group from ZA tiles 2·half and 2·half + 1 (slice: the row
    less the first of the half, ``half``·VL) into out from ``dst0``; ``blocks``: the block before, the block after.
    The next dst row."""
    (first, last), (before, after) = rows, blocks
    start = "%vl" if half else "0"
    block = f"rows{half}"
    ir.do(f"br label %{block}")
    ir.label(block)
    r = ir(f"phi i64 [{first}, %{before}], [%row{half}.next, %{block}]", f"row{half}")
    dst = ir(f"phi ptr [{dst0}, %{before}], [%to{half}.next, %{block}]", f"to{half}")
    slice_ = ir(f"trunc i64 {ir(f'sub i64 {r}, {start}')} to i32")
    rows = [
        ir.call(
            F,
            "llvm.aarch64.sme.read.horiz.nxv4f32",
            (F, "zeroinitializer"),
            (P32, "%p32"),
            ("i32", str(t)),
            ("i32", slice_),
        )  # fmt: skip
        for t in (2 * half, 2 * half + 1)
    ]
    ir.call("void", "llvm.aarch64.sve.st1.pn.x2.nxv4f32", *[(F, x) for x in rows], (PN, "%pn2"), ("ptr", dst))
    ir(f"add i64 {r}, 1", f"row{half}.next")
    ir(f"getelementptr i8, ptr {dst}, i64 %rowbytes", f"to{half}.next")
    ir.do(f"br i1 {ir(f'icmp ult i64 %row{half}.next, {last}')}, label %{block}, label %{after}")
    return f"%to{half}.next"


def _mopa_body(ir: IrText) -> None:
    """The tile's loops: column groups of 2·VL (RHS groups: biases then K rows), row groups of 2·VL (LHS groups), K
    into ZA, then the rows of the four tiles into out (``%nb`` is K)."""
    ir.label("entry")
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir("shl i64 %vscale, 2", "vl")
    ir("shl i64 %vscale, 3", "nr")
    ir(f"mul i64 {ir('shl i64 %nr, 2')}, %nb", "lstride")  # bytes of an LHS group: K × 2·VL f32
    ir(f"add i64 %lstride, {ir('shl i64 %nr, 2')}", "rstride")  # an RHS group: 2·VL biases, then K × 2·VL f32
    ir("shl i64 %n, 2", "rowbytes")
    ir.call(P32, "llvm.aarch64.sve.ptrue.nxv4i1", ("i32", "31"), name="p32")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c32", name="pnall")
    ir.call(F, "llvm.aarch64.sve.dup.x.nxv4f32", ("float", "1.000000e+00"), name="ones")
    ir.begin_column_groups()
    ir.call(PN, "llvm.aarch64.sve.whilelt.c32", ("i64", "%j0"), ("i64", "%n"), ("i32", "2"), name="pn2")
    ir(f"getelementptr i8, ptr %out, i64 {ir('shl i64 %j0, 2')}", "dstcol")
    bias = ir.load("%rgroup", F, 2, "%pnall")
    ir.begin_row_groups("%nr", "rows_end")
    ir.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
    _fmopa(ir, ["%ones", "%ones"], bias)
    ir.do("br label %k_loop")
    ir.label("k_loop")
    ir("phi i64 [0, %m_loop], [%kk.next, %k_loop]", "kk")
    step = ir("shl i64 %kk, 1")
    lhs = ir.load(ir.at("%lgroup", step, F), F, 2, "%pnall")
    rhs = ir.load(ir.at("%rgroup", ir(f"add i64 {step}, 2"), F), F, 2, "%pnall")
    _fmopa(ir, lhs, rhs)
    ir("add i64 %kk, 1", "kk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %kk.next, %nb')}, label %k_loop, label %k_end")
    ir.label("k_end")
    ir(f"select i1 {ir('icmp ult i64 %rows, %vl')}, i64 %rows, i64 %vl", "lo_rows")
    dst_hi = _store_rows(ir, 0, ("0", "%lo_rows"), "%dst0", ("k_end", "lo_done"))
    ir.label("lo_done")
    ir.do(f"br i1 {ir('icmp ugt i64 %rows, %vl')}, label %hi_start, label %rows_end")
    ir.label("hi_start")
    _store_rows(ir, 1, ("%vl", "%rows"), dst_hi, ("hi_start", "rows_end"))
    ir.label("rows_end")
    ir("add i64 %i0, %nr", "i0.next")
    ir("getelementptr i8, ptr %lgroup, i64 %lstride", "lgroup.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i0.next, %m')}, label %m_loop, label %m_end")
    ir.end_column_groups()


#: the tile (IR text) ``void MOPA(i64 m, i64 n, i64 k, i8* lhs, i8* rhs, float* out)`` (out [m, n] unclamped; m, n,
#: k at least 1, buffers of whole groups; the geometry is the SVL it runs at) and ``i64 VL()``, for ``aarch64-sme2``;
#: installed on a host with SME2 (``HOST_ISA``, else None)
tile_module, kernel_tile, HOST_ISA, (_MOPA, _host_vl) = sme2_tiles(
    KERNELS.items(), VL, {MOPA: _mopa_body}, IrText, None
)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def _compute(m, n, k, mr, nr, lhs, rhs):  # pragma: no cover - compiled (aarch64 with SME2)
    """The native tile when the kernel is bound to this host's SVL (mr = nr = 2·VL), else the portable jit."""
    if mr == 2 * _host_vl() and nr == mr:
        out = np.empty((m, n), np.float32)
        _MOPA((m, n, k), lhs, rhs, out)
        return out
    return f32p_jit.matmul_f32_fma(m, n, k, jit.lhs_unpack_f32p(lhs, m, k, mr), rhs, nr, True)


def compute(m: int, n: int, k: int, mr: int, nr: int, lhs_u8: np.ndarray, rhs_u8: np.ndarray) -> np.ndarray:
    """Unclamped float32 [m, n] = packed LHS (mr rows per group) × packed RHS (nr columns per group): on the SME2
    tile when this host has SME2 and the kernel is bound to its SVL, else the portable jit; the same bits."""
    if m < 1 or n < 1 or k < 1 or mr < 1 or nr < 1:
        raise KernelShapeError(f"m={m}, n={n}, k={k}, mr={mr}, nr={nr}: need positive sizes")
    lhs_u8, rhs_u8 = np.ascontiguousarray(lhs_u8), np.ascontiguousarray(rhs_u8)
    if AVAILABLE:
        return _compute(m, n, k, mr, nr, lhs_u8, rhs_u8)
    return f32p_jit.matmul_f32_fma(m, n, k, jit.lhs_unpack_f32p(lhs_u8, m, k, mr), rhs_u8, nr, True)
