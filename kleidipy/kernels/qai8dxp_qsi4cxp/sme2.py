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

Both unclamped (the caller clamps). The LHS, the column parameters and the epilogue are those of the Q8_0 family's tiles
(:mod:`kleidipy.kernels.qai8dxp_qsi8cxp.sme2`, whose MOPA and SDOT bodies this module runs with the RHS reading of its
own ``Ir`` subclass); the nibble expansion is the Q4_0 family's (:mod:`kleidipy.kernels.qsi8d32p_qsi4c32p.sme2`) with
KleidiAI's signed table. :func:`tile_module` gives the LLVM module (IR text: llvmlite's IR builder has no scalable
vectors and no SME attributes, and numba never emits ``smopa``, ``luti4`` nor ZA ``sdot``) for
:func:`kleidipy.core.native.assembly` on any host; on an aarch64 host with SME2 the tiles are compiled at import
(:data:`AVAILABLE`) and :func:`tiles` (the jit's signature) runs them whenever the kernel is bound to the host's SVL
(the tiles' geometry is the streaming vector length they run at). Each entry point is a locally streaming function that
enables ZA (and ZT0) itself and calls the body: none of the SME ABI's support routines is needed.
"""

from __future__ import annotations

from collections.abc import Iterator

import numba

from kleidipy.core.sme2_ir import sme2_tiles
from kleidipy.kernels.qai8dxp_qsi8cxp import jit
from kleidipy.kernels.qai8dxp_qsi8cxp.sme2 import Ir, mopa_body, sdot_body

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

#: the global holding ZT0's table: KleidiAI's ``lut``, entry v the int4 two's-complement value of nibble v (int32,
#: ``lut_definition(_LUT, "signed")``)
_LUT = "@kleidipy_qsi4cx_sme2_lut"


class _Ir(Ir):
    """:class:`qai8dxp_qsi8cxp.sme2.Ir <kleidipy.kernels.qai8dxp_qsi8cxp.sme2.Ir>` reading this family's RHS:
    ZT0 ← the table in the entry block, the RHS data nr·k_int/2 bytes, 2 bytes of codes per column and K group
    (2 vectors, 16 per block) decoded by ``luti4`` to int8."""

    rhs_block = 16

    def load_table(self) -> None:
        """ZT0 ← the table (:data:`_LUT`)."""
        self.call("void", "llvm.aarch64.sme.ldr.zt", ("i32", "0"), ("ptr", _LUT))

    def rhs_data(self) -> str:
        """k_int/2 = 16·nb."""
        return self("shl i64 %nb, 4")

    def mopa_rhs(self, rp: str, t: int) -> list[str]:
        """The 4 vectors of int8 of the block's K group t: 2 vectors of codes at ``rp``, ``luti4`` each."""
        return self.luti4_group(rp, t)

    def sdot_rhs(self, rp: str, h: int) -> Iterator[tuple[int, list[str]]]:
        """The block's K groups 4h + g (:meth:`~kleidipy.core.sme2_ir.IrText.luti4_groups`)."""
        return self.luti4_groups(rp, h)


#: the tiles (IR text): ``void symbol(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float* out)`` (:data:`MOPA`,
#: :data:`SDOT`: out [m, n] unclamped = the packed LHS × the packed RHS, k_int = 32·nb; m, n, nb at least 1, buffers
#: of whole groups; the geometry is the SVL it runs at: VL rows (MOPA) or one, 4·VL columns) and ``i64 VL()``
#: (:data:`VL`), for ``aarch64-sme2``; installed on a host with SME2 (``HOST_ISA``; None: no SME2, or not aarch64 —
#: the tiles are not available); ``_host_vl`` the vector length the tiles run at (read at each call)
tile_module, kernel_tile, HOST_ISA, (_MOPA, _SDOT, _host_vl) = sme2_tiles(
    KERNELS.items(), VL, {MOPA: mopa_body, SDOT: sdot_body}, _Ir, _LUT, table="signed"
)
AVAILABLE = HOST_ISA is not None


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


def tiles(m, n, k_int, lhs_i8, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out) -> bool:
    """Run a call of ``jit.matmul_qai8dxp`` on the tiles and return True if they take it (this family's SME2 layouts
    bound to this host's SVL with the kernel's recipe: :func:`is_native_layout`), else return False: the SME2 link
    of the family's tile chain (``ukernels.MATMUL_COMPUTE``). Needs :data:`AVAILABLE`."""
    if m > 0 and n > 0 and is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe):
        _tiles(m, n, k_int, lhs_i8, rhs_u8, recipe == jit.RECIPE_FMA_BIAS, out)
        return True
    return False
