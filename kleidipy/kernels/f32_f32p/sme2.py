"""The SME2 MLA GEMV (``matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla``: plain f32 LHS row, RHS
``rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme``) as a native SME2 tile in streaming mode, with its arithmetic (the bits
of :func:`kleidipy.kernels.pack.f32p_jit.matmul_f32_fma` from the bias).

How (as KleidiAI's kernel, one ZA vector group at a time where KleidiAI keeps up to four): per group of 4·VL columns
(VL = SVL/32; two packed RHS groups of 2·VL, the second read from the first when it is past n, as the kernel's CSEL)
the 4·VL biases (``ld1w`` of two vectors from each RHS group) written to ZA vector group 0, then per k the 4·VL
values of row k (``ld1w`` of two vectors from each) and one multi-vector ``fmla za.s[w8, 0, vgx4]`` by the LHS value
(fused, k ascending); then the four vectors read back and stored under the column predicate: the unclamped out.

Built as IR text (:func:`tile_module`, which :func:`kleidipy.core.native.assembly` compiles on any host) and installed
at import on an aarch64 host with SME2 (:data:`AVAILABLE`), where :func:`compute` runs it for the kernel bound to the
host's SVL (the portable jit otherwise).
"""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.sme2_ir import PN, F, IrText, sme2_tiles, tuple_type
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.pack import f32p_jit

#: the symbols of the streaming vector length (32-bit lanes) and of the tile, the kernel it is
VL, MLA = "kleidipy_f32_f32p_sme2_vl", "kleidipy_f32_f32p_sme2_mla"
KERNELS = {MLA: "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla"}


def _mla_body(ir: IrText) -> None:
    """The tile's loops: column groups of 4·VL (two RHS groups: biases then K rows), K into ZA vector group 0, then
    the group's 4 vectors into out (``%nb`` is K; one LHS row)."""
    ir.label("entry")
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir("shl i64 %vscale, 3", "half")  # 2·VL: the columns of an RHS group
    ir("shl i64 %vscale, 4", "nr")  # 4·VL: the columns of a vector group
    ir(f"mul i64 {ir('shl i64 %half, 2')}, {ir('add i64 %nb, 1')}", "block")  # bytes of an RHS group
    ir("shl i64 %block, 1", "rstride")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c32", name="pnall")
    ir.begin_column_groups()
    has_second = ir(f"icmp ult i64 {ir('add i64 %j0, %half')}, %n")
    ir(f"select i1 {has_second}, ptr {ir.at('%rgroup', '%block')}, ptr %rgroup", "second")
    bias = ir.load("%rgroup", F, 2, "%pnall") + ir.load("%second", F, 2, "%pnall")
    ir.call("void", "llvm.aarch64.sme.write.vg1x4.nxv4f32", ("i32", "0"), *[(F, x) for x in bias])
    ir.do("br label %k_loop")
    ir.label("k_loop")
    ir("phi i64 [0, %n_loop], [%kk.next, %k_loop]", "kk")
    x = ir(f"load float, ptr {ir.at('%lhs', '%kk', 'float')}, align 4")
    xs = ir.call(F, "llvm.aarch64.sve.dup.x.nxv4f32", ("float", x))
    row = ir(f"add i64 {ir('shl i64 %kk, 1')}, 2")
    w = ir.load(ir.at("%rgroup", row, F), F, 2, "%pnall") + ir.load(ir.at("%second", row, F), F, 2, "%pnall")
    ir.call("void", "llvm.aarch64.sme.fmla.single.vg1x4.nxv4f32", ("i32", "0"), *[(F, v) for v in w], (F, xs))
    ir("add i64 %kk, 1", "kk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %kk.next, %nb')}, label %k_loop, label %k_end")
    ir.label("k_end")
    za = ir.call(tuple_type(F, 4), "llvm.aarch64.sme.read.vg1x4.nxv4f32", ("i32", "0"))
    ir.store(ir.parts(za, F, 4), ir(f"getelementptr i8, ptr %out, i64 {ir('shl i64 %j0, 2')}"))
    ir.do("br label %m_end")
    ir.end_column_groups()


#: the tile (IR text) ``void MLA(i64 m, i64 n, i64 k, float* lhs, i8* rhs, float* out)`` (m = 1; out [1, n]
#: unclamped; n, k at least 1, the RHS of whole groups; the geometry is the SVL it runs at) and ``i64 VL()``, for
#: ``aarch64-sme2``; installed on a host with SME2 (``HOST_ISA``, else None)
tile_module, kernel_tile, HOST_ISA, (_MLA, _host_vl) = sme2_tiles(KERNELS.items(), VL, {MLA: _mla_body}, IrText, None)
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def _compute(m, n, k, nr, lhs, rhs):  # pragma: no cover - compiled (aarch64 with SME2)
    """The native tile for one row when the kernel is bound to this host's SVL (nr = 2·VL), else the portable jit."""
    if m == 1 and nr == 2 * _host_vl():
        out = np.empty((1, n), np.float32)
        _MLA((m, n, k), lhs, rhs, out)
        return out
    return f32p_jit.matmul_f32_fma(m, n, k, lhs, rhs, nr, False)


def compute(m: int, n: int, k: int, nr: int, lhs: np.ndarray, rhs_u8: np.ndarray) -> np.ndarray:
    """Unclamped float32 [m, n] = f32 rows (m·k values) × packed RHS (nr columns per group): on the SME2 tile when
    this host has SME2 and the kernel is bound to its SVL, else the portable jit; the same bits."""
    if m < 1 or n < 1 or k < 1 or nr < 1:
        raise KernelShapeError(f"m={m}, n={n}, k={k}, nr={nr}: need positive sizes")
    lhs, rhs_u8 = np.ascontiguousarray(lhs, np.float32), np.ascontiguousarray(rhs_u8)
    if AVAILABLE:
        return _compute(m, n, k, nr, lhs, rhs_u8)
    return f32p_jit.matmul_f32_fma(m, n, k, lhs, rhs_u8, nr, False)
