"""The vectorised ``lhs_quant_pack_qsi8d32pscalef32_f32_neon`` of the Q4_1 family (the same bytes as the
reference packer's), used by the jit and by the compiled plan's MUL_MAT.

Per 32-block a row is read as two float32 vectors: amax, scale = f32(127/amax) (0 when amax is 0), recip =
f32(1/scale), q = rint(f32(x·scale)) clamped to [−128, 127] (a NaN of 0·inf, where 127/amax overflowed, is 0), then
the row sum f32(Σq)·recip and recip. Hand-written LLVM IR (see :mod:`kleidipy.core.vnni`) because numba's loops
neither vectorise the rounding nor the block's max (the scalar packer took ~45 µs for 16 rows of 576, 13 % of a
16-sequence decode step of SmolLM2 Q4_1 on one thread).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.node import zero_partial_groups
from kleidipy.core.vnni import F32, F32X16, HOST_ISA, I32X16, I64, i64
from kleidipy.kernels.qsi8d32p_qai4c32p.jit import BL, LHS_BLOCK_BYTES


@intrinsic
def _quantize_row(typingctx, isa, row, nb, out, dst, fields, lay):  # pragma: no cover - compile time
    """Quantize one finite float32 row per 32-block into a packed LHS: the 4 int8 of K group g of block b at
    out[dst + b·lay[0] + (g // lay[2])·lay[1] + (g % lay[2])·4], its f32 row sum at out[fields + b·lay[0]] and its
    f32 recip lay[3] bytes after (``lay``: int64 block stride, chunk stride, K groups per chunk, mr·4)."""
    sig = types.void(isa, row, types.int64, out, types.int64, types.int64, lay)

    def codegen(context, builder, signature, args):
        _, row_p, nb_v, out_p, dst_v, fields_v, lay_p = vnni.intrinsic_args(context, builder, signature, args)
        b = builder
        block_stride, chunk_stride, per_chunk, recip_at = (
            vnni.load(b, vnni.byte_ptr(b, lay_p, i64(8 * i)), I64) for i in range(4)
        )
        zero, low, high = ir.Constant(F32, 0.0), vnni.const_splat(F32X16, -128.0), vnni.const_splat(F32X16, 127.0)
        with cgutils.for_range(b, nb_v) as loop:
            blk = loop.index
            x = vnni.load_block(b, row_p, blk)
            amax = vnni.block_amax(b, x)
            nonzero = b.fcmp_ordered("!=", amax, zero)
            scale = b.select(nonzero, b.fdiv(ir.Constant(F32, 127.0), amax), zero)
            recip = b.select(nonzero, b.fdiv(ir.Constant(F32, 1.0), scale), zero)
            q = []
            for v in x:
                y = b.fmul(v, vnni.splat(b, scale, F32X16))
                y = b.select(b.fcmp_ordered("ord", y, y), y, vnni.const_splat(F32X16, 0.0))
                y = b.select(b.fcmp_ordered("<", y, low), low, b.select(b.fcmp_ordered(">", y, high), high, y))
                q.append(b.fptosi(vnni.round_even(b, y), I32X16))
            base = b.mul(blk, block_stride)
            vnni.store_k_groups(b, q, out_p, b.add(dst_v, base), chunk_stride, per_chunk)
            total = b.sitofp(vnni.reduce_add(b, b.add(q[0], q[1])), F32)
            at = b.add(fields_v, base)
            vnni.store(b, b.fmul(total, recip), vnni.byte_ptr(b, out_p, at))
            vnni.store(b, recip, vnni.byte_ptr(b, out_p, b.add(at, recip_at)))
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def lhs_pack_into(isa, lhs, mr, kbl, row_offset, out):  # pragma: no cover - compiled
    """The packer (kbl a multiple of 4) of finite float32 rows lhs [m, k], vectorised, into ``out``
    (at least the packed bytes: the compiled plan's scratch, no allocation); row i at position row_offset + i of
    its group, the other rows of a partial group zeroed."""
    m, k = lhs.shape
    nb = k // BL
    stride = mr * nb * LHS_BLOCK_BYTES
    zero_partial_groups(out, m, row_offset, mr, stride)
    lay = np.array([mr * LHS_BLOCK_BYTES, kbl * mr, kbl // 4, 4 * mr], np.int64)
    for i in range(m):
        g, r = divmod(row_offset + i, mr)
        _quantize_row(isa, lhs[i], nb, out, g * stride + r * kbl, g * stride + BL * mr + 4 * r, lay)


@numba.njit(cache=True, nogil=True)
def lhs_pack(isa, lhs, mr, kbl, row_offset):  # pragma: no cover - compiled
    """:func:`lhs_pack_into` a new array of the packed bytes."""
    m, k = lhs.shape
    out = np.zeros((m + row_offset + mr - 1) // mr * mr * (k // BL) * LHS_BLOCK_BYTES, np.uint8)
    lhs_pack_into(isa, lhs, mr, kbl, row_offset, out)
    return out


def lhs_quant_pack(lhs: np.ndarray, mr: int, kbl: int, row_offset: int = 0, isa: vnni.Isa = HOST_ISA) -> np.ndarray:
    """``kai_run_lhs_quant_pack_qsi8d32pscalef32_f32_neon`` of finite float32 rows lhs [m, k] with kbl (kr / sr)
    values per chunk, 4, 8 or 16: the reference packer's bytes. Releases the GIL."""
    return lhs_pack(isa, np.ascontiguousarray(lhs, dtype=np.float32), mr, kbl, row_offset)
