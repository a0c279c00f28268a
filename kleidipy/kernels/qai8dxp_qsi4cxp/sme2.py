"""The per-channel int4 SME2 kernels (``matmul_clamp_f32_qai8dxp1vlx8_qsi4cxp4vlx8_1vlx4vl_sme2_mopa``, the GEMM,
and ``matmul_clamp_f32_qai8dxp1x4_qsi4cxp4vlx4_1x4vl_sme2_sdot``, the GEMV: LHS ``lhs_quant_pack_qai8dxp_f32``, RHS
``rhs_pack_nxk_qsi4cxps1s0_qsu4cxs1s0_neon`` with nr = 4·VL, kr = 4) as native SME2 tiles in streaming mode, with
the instruction sequence of KleidiAI's own kernels and their arithmetic (the bits of ``jit.matmul_qai8dxp``).

How (as KleidiAI's kernels): ZT0 holds KleidiAI's ``lut``, the 16 int32 values of the int4 two's-complement
nibbles (0 … 7, −8 … −1); ``luti4`` turns a column's 2 packed bytes of a K group (4 nibbles, K order) into its 4
int8 weights, column j at bytes 4j..4j+3 of its vector: 2 vectors of codes → 4 vectors of int8, the 4·VL columns
(VL = SVL/32). Per group of 4·VL columns and after ``zero {za}``, over the whole K (k_int = 32·nb; per-channel
scales: the int32 sums of all of K stay in ZA):

* MOPA (mr = VL rows): per K group of 4, the VL rows × 4 LHS bytes (one vector), the 2 vectors of RHS codes (one
  ``ld1b``), 2 ``luti4`` (2 registers each) and 4 ``smopa`` (4-way, into ZA0.S–ZA3.S: columns t·VL … t·VL + VL − 1
  in tile t), 8 K groups per iteration of the block loop. Then per row i: ``mova`` ZA0H.B[4i, 0:3] (row i of the
  four tiles), ``mla`` of the RHS row sums by the row's −zp (int32, wrapping), ``scvtf``, S = f32(scale·recip) and
  out = f32(f32(F·S) + bias) (``fmul``, ``fadd``: ``Recipe.FMUL_FADD``).
* SDOT (one row): per 16 K values ``ld1rqb`` of the row's 16 LHS bytes, 2 × ``ld1b`` of 4 vectors of RHS codes (2
  K groups), per K group 2 ``luti4`` and a multi-vector ``sdot za.s[w8, 0, vgx4]`` indexed by the K group; then
  ``mova`` of the 4 ZA vectors, ``mla`` by −zp, ``scvtf`` and out = fma(S, F, bias) (``fmla`` into the bias:
  ``Recipe.FMA_BIAS``).

Both unclamped (the caller clamps). The LHS, the column parameters and the epilogue are those of the Q8_0 family's
tiles (:mod:`kleidipy.kernels.qai8dxp_qsi8cxp.sme2`, whose IR emitter this module reuses); the nibble expansion is
the Q4_0 family's (:mod:`kleidipy.kernels.qsi8d32p_qsi4c32p.sme2`) with KleidiAI's signed table. :func:`tile_module`
gives the LLVM module (IR text: llvmlite's IR builder has no scalable vectors and no SME attributes, and numba never
emits ``smopa``, ``luti4`` nor ZA ``sdot``) for :func:`kleidipy.core.native.assembly` on any host; on an aarch64 host
with SME2 the tiles are compiled at import (:data:`AVAILABLE`) and :func:`matmul_qai8dxp` (the jit's signature) runs
them whenever the kernel is bound to the host's SVL (the tiles' geometry is the streaming vector length they run
at), and hands every other call to :data:`FALLBACK`. Each entry point is a locally streaming function that enables
ZA (and ZT0) itself and calls the body: none of the SME ABI's support routines is needed.
"""

from __future__ import annotations

import numba

from kleidipy.core import native
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.sme2_ir import PN, B, P, W, lut_definition, tuple_type, vl_module, vl_reader
from kleidipy.core.sme2_ir import tile_module as sme2_tile_module
from kleidipy.kernels.qai8dxp_qsi4cxp import neon
from kleidipy.kernels.qai8dxp_qsi8cxp import jit
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as qai8dxp_qsi8cxp
from kleidipy.kernels.qai8dxp_qsi8cxp.sme2 import Ir, block_loop, column_group, end_column_groups

#: the tiles' symbols: GEMM (MOPA), GEMV (SDOT), and the streaming vector length in 32-bit lanes
MOPA = "kleidipy_qsi4cx_sme2_mopa"
SDOT = "kleidipy_qsi4cx_sme2_sdot"
VL = "kleidipy_qsi4cx_sme2_vl"
#: the kernel of each tile
KERNELS = {
    MOPA: "matmul_clamp_f32_qai8dxp1vlx8_qsi4cxp4vlx8_1vlx4vl_sme2_mopa",
    SDOT: "matmul_clamp_f32_qai8dxp1x4_qsi4cxp4vlx4_1x4vl_sme2_sdot",
}
#: K values of one iteration of a tile's block loop (k_int is a multiple)
BLOCK = 32
#: kr of the SME layouts (and the LHS chunk kbl of the MOPA one); a column's K group is kr/2 bytes of nibbles
KR = 4
#: every call that is not this family's SME2 layouts at the host's SVL with the kernel's recipe (the same arguments):
#: the family's NEON tiles (every SME2 CPU has DotProd), which hand the rest to the Q8_0 family's code
FALLBACK = neon.matmul_qai8dxp if neon.AVAILABLE else qai8dxp_qsi8cxp.MATMUL_COMPUTE

_LUT = "@kleidipy_qsi4cx_sme2_lut"
#: ZT0's table: KleidiAI's ``lut``, entry v the int4 two's-complement value of nibble v (int32)
_SIGNED_LUT = f"{_LUT} = internal constant [16 x i32] [{', '.join(f'i32 {v - 16 * (v >> 3)}' for v in range(16))}]"


def _prologue(ir: Ir, mr: str) -> None:
    """The entry block's common part: ZT0 ← the table, the group sizes (``%mr`` rows, ``%nr`` = 4·VL columns;
    their data and strides: the RHS data is nr·k_int/2 bytes), ``%rowbytes`` of dst and the all-true predicates."""
    ir.label("entry")
    ir.call("void", "llvm.aarch64.sme.ldr.zt", ("i32", "0"), ("ptr", _LUT))
    ir.call("i64", "llvm.vscale.i64", name="vscale")
    ir(mr, "mr")
    ir("shl i64 %vscale, 4", "nr")
    ir("shl i64 %nb, 5", "kint")
    ir("mul i64 %mr, %kint", "ldata")
    ir(f"add i64 %ldata, {ir('shl i64 %mr, 3')}", "lstride")
    ir(f"mul i64 %nr, {ir('shl i64 %nb, 4')}", "rdata")
    ir(f"add i64 %rdata, {ir('mul i64 %nr, 12')}", "rstride")
    ir("shl i64 %n, 2", "rowbytes")
    ir.call(P, "llvm.aarch64.sve.ptrue.nxv16i1", ("i32", "31"), name="ptrue")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c8", name="pn8")
    ir.call(PN, "llvm.aarch64.sve.ptrue.c32", name="pn32")


def _block_end(ir: Ir, lhs_bytes: str | int) -> None:
    """Advance the block loop's pointers by a block (``lhs_bytes`` of LHS, 16 vectors of RHS codes) and loop."""
    ir(f"getelementptr i8, ptr %lp, i64 {lhs_bytes}", "lp.next")
    ir(f"getelementptr {B}, ptr %rp, i64 16", "rp.next")
    ir("add i64 %blk, 1", "blk.next")
    ir.do(f"br i1 {ir('icmp ult i64 %blk.next, %nb')}, label %k_loop, label %k_end")
    ir.label("k_end")


def _mopa_body(ir: Ir) -> None:
    """The MOPA tile: out [m, n] from LHS groups of VL rows (4 bytes each per K group: one vector) and RHS groups
    of 4·VL columns (2 bytes of codes each per K group: 2 vectors)."""
    _prologue(ir, "shl i64 %vscale, 2")
    column_group(ir)
    ir.do("br label %m_loop")
    ir.label("m_loop")  # a group of VL rows; the last one partial (its rows past m are not stored)
    ir("phi i64 [0, %n_loop], [%i0.next, %rows_end]", "i0")
    ir("phi ptr [%lhs, %n_loop], [%lgroup.next, %rows_end]", "lgroup")
    left = ir("sub i64 %m, %i0")
    ir(f"select i1 {ir(f'icmp ult i64 {left}, %mr')}, i64 {left}, i64 %mr", "rows")
    ir(f"getelementptr i8, ptr %dstcol, i64 {ir('mul i64 %i0, %rowbytes')}", "dst0")
    ir.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
    lp, rp = block_loop(ir, "m_loop", "%lgroup")
    for t in range(BLOCK // KR):  # K group t: VL rows × 4 int8 (1 vector), 4·VL columns × 4 codes (2 vectors)
        lhs = ir(f"load {B}, ptr {ir.at(lp, t, B)}, align 1")
        rhs = [x for codes in ir.load(ir.at(rp, 2 * t, B), B, 2, "%pn8") for x in ir.luti4(codes)]
        for tile, values in enumerate(rhs):
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
    slice_ = ir(f"trunc i64 {ir('shl i64 %r, 2')} to i32")
    za = ir.call(tuple_type(B, 4), "llvm.aarch64.sme.read.hor.vg4.nxv16i8", ("i32", "0"), ("i32", slice_))
    dots = [ir(f"bitcast {B} {x} to {W}") for x in ir.parts(za, B, 4)]
    ir.store(ir.epilogue(dots, params, "%lparams", "%r", fma_bias=False), "%dst")
    ir("add i64 %r, 1", "r.next")
    ir("getelementptr i8, ptr %dst, i64 %rowbytes", "dst.next")
    ir.do(f"br i1 {ir('icmp ult i64 %r.next, %rows')}, label %rows_loop, label %rows_end")
    ir.label("rows_end")
    ir("add i64 %i0, %mr", "i0.next")
    ir("getelementptr i8, ptr %lgroup, i64 %lstride", "lgroup.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i0.next, %m')}, label %m_loop, label %m_end")
    end_column_groups(ir)


def _sdot_body(ir: Ir) -> None:
    """The SDOT tile: out [m, n] from LHS rows (k_int bytes in K order, −zp, recip) and RHS groups of 4·VL columns
    (2 bytes of codes each per K group: 2 vectors), row after row."""
    _prologue(ir, "add i64 0, 1")
    column_group(ir)
    ir.do("br label %m_loop")
    ir.label("m_loop")
    ir("phi i64 [0, %n_loop], [%i.next, %k_end]", "i")
    ir("phi ptr [%lhs, %n_loop], [%lrow.next, %k_end]", "lrow")
    ir.call("void", "llvm.aarch64.sme.zero", ("i32", "255"))
    lp, rp = block_loop(ir, "m_loop", "%lrow")
    for h in range(BLOCK // 16):  # 16 LHS bytes (K groups 4h .. 4h + 3) in every 128-bit segment
        lhs = ir.call(B, "llvm.aarch64.sve.ld1rq.nxv16i8", (P, "%ptrue"), ("ptr", ir.at(lp, 16 * h)))
        for g in (0, 2):  # K groups 4h + g and 4h + g + 1: 4 vectors of codes, 8 of int8
            rhs = [x for codes in ir.load(ir.at(rp, 2 * (4 * h + g), B), B, 4, "%pn8") for x in ir.luti4(codes)]
            for i in range(2):
                values = [(B, x) for x in rhs[4 * i : 4 * i + 4]]
                intrinsic = "llvm.aarch64.sme.sdot.lane.za32.vg1x4.nxv16i8"
                ir.call("void", intrinsic, ("i32", "0"), *values, (B, lhs), ("i32", str(g + i)))
    _block_end(ir, BLOCK)
    dots = ir.parts(ir.call(tuple_type(W, 4), "llvm.aarch64.sme.read.vg1x4.nxv4i32", ("i32", "0")), W, 4)
    lparams = ir("getelementptr i8, ptr %lrow, i64 %kint")
    dst = ir(f"getelementptr i8, ptr %dstcol, i64 {ir('mul i64 %i, %rowbytes')}")
    ir.store(ir.epilogue(dots, ir.column_params("%rparams"), lparams, "0", fma_bias=True), dst)
    ir("add i64 %i, 1", "i.next")
    ir("getelementptr i8, ptr %lrow, i64 %lstride", "lrow.next")
    ir.do(f"br i1 {ir('icmp ult i64 %i.next, %m')}, label %m_loop, label %m_end")
    end_column_groups(ir)


def tile_module(symbol: str) -> str:
    """The LLVM module (IR text) of ``symbol``: a tile ``void symbol(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs,
    float* out)`` (:data:`MOPA`, :data:`SDOT`: out [m, n] unclamped = the packed LHS × the packed RHS, k_int =
    32·nb; m, n, nb at least 1, buffers of whole groups; the geometry is the SVL it runs at: VL rows (MOPA) or one,
    4·VL columns) or ``i64 VL()`` (:data:`VL`: the streaming vector length in 32-bit lanes, ``rdsvl``)."""
    if symbol == VL:
        return vl_module(VL)
    body = Ir()
    {MOPA: _mopa_body, SDOT: _sdot_body}[symbol](body)
    # the shared wrapper defines ZT0's table as the unsigned codes' u − 8; this layout's nibbles are signed
    return sme2_tile_module(symbol, body, _LUT).replace(lut_definition(_LUT), f"{_SIGNED_LUT}, align 64")


def kernel_tile(kernel: MatmulKernel, isa: native.NativeIsa) -> str | None:
    """The tile module (IR text) of one of the family's SME2 kernels for ``aarch64-sme2`` (None otherwise)."""
    symbol = next((s for s, name in KERNELS.items() if name == kernel.name), None)
    return tile_module(symbol) if symbol and isa.name == "aarch64-sme2" else None


#: the native ISA of this host's tiles (None: no SME2, or not aarch64 — the tiles are not available)
HOST_ISA = native.install_tiles(
    native.host_isa("aarch64-sme2"), lambda isa: (tile_module(symbol) for symbol in (MOPA, SDOT, VL))
)
AVAILABLE = HOST_ISA is not None

_MOPA, _SDOT = native.caller(MOPA), native.caller(SDOT)
#: the streaming vector length the tiles run at, in 32-bit lanes (read at each call: it is the thread's)
_host_vl = vl_reader(VL)


@numba.njit(cache=True, nogil=True)
def is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe):  # pragma: no cover - SME2
    """Whether the tiles run a call of ``jit.matmul_qai8dxp`` (its layout arguments and recipe): the layout of
    ``rhs_pack_nxk_qsi4cxps1s0_qsu4cxs1s0_neon`` (byte e of a group: nibbles of K (e // 2nr)·4 + 2·(e % 2), low,
    and the next one, high; probed at its first two chunks and last entry) of the SME2 kernels bound to this host's
    SVL, nr = 4·VL, kr = kbl = 4, with the kernel's recipe: VL rows per LHS group and f32(f32(F·S) + bias) (MOPA),
    or one row and fma(S, F, bias) (SDOT). Needs :data:`AVAILABLE`."""
    vl = _host_vl()
    fma_bias = recipe == jit.RECIPE_FMA_BIAS
    if nr != 4 * vl or kbl != KR or blen != KR // 2 or nibble_factor != 1 or k_int % BLOCK:
        return False
    if not ((mr == vl and not fma_bias) or (mr == 1 and fma_bias)):
        return False
    if k_lo.size != nr * k_int // 2 or k_hi.size != k_lo.size:
        return False
    chunk = nr * blen
    for e in range(min(k_lo.size, 2 * chunk)):
        if k_lo[e] != (e // chunk) * KR + 2 * (e % blen) or k_hi[e] != k_lo[e] + 1:
            return False
    return k_lo[k_lo.size - 1] == k_int - 2 and k_hi[k_hi.size - 1] == k_int - 1


@numba.njit(cache=True, nogil=True)
def _tiles(m, n, k_int, lhs_i8, rhs_u8, fma_bias, out):  # pragma: no cover - compiled (aarch64 with SME2)
    """out [m, n] on the SDOT tile (``fma_bias``) or the MOPA tile (m, n ≥ 1, a layout :func:`is_native_layout`
    accepts)."""
    ints = (m, n, k_int // BLOCK)
    if fma_bias:
        _SDOT(ints, lhs_i8, rhs_u8, out)
    else:
        _MOPA(ints, lhs_i8, rhs_u8, out)


def _on_tiles(m, n, k_int, lhs_i8, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out) -> bool:
    """Run a call of ``jit.matmul_qai8dxp`` on the tiles and return True if they take it (this family's SME2 layouts
    bound to this host's SVL with the kernel's recipe: :func:`is_native_layout`), else return False."""
    if m > 0 and n > 0 and is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe):
        _tiles(m, n, k_int, lhs_i8, rhs_u8, recipe == jit.RECIPE_FMA_BIAS, out)
        return True
    return False


#: ``jit.matmul_qai8dxp`` (same arguments and bits) on the tiles where :func:`_on_tiles` takes the call, else on
#: :data:`FALLBACK`. Needs :data:`AVAILABLE`.
matmul_qai8dxp = jit.with_tiles(_on_tiles, FALLBACK)
