"""AVX-512 VNNI host execution of the Q4_1 SME2-layout kernels ``…qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa``
and ``…qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot``: drop-ins for ``matmul_sme2_mopa`` / ``matmul_sme2_dot`` of
:mod:`kleidipy.kernels.qsi8d32p_qai4c32p.jit`, same arguments, same bits (the recipe is in
:mod:`kleidipy.kernels.qsi8d32p_qai4c32p.ukernels`).

Layouts read (bl = 32, kr/sr = 4): the LHS group of mr rows holds per block mr·40 bytes, the int8 of (row r,
K group t) at 4·(t·mr + r), then mr f32 row sums, mr f32 recips; the RHS group of nr columns (nr % 16 == 0)
holds per block nr·24 bytes, the uint16 of the four codes of (K group t, column c) at 2·(t·nr + c), then nr
f32 zeros, nr f32 scales, and after the last block nr f32 biases.

How: 16 columns per 512-bit vector. ``vpdpbusd`` multiplies the unsigned codes u (nibbles spread to bytes) by
the broadcast signed LHS bytes into an int32 accumulator that starts at −8·Σq of the row's block, which makes it
Σ q·(u − 8) exactly. Per block the float steps run on whole vectors in the recipe's order:
``acc = fma(zero, rs, acc)``, ``acc = fma(f32(scale·rc), f32(dot), acc)`` from acc = +0 (−0 for the MOPA kernel:
fma(x, y, −0) is the FMUL x·y, signed zeros included); finally ``acc + bias``. A register tile of rows × 4
vectors (64 columns) is generated in LLVM IR with :mod:`kleidipy.core.vnni`. With few rows the codes are spread
straight from the packed RHS; otherwise a panel of 64 columns is spread to bytes once and every row tile reads
it. Without AVX-512 VNNI, :func:`best_matmul_sme2_mopa` / :func:`best_matmul_sme2_dot` give the portable jit.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.vnni import F32, F32X16, I32, I32X16, i64
from kleidipy.kernels.qsi8d32p_qai4c32p import jit as _portable
from kleidipy.kernels.qsi8d32p_qai4c32p.jit import BL, LHS_BLOCK_BYTES, RHS_BLOCK_BYTES

#: the host runs these kernels (else the best_* selectors return the portable jit functions).
HAVE_VNNI = vnni.HAS_AVX512_VNNI
#: the portable functions, held here so that rebinding the jit module's names to ours is safe.
PORTABLE_MOPA = _portable.matmul_sme2_mopa
PORTABLE_DOT = _portable.matmul_sme2_dot

K_GROUPS = BL // 4  # K groups of 4 values per block
VEC_COLS = 16
TILE_VECS = 4
TILE_COLS = VEC_COLS * TILE_VECS
#: rows of a register tile reading a spread panel; up to DIRECT_ROWS rows the codes are spread on the fly.
PANEL_ROWS = 4
DIRECT_ROWS = 2
#: software prefetch distance of the RHS stream, in blocks (cold GEMV: ~25 GB/s without, ~35 GB/s with).
PREFETCH_BLOCKS = 4
#: bytes of a spread panel: per block 8 K groups × 4 vectors × 64 B of codes, then 2 × 64 f32 (zero, scale).
PANEL_BLOCK_BYTES = K_GROUPS * TILE_VECS * 64 + 2 * TILE_COLS * 4


class _Tile:
    """IR of a tile of ``len(rows)`` rows × 4 vectors of 16 columns over all K blocks.

    ``geo`` = (mr, nb, nr, n) as i64 values; rows read the packed LHS and the −8·Σq terms ``corr`` (int32 laid
    out as the LHS row sums: [group][block][mr]); the RHS comes from a source (:meth:`direct`, :meth:`panel`).
    """

    def __init__(self, builder: ir.IRBuilder, geo: tuple) -> None:
        vnni.require_vnni()
        self.b = builder
        self.mr, self.nb, self.nr, self.n = geo
        b = builder
        self.lhs_block = b.mul(self.mr, i64(LHS_BLOCK_BYTES))
        self.rhs_block = b.mul(self.nr, i64(RHS_BLOCK_BYTES))
        self.rhs_stride = b.add(b.mul(self.rhs_block, self.nb), b.mul(self.nr, i64(4)))

    def rows(self, count: int, lhs, corr, i0, rows):  # noqa: ANN001, ANN201
        """Per tile row (rows past ``rows`` repeat the last one): i8* to its LHS bytes and to its corr terms."""
        b = self.b
        out = []
        for r in range(count):
            i = b.add(i0, b.select(b.icmp_signed("<", i64(r), rows), i64(r), b.sub(rows, i64(1))))
            g, ri = b.udiv(i, self.mr), b.urem(i, self.mr)
            data = b.add(b.mul(g, b.mul(self.lhs_block, self.nb)), b.mul(ri, i64(4)))
            terms = b.mul(b.add(b.mul(b.mul(g, self.nb), self.mr), ri), i64(4))
            out.append((vnni.byte_ptr(b, lhs, data), vnni.byte_ptr(b, corr, terms)))
        return out

    def direct(self, rhs, j0):  # noqa: ANN001, ANN201
        """Source reading the packed RHS: codes spread on the fly (vectors past n re-read the first one)."""
        b = self.b
        bases = []
        for v in range(TILE_VECS):
            col = b.add(j0, i64(VEC_COLS * v))
            col = b.select(b.icmp_signed("<", col, self.n), col, j0)
            group = b.mul(b.udiv(col, self.nr), self.rhs_stride)
            c = b.urem(col, self.nr)
            bases.append(
                (
                    vnni.byte_ptr(b, rhs, b.add(group, b.mul(c, i64(2)))),
                    vnni.byte_ptr(b, rhs, b.add(group, b.mul(c, i64(4)))),
                )
            )
        kgroup = b.mul(self.nr, i64(2))
        zero_off, scale_off = b.mul(self.nr, i64(16)), b.mul(self.nr, i64(20))

        ahead = b.mul(self.rhs_block, i64(PREFETCH_BLOCKS))

        def codes(v: int, blk, t: int):  # noqa: ANN001, ANN202
            ptr = vnni.byte_ptr(b, bases[v][0], b.add(b.mul(blk, self.rhs_block), b.mul(kgroup, i64(t))))
            if v % 2 == 0:  # one 64-byte line holds two vectors' codes when nr >= 32
                vnni.prefetch(b, vnni.byte_ptr(b, ptr, ahead))
            return vnni.spread_nibbles(b, ptr, True)

        def params(v: int, blk):  # noqa: ANN001, ANN202
            base = vnni.byte_ptr(b, bases[v][1], b.mul(blk, self.rhs_block))
            vnni.prefetch(b, vnni.byte_ptr(b, vnni.byte_ptr(b, base, zero_off), ahead))
            vnni.prefetch(b, vnni.byte_ptr(b, vnni.byte_ptr(b, base, scale_off), ahead))
            return (
                vnni.load(b, vnni.byte_ptr(b, base, zero_off), F32X16),
                vnni.load(b, vnni.byte_ptr(b, base, scale_off), F32X16),
            )

        def bias(v: int):  # noqa: ANN202
            return vnni.load(b, vnni.byte_ptr(b, bases[v][1], b.mul(self.rhs_block, self.nb)), F32X16)

        return codes, params, bias

    def panel(self, scr):  # noqa: ANN001, ANN201
        """Source reading a spread panel (PANEL_BLOCK_BYTES per block, then 4 × 16 f32 biases)."""
        b = self.b

        def codes(v: int, blk, t: int):  # noqa: ANN001, ANN202
            off = b.add(b.mul(blk, i64(PANEL_BLOCK_BYTES)), i64(64 * (TILE_VECS * t + v)))
            return vnni.load(b, vnni.byte_ptr(b, scr, off), I32X16)

        def params(v: int, blk):  # noqa: ANN001, ANN202
            base = b.add(b.mul(blk, i64(PANEL_BLOCK_BYTES)), i64(K_GROUPS * TILE_VECS * 64 + 64 * v))
            return (
                vnni.load(b, vnni.byte_ptr(b, scr, base), F32X16),
                vnni.load(b, vnni.byte_ptr(b, scr, b.add(base, i64(TILE_COLS * 4))), F32X16),
            )

        def bias(v: int):  # noqa: ANN202
            return vnni.load(
                b, vnni.byte_ptr(b, scr, b.add(b.mul(self.nb, i64(PANEL_BLOCK_BYTES)), i64(64 * v))), F32X16
            )

        return codes, params, bias

    def run(self, row_ptrs, source, init, out, i0, rows, j0) -> None:  # noqa: ANN001
        """All blocks of the tile, then out[i0 + r, j0 + 16v …] = acc + bias (rows < ``rows``, columns < n)."""
        b = self.b
        codes, params, bias = source
        facc = [[cgutils.alloca_once_value(b, vnni.splat(b, init, F32X16)) for _ in range(TILE_VECS)] for _ in row_ptrs]
        iacc = [[cgutils.alloca_once(b, I32X16) for _ in range(TILE_VECS)] for _ in row_ptrs]
        kgroup = b.mul(self.mr, i64(4))
        with cgutils.for_range(b, self.nb) as loop:
            blk = loop.index
            lrow = []
            for r, (data, corr) in enumerate(row_ptrs):
                c = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, corr, b.mul(blk, kgroup)), I32), I32X16)
                for v in range(TILE_VECS):
                    b.store(c, iacc[r][v])
                lrow.append(vnni.byte_ptr(b, data, b.mul(blk, self.lhs_block)))
            for t in range(K_GROUPS):
                vec = [codes(v, blk, t) for v in range(TILE_VECS)]
                for r, ptr in enumerate(lrow):
                    q = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, b.mul(kgroup, i64(t))), I32), I32X16)
                    for v in range(TILE_VECS):
                        b.store(vnni.dpbusd(b, b.load(iacc[r][v]), vec[v], q, True), iacc[r][v])
            zs = [params(v, blk) for v in range(TILE_VECS)]
            for r, ptr in enumerate(lrow):
                rs = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, b.mul(self.mr, i64(BL))), F32), F32X16)
                rc = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, b.mul(self.mr, i64(BL + 4))), F32), F32X16)
                for v, (zero, scale) in enumerate(zs):
                    acc = vnni.fma(b, zero, rs, b.load(facc[r][v]))
                    s = b.fmul(scale, rc)
                    b.store(vnni.fma(b, s, b.sitofp(b.load(iacc[r][v]), F32X16), acc), facc[r][v])
        biases = [bias(v) for v in range(TILE_VECS)]
        for r in range(len(row_ptrs)):
            for v in range(TILE_VECS):
                col = b.add(j0, i64(VEC_COLS * v))
                with b.if_then(b.and_(b.icmp_signed("<", i64(r), rows), b.icmp_signed("<", col, self.n))):
                    off = b.mul(b.add(b.mul(b.add(i0, i64(r)), self.n), col), i64(4))
                    vnni.masked_store(
                        b, b.fadd(b.load(facc[r][v]), biases[v]), vnni.byte_ptr(b, out, off), b.sub(self.n, col)
                    )


def _make_tile(rows_max: int, direct: bool):  # noqa: ANN202
    """Intrinsic ``tile(geo, lhs, corr, src, out, i0, rows, j0, init)``: src is the packed RHS (``direct``) or a
    spread panel."""

    @intrinsic
    def tile(typingctx, geo, lhs, corr, src, out, i0, rows, j0, init):
        sig = types.void(geo, lhs, corr, src, out, types.int64, types.int64, types.int64, types.float32)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            geo_v, lhs_p, corr_p, src_p, out_p, i0_v, rows_v, j0_v, init_v = vnni.intrinsic_args(
                context, builder, signature, args
            )
            t = _Tile(builder, geo_v)
            source = t.direct(src_p, j0_v) if direct else t.panel(src_p)
            t.run(t.rows(rows_max, lhs_p, corr_p, i0_v, rows_v), source, init_v, out_p, i0_v, rows_v, j0_v)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_direct_tile_1 = _make_tile(1, True)
_direct_tile_2 = _make_tile(2, True)
_panel_tile = _make_tile(PANEL_ROWS, False)


@intrinsic
def _spread_panel(typingctx, geo, rhs, j0, scr):
    """Spread the codes of the 64 columns from j0 to bytes and copy their zeros, scales and biases into scr."""
    sig = types.void(geo, rhs, types.int64, scr)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        geo_v, rhs_p, j0_v, scr_p = vnni.intrinsic_args(context, builder, signature, args)
        t = _Tile(builder, geo_v)
        codes, params, bias = t.direct(rhs_p, j0_v)
        b = builder
        with cgutils.for_range(b, t.nb) as loop:
            base = vnni.byte_ptr(b, scr_p, b.mul(loop.index, i64(PANEL_BLOCK_BYTES)))
            for v in range(TILE_VECS):
                for k in range(K_GROUPS):
                    vnni.store(b, codes(v, loop.index, k), vnni.byte_ptr(b, base, 64 * (TILE_VECS * k + v)))
                zero, scale = params(v, loop.index)
                vnni.store(b, zero, vnni.byte_ptr(b, base, K_GROUPS * TILE_VECS * 64 + 64 * v))
                vnni.store(b, scale, vnni.byte_ptr(b, base, K_GROUPS * TILE_VECS * 64 + TILE_COLS * 4 + 64 * v))
        end = vnni.byte_ptr(b, scr_p, b.mul(t.nb, i64(PANEL_BLOCK_BYTES)))
        for v in range(TILE_VECS):
            vnni.store(b, bias(v), vnni.byte_ptr(b, end, 64 * v))
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _matmul(m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    nb = k // BL
    geo = (np.int64(mr), np.int64(nb), np.int64(nr), np.int64(n))
    corr = vnni.neg_block_sums(
        vnni.VNNI512, lhs, m, mr, mr * nb * LHS_BLOCK_BYTES, nb, mr * LHS_BLOCK_BYTES, K_GROUPS, 8
    )
    out = np.empty((m, n), np.float32)
    init = np.float32(-0.0) if first_block_fmul else np.float32(0.0)
    if m <= DIRECT_ROWS:
        for j0 in range(0, n, TILE_COLS):
            if m == 1:
                _direct_tile_1(geo, lhs, corr, rhs, out, 0, m, j0, init)
            else:
                _direct_tile_2(geo, lhs, corr, rhs, out, 0, m, j0, init)
        return out
    scr = np.empty(nb * PANEL_BLOCK_BYTES + TILE_COLS * 4, np.uint8)
    for j0 in range(0, n, TILE_COLS):
        _spread_panel(geo, rhs, j0, scr)
        for i0 in range(0, m, PANEL_ROWS):
            _panel_tile(geo, lhs, corr, scr, out, i0, min(PANEL_ROWS, m - i0), j0, init)
    return out


def matmul_sme2_mopa(m: int, n: int, k: int, mr: int, nr: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``…1vlx4vl_sme2_mopa``: float32 [m, n], unclamped (first block's zero term is an FMUL). Needs AVX-512 VNNI."""
    return _matmul(m, n, k, mr, nr, lhs, rhs, True)


def matmul_sme2_dot(m: int, n: int, k: int, mr: int, nr: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``…1x4vl_sme2_dot``: float32 [m, n], unclamped (accumulator starts at +0). Needs AVX-512 VNNI."""
    return _matmul(m, n, k, mr, nr, lhs, rhs, False)


MatmulFn = Callable[[int, int, int, int, int, np.ndarray, np.ndarray], np.ndarray]


def best_matmul_sme2_mopa() -> MatmulFn:
    """The fastest ``matmul_sme2_mopa`` this host runs (the portable jit one without AVX-512 VNNI)."""
    return matmul_sme2_mopa if HAVE_VNNI else PORTABLE_MOPA


def best_matmul_sme2_dot() -> MatmulFn:
    """The fastest ``matmul_sme2_dot`` this host runs (the portable jit one without AVX-512 VNNI)."""
    return matmul_sme2_dot if HAVE_VNNI else PORTABLE_DOT
