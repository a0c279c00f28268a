"""AVX-512 VNNI tile of the exact-weight family: 16 columns (four packed groups of nr = 4) of up to four LHS rows, every
16-block with one vpdpbusd per group, the float steps of :mod:`~kleidipy.kernels.qsi8d32p_qai8c16p.ukernels`'s
recipe on the 16 columns at once (the same bits as the portable loops), for up to four LHS rows sharing each load
of the weights.

vpdpbusd multiplies unsigned by signed bytes: the codes w are read as w + 128 (XOR 0x80) against the row's signed
values q, so the block's Σ(w + 128)·q less 128·Σq is its integer dot. The row's 16 values of a block are spread
once to the packed byte order of a group (byte j of a group's block holds column (j % 32) // 8, value
8·(j // 32) + j % 8).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.vnni import F32X16, I32X16, byte_ptr, fma, i64, load, pick, splat
from kleidipy.kernels.qsi8d32p_qai4c32p.jit import _unpack_lhs
from kleidipy.kernels.qsi8d32p_qai8c16p.jit import BL, RHS_BLOCK_BYTES

HAVE_VNNI = vnni.HAS_AVX512_VNNI
ISA = vnni.VNNI512 if HAVE_VNNI else vnni.PORTABLE
NR, KBL = 4, 8  #: the layout's columns per group and bytes per chunk (both kernels)
_BLOCK = NR * RHS_BLOCK_BYTES  # bytes of one group's 16-block


def _columns(b: ir.IRBuilder, vectors: list[ir.Value]) -> ir.Value:
    """The 16 column dots of four groups' vpdpbusd results (lane L of a group's: column (L % 8) // 2)."""
    sums = []
    for v in vectors:
        half = b.add(pick(b, v, v, list(range(8))), pick(b, v, v, list(range(8, 16))))
        sums.append(b.add(pick(b, half, half, [0, 2, 4, 6]), pick(b, half, half, [1, 3, 5, 7])))
    return vnni.concat(b, sums)


def _fields(b: ir.IRBuilder, bases: list[ir.Value], offset: ir.Value) -> ir.Value:
    """The 16 f32 at byte ``offset`` of the four groups' blocks (4 per group)."""
    quad = ir.VectorType(ir.FloatType(), 4)
    return vnni.concat(b, [load(b, byte_ptr(b, base, offset), quad) for base in bases])


@intrinsic
def _tile(typingctx, isa, rhs, j0, n, stride, nb, i0, rows, spread, qsum128, rc, s, out):
    """out[(i0 + r)·n + j0 + c] for the rows r < min(4, rows) from i0 and the columns c < min(16, n − j0) from j0 (a
    multiple of 16): the recipe over nb blocks (per row and block: ``spread`` 64 int8, ``qsum128`` int32, ``rc`` and
    ``s`` f32, rows padded to a multiple of 4), plus the bias. The four rows share each load of the weights."""
    int64 = types.int64
    sig = types.void(isa, rhs, int64, int64, int64, int64, int64, int64, spread, qsum128, rc, s, out)

    def codegen(context, builder, signature, args):
        native = vnni.isa_native(signature.args[0])
        _, rhs_p, j0_v, n_v, stride_v, nb_v, i0_v, rows_v, spread_p, qsum_p, rc_p, s_p, out_p = vnni.intrinsic_args(
            context, builder, signature, args
        )
        b = builder
        bases = vnni.group_bases(b, rhs_p, j0_v, n_v, stride_v, 1, NR)[0]
        accs = [cgutils.alloca_once_value(b, vnni.const_splat(F32X16, 0.0)) for _ in range(4)]
        flip = vnni.const_splat(I32X16, -0x7F7F7F80)  # 0x80808080: w + 128 as unsigned bytes
        zero = vnni.const_splat(I32X16, 0)
        with cgutils.for_range(b, nb_v) as blk:
            block = b.mul(blk.index, i64(_BLOCK))
            codes = [b.xor(load(b, byte_ptr(b, base, block), I32X16), flip) for base in bases]
            offset = _fields(b, bases, b.add(block, i64(BL * NR)))
            scale = _fields(b, bases, b.add(block, i64((BL + 4) * NR)))
            for r, acc in enumerate(accs):
                idx = b.add(b.mul(b.add(i0_v, i64(r)), nb_v), blk.index)  # (row, block)
                q = load(b, byte_ptr(b, spread_p, b.mul(idx, i64(64))), I32X16)
                dots = [vnni.dpbusd(b, zero, c, q, native) for c in codes]
                qsum = splat(b, load(b, byte_ptr(b, qsum_p, b.mul(idx, i64(4))), vnni.I32), I32X16)
                a = b.sitofp(b.sub(_columns(b, dots), qsum), F32X16)
                rcv = splat(b, load(b, byte_ptr(b, rc_p, b.mul(idx, i64(4))), vnni.F32), F32X16)
                sv = splat(b, load(b, byte_ptr(b, s_p, b.mul(idx, i64(4))), vnni.F32), F32X16)
                step = fma(b, b.fmul(scale, rcv), a, b.load(acc))
                b.store(fma(b, b.fmul(offset, rcv), sv, step), acc)  # (a ±0 offset adds ±0: the same bits as a skip)
        bias = _fields(b, bases, b.mul(nb_v, i64(_BLOCK)))
        count = b.sub(n_v, j0_v)
        for r, acc in enumerate(accs):
            with cgutils.if_likely(b, b.icmp_signed("<", i64(r), rows_v)):
                at = b.add(b.mul(b.add(i0_v, i64(r)), n_v), j0_v)
                vnni.masked_store(b, b.fadd(b.load(acc), bias), byte_ptr(b, out_p, b.mul(at, i64(4))), count)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def compute(m, n, k, mr, nr, kbl, lhs, rhs):  # pragma: no cover - compiled
    """Both kernels on the VNNI tile (``ukernels.COMPUTE``'s signature): float32 [m, n], unclamped."""
    nb = k // BL
    stride = nr * (nb * RHS_BLOCK_BYTES + 4)
    q, _, recip = _unpack_lhs(m, k, mr, kbl, lhs)
    out = np.empty((m, n), np.float32)
    padded = (m + 3) // 4 * 4
    spread = np.zeros((padded, nb, BL * NR), np.int8)
    qsum128 = np.zeros((padded, nb), np.int32)
    rc = np.zeros((padded, nb), np.float32)
    s = np.zeros((padded, nb), np.float32)
    for i in range(m):
        for blk in range(nb):
            total = 0
            for t in range(BL):
                total += q[i, blk * BL + t]
            for j in range(BL * NR):
                spread[i, blk, j] = q[i, blk * BL + (j // (KBL * NR)) * KBL + j % KBL]
            qsum128[i, blk], rc[i, blk], s[i, blk] = 128 * total, recip[i, blk // 2], np.float32(total)
    flat = out.reshape(-1)
    for i0 in range(0, m, 4):
        for j0 in range(0, n, 16):
            _tile(ISA, rhs, j0, n, stride, nb, i0, m - i0, spread, qsum128, rc, s, flat)
    return out
