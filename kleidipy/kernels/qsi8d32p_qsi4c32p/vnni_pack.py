"""The vectorised ``lhs_quant_pack_qsi8d32p`` packers of the Q4_0 family with AVX-512 (the same bytes as
``jit.lhs_quant_pack_qsi8d32p``): ``lhs_quant_pack_qsi8d32p_f32_neon`` (§4.4, kr = 4, the SME kernels' LHS) and the
NEON kernels' layout, rounding ties away from zero (roundf) or to even (the 4x8sb packer), used by the jit and by
the compiled plan's MUL_MAT.

Per 32-block a row is read as two float32 vectors: amax, s = f32(amax/127), inv = f32(1/s), q = round(f32(x·inv)),
the fp16 scale converted by vectors afterwards. A row with a block whose 1/s overflows (amax below ~4e-37) takes
its int8 from the family's packer, so the bytes are the packer's everywhere. Hand-written LLVM IR (see
:mod:`kleidipy.core.vnni`) because numba's loops neither vectorize the rounding nor the block's max.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.node import copy, zero_partial_groups
from kleidipy.core.vnni import F32, F32X16, HOST_ISA, I32X16, I64, i64
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit
from kleidipy.kernels.qsi8d32p_qsi4c32p.vnni import VEC_COLS


@intrinsic
def _quantize_row(typingctx, isa, row, nb, out, dst, lay, sf, sf_off, sf_step):
    """Quantize one float32 row per 32-block (§4.3/4.4) into a packed LHS: the 4 int8 of K group g of block b at
    out[dst + b·lay[0] + lay[1] + (g // lay[3])·lay[2] + (g % lay[3])·4] (``lay``: int64 LAYOUT_PARAMS), rounded
    ties away from zero (roundf) or, with lay[4], to even (rintf); the float32 scale of block b at
    sf[sf_off + b·sf_step]. Returns 1 when a block's 1/scale overflowed (amax below ~4e-37: its int8 are then not
    the packer's), else 0."""
    sig = types.int64(isa, row, types.int64, out, types.int64, lay, sf, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        _, row_p, nb_v, out_p, dst_v, lay_p, sf_p, sf_off_v, sf_step_v = vnni.intrinsic_args(
            context, builder, signature, args
        )
        b = builder
        lay = [vnni.load(b, vnni.byte_ptr(b, lay_p, i64(8 * i)), I64) for i in range(5)]
        block_stride, block_offset, chunk_stride, per_chunk = lay[:4]
        ties_even = b.icmp_signed("!=", lay[4], i64(0))
        overflow = cgutils.alloca_once_value(b, ir.Constant(I64, 0))
        with cgutils.for_range(b, nb_v) as loop:
            blk = loop.index
            x = vnni.load_block(b, row_p, blk)
            amax = vnni.block_amax(b, x)
            scale = b.fdiv(amax, ir.Constant(F32, 127.0))
            nonzero = b.fcmp_ordered("!=", scale, ir.Constant(F32, 0.0))
            inv_s = b.select(nonzero, b.fdiv(ir.Constant(F32, 1.0), scale), ir.Constant(F32, 0.0))
            inf = b.zext(b.fcmp_ordered("==", inv_s, ir.Constant(F32, float("inf"))), I64)
            b.store(b.or_(b.load(overflow), inf), overflow)
            inv = vnni.splat(b, inv_s, F32X16)
            ys = [b.fmul(v, inv) for v in x]
            base = b.add(dst_v, b.add(b.mul(blk, block_stride), block_offset))
            with b.if_else(ties_even) as (even, away):  # (one rounding computed, a branch taken the same way)
                with even:
                    q = [b.fptosi(vnni.round_even(b, y), I32X16) for y in ys]
                    vnni.store_k_groups(b, q, out_p, base, chunk_stride, per_chunk)
                with away:  # roundf(y) = trunc(y + copysign(0.49999997, y)), the largest float below 1/2 (every
                    q = []  # float of magnitude below 128 checked, as |y| is)
                    for y in ys:
                        sign = b.and_(b.bitcast(y, I32X16), vnni.const_splat(I32X16, -0x80000000))
                        bias = b.bitcast(b.or_(sign, vnni.const_splat(I32X16, 0x3EFFFFFF)), F32X16)
                        q.append(b.fptosi(b.fadd(y, bias), I32X16))
                    vnni.store_k_groups(b, q, out_p, base, chunk_stride, per_chunk)
            sf_index = b.add(sf_off_v, b.mul(blk, sf_step_v))
            vnni.store(b, scale, vnni.byte_ptr(b, sf_p, b.mul(sf_index, i64(4))))
        return b.load(overflow)

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _group_at(layout, mr, kbl, nb, g, r, b, t):  # pragma: no cover - compiled
    """Byte offset, in group g's packed LHS, of the 4 int8 of K group t (4 values) of block b of row r."""
    base, _ = jit._lhs_offsets(layout, mr, nb, g * mr * nb * 34, b, r)
    return base + (4 * t // kbl) * mr * kbl + r * kbl + (4 * t) % kbl


@numba.njit(cache=True, nogil=True)
def lhs_pack_into(isa, lhs, mr, kbl, row_offset, layout, ties_even, out):  # pragma: no cover - compiled
    """:func:`lhs_pack` into ``out`` (at least its bytes: the compiled plan's scratch, no allocation of the packed
    size, whose fresh pages cost more than the packing); a last group's padding rows are zeroed."""
    if kbl % 4:  # chunks of 1 or 2 values split the 4-value K groups the vectors store: the portable packer
        copy(jit.lhs_quant_pack_qsi8d32p(lhs, mr, kbl, row_offset, layout, ties_even != 0), out)
        return
    m, k = lhs.shape
    nb = k // 32
    stride = mr * nb * 34
    zero_partial_groups(out, m, row_offset, mr, stride)
    vec = (nb + VEC_COLS - 1) // VEC_COLS
    sf = np.zeros(vec * VEC_COLS, np.float32)  # one row's block scales
    bits = np.empty(vec * VEC_COLS * 2, np.uint8)
    # LAYOUT_PARAMS: block stride, block offset, chunk stride, K groups per chunk, ties to even
    if layout == jit.LHS_QSI8D32P_NEON:
        lay = np.array([32 * mr, 0, 4 * mr, 1, ties_even], np.int64)
    else:
        lay = np.array([34 * mr, 2 * mr, kbl * mr, kbl // 4, ties_even], np.int64)
    for i in range(m):
        g = (row_offset + i) // mr
        r = (row_offset + i) % mr
        row_at = g * stride + r * (4 if layout == jit.LHS_QSI8D32P_NEON else kbl)
        if _quantize_row(isa, lhs[i], nb, out, row_at, lay, sf, 0, 1):
            # a block whose 1/scale overflowed: this row's int8 from the family's packer (its scales are ours)
            one = jit.lhs_quant_pack_qsi8d32p(lhs[i : i + 1], mr, kbl, r, layout, ties_even != 0)
            for b in range(nb):
                for t in range(8):
                    at = _group_at(layout, mr, kbl, nb, 0, r, b, t)
                    for e in range(4):
                        out[g * stride + at + e] = one[at + e]
        vnni.f32_to_f16_vectors(isa, sf, 0, vec, bits, 0)
        for b in range(nb):
            _, so = jit._lhs_offsets(layout, mr, nb, g * stride, b, r)
            out[so] = bits[2 * b]
            out[so + 1] = bits[2 * b + 1]


@numba.njit(cache=True, nogil=True)
def lhs_pack(isa, lhs, mr, kbl, row_offset, layout, ties_even):  # pragma: no cover - compiled
    m, k = lhs.shape
    out = np.zeros((row_offset + m + mr - 1) // mr * mr * (k // 32) * 34, np.uint8)
    lhs_pack_into(isa, lhs, mr, kbl, row_offset, layout, ties_even, out)
    return out


@numba.njit(cache=True, nogil=True)
def _lhs_pack_vnni512(lhs, mr, kbl, row_offset, layout, ties_even):
    return lhs_pack(vnni.VNNI512, lhs, mr, kbl, row_offset, layout, ties_even)


@numba.njit(cache=True, nogil=True)
def _lhs_pack_portable(lhs, mr, kbl, row_offset, layout, ties_even):
    return lhs_pack(vnni.PORTABLE, lhs, mr, kbl, row_offset, layout, ties_even)


_LHS_PACK = {vnni.VNNI512: _lhs_pack_vnni512, vnni.PORTABLE: _lhs_pack_portable}


def lhs_quant_pack_qsi8d32p_f32_neon(
    lhs: np.ndarray, mr: int, row_offset: int = 0, isa: vnni.Isa = HOST_ISA
) -> np.ndarray:
    """``kai_run_lhs_quant_pack_qsi8d32p_f32_neon`` (§4.4, kr = 4) of finite float32 rows lhs [m, k]: the packed
    bytes (row i at position row_offset + i of its group; padding rows 0). Releases the GIL.

    Per 32-block: amax = max|x|, s = f32(amax/127), inv = f32(1/s) (0 if s is 0), q = roundf(f32(x·inv)),
    stored scale fp16(s) (RNE). The same bytes as the family's packer: a row with a block whose 1/s overflows
    (amax below ~4e-37) takes its int8 from that packer.
    """
    return lhs_quant_pack_qsi8d32p(lhs, mr, 4, row_offset, jit.LHS_QSI8D32P_NEON, False, isa)


def lhs_quant_pack_qsi8d32p(
    lhs: np.ndarray,
    mr: int,
    kbl: int,
    row_offset: int,
    layout: int,
    ties_even: bool,
    isa: vnni.Isa = HOST_ISA,
) -> np.ndarray:
    """Every qsi8d32p LHS packer of the family, vectorised (the same bytes as ``jit.lhs_quant_pack_qsi8d32p`` with
    these arguments): ``layout`` ``jit.LHS_QSI8D32P_NEON`` (§4.4, kbl 4) or ``jit.LHS_QSI8D32P`` (the NEON kernels'
    layout, chunks of kbl values per row: kbl 1 or 2 go to the portable packer), rounding ties away (roundf) or to
    even (the 4x8sb packer)."""
    rows = np.ascontiguousarray(lhs, dtype=np.float32)
    return _LHS_PACK[isa](rows, mr, kbl, row_offset, layout, int(ties_even))
