"""AVX-512 VNNI tile of the exact-weight family: one packed group (16 columns) of up to four LHS rows, every 16-block
with four vpdpbusd per row (each 4 values of the 16 columns against the row's 4 values, broadcast), then the float
steps of :mod:`~kleidipy.kernels.qsi8d32p_qai8c16p.ukernels`'s recipe on the 16 columns at once (the same bits as
the portable loops); the four rows share each load of the weights. Hand-written IR: no numba loop emits vpdpbusd.

vpdpbusd multiplies unsigned by signed bytes: the codes w are read as w + 128 (XOR 0x80) against the row's signed
values q, and the dot starts at −128·Σq, so it ends at the block's Σw·q. A group's block whose offsets are all ±0
(the symmetric types) skips the offset steps (they would return acc unchanged).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.vnni import F32X16, I32X16, byte_ptr, fma, i64, load, splat
from kleidipy.kernels.qsi8d32p_qai4c32p.jit import _unpack_lhs
from kleidipy.kernels.qsi8d32p_qai8c16p.jit import BL, RHS_BLOCK_BYTES

HAVE_VNNI = vnni.HAS_AVX512_VNNI
ISA = vnni.VNNI512 if HAVE_VNNI else vnni.PORTABLE
NR = 16  #: the layout's columns per group (both kernels): one vector
ROWS = 4  #: LHS rows of the GEMM's tile (the GEMV's has one)
_BLOCK = NR * RHS_BLOCK_BYTES  # bytes of one group's 16-block: 4 code vectors, offsets, scales


def _tile_of(tile_rows: int):
    """The tile intrinsic of ``tile_rows`` LHS rows."""

    def tile(typingctx, isa, rhs, j0, n, stride, nb, i0, rows, q, k, qbias, rc, s, out):
        """out[(i0 + r)·n + j0 + c] for the rows r < min(tile_rows, rows) from i0 and the columns c < min(16, n − j0)
        from j0 (a multiple of 16): the recipe over nb blocks (q int8 [rows padded, k]; per row and block ``qbias`` =
        −128·Σq int32, ``rc`` and ``s`` = Σq f32), plus the bias."""
        int64 = types.int64
        sig = types.void(isa, rhs, int64, int64, int64, int64, int64, int64, q, int64, qbias, rc, s, out)
        return sig, _codegen(tile_rows)

    tile.__name__ = tile.__qualname__ = f"tile_{tile_rows}_rows"  # (one symbol per variant)
    return intrinsic(tile)


def _codegen(tile_rows: int):
    def codegen(context, builder, signature, args):
        native = vnni.isa_native(signature.args[0])
        _, rhs_p, j0_v, n_v, stride_v, nb_v, i0_v, rows_v, q_p, k_v, qb_p, rc_p, s_p, out_p = vnni.intrinsic_args(
            context, builder, signature, args
        )
        b = builder
        base = byte_ptr(b, rhs_p, b.mul(b.udiv(j0_v, i64(NR)), stride_v))
        accs = [cgutils.alloca_once_value(b, vnni.const_splat(F32X16, 0.0)) for _ in range(tile_rows)]
        flip = vnni.const_splat(I32X16, -0x7F7F7F80)  # 0x80808080: w + 128 as unsigned bytes
        magnitude = vnni.const_splat(I32X16, 0x7FFFFFFF)
        with cgutils.for_range(b, nb_v) as blk:
            block = byte_ptr(b, base, b.mul(blk.index, i64(_BLOCK)))
            codes = [b.xor(load(b, byte_ptr(b, block, 64 * u), I32X16), flip) for u in range(BL // 4)]
            offset = load(b, byte_ptr(b, block, BL * NR), F32X16)
            scale = load(b, byte_ptr(b, block, (BL + 4) * NR), F32X16)
            rcs, idxs = [], []
            for r, acc in enumerate(accs):
                row = b.add(i0_v, i64(r))
                idx = b.add(b.mul(row, nb_v), blk.index)  # (row, block)
                qrow = byte_ptr(b, q_p, b.add(b.mul(row, k_v), b.mul(blk.index, i64(BL))))
                dot = splat(b, load(b, byte_ptr(b, qb_p, b.mul(idx, i64(4))), vnni.I32), I32X16)
                for u, c in enumerate(codes):
                    dot = vnni.dpbusd(b, dot, c, splat(b, load(b, byte_ptr(b, qrow, 4 * u), vnni.I32), I32X16), native)
                rcv = splat(b, load(b, byte_ptr(b, rc_p, b.mul(idx, i64(4))), vnni.F32), F32X16)
                b.store(fma(b, b.fmul(scale, rcv), b.sitofp(dot, F32X16), b.load(acc)), acc)
                rcs.append(rcv)
                idxs.append(idx)
            bits = b.and_(b.bitcast(offset, I32X16), magnitude)
            with b.if_then(b.icmp_unsigned("!=", vnni.reduce_umax(b, bits), ir.Constant(vnni.I32, 0))):
                for acc, rcv, idx in zip(accs, rcs, idxs, strict=True):
                    sv = splat(b, load(b, byte_ptr(b, s_p, b.mul(idx, i64(4))), vnni.F32), F32X16)
                    b.store(fma(b, b.fmul(offset, rcv), sv, b.load(acc)), acc)
        bias = load(b, byte_ptr(b, base, b.mul(nb_v, i64(_BLOCK))), F32X16)
        count = b.sub(n_v, j0_v)
        for r, acc in enumerate(accs):
            with cgutils.if_likely(b, b.icmp_signed("<", i64(r), rows_v)):
                at = b.add(b.mul(b.add(i0_v, i64(r)), n_v), j0_v)
                vnni.masked_store(b, b.fadd(b.load(acc), bias), byte_ptr(b, out_p, b.mul(at, i64(4))), count)
        return context.get_dummy_value()

    return codegen


_TILE = _tile_of(ROWS)
_TILE_GEMV = _tile_of(1)


@numba.njit(cache=True, nogil=True)
def compute(m, n, k, mr, nr, kbl, lhs, rhs):  # pragma: no cover - compiled
    """Both kernels on the VNNI tile (``ukernels.COMPUTE``'s signature): float32 [m, n], unclamped. Column groups
    outside, row quads inside: a group's weights stay in cache while the rows stream."""
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    q_m, _, recip = _unpack_lhs(m, k, mr, kbl, lhs)
    padded = (m + ROWS - 1) // ROWS * ROWS
    q = np.zeros((padded, k), np.int8)
    q[:m] = q_m
    qbias = np.zeros((padded, nb), np.int32)
    rc = np.zeros((padded, nb), np.float32)
    s = np.zeros((padded, nb), np.float32)
    for i in range(m):
        for blk in range(nb):
            total = 0
            for t in range(BL):
                total += q_m[i, blk * BL + t]
            qbias[i, blk], rc[i, blk], s[i, blk] = -128 * total, recip[i, blk // 2], np.float32(total)
    out = np.empty((m, n), np.float32)
    flat = out.reshape(-1)
    for j0 in range(0, n, NR):
        if m == 1:
            _TILE_GEMV(ISA, rhs, j0, n, stride, nb, 0, 1, q, k, qbias, rc, s, flat)
            continue
        for i0 in range(0, m, ROWS):
            _TILE(ISA, rhs, j0, n, stride, nb, i0, m - i0, q, k, qbias, rc, s, flat)
    return out
