"""Fast host execution of the Q4_0 SME2-layout kernels (``qsi8d32p1vlx4_qsi4c32p4vlx4`` MOPA GEMM and the
``qsi8d32p1x4_qsi4c32p4vlx4`` SDOT GEMV) with AVX-512 VNNI, reading the packed bytes they read.

Inputs: the LHS packed by ``lhs_quant_pack_qsi8d32p_f32_neon`` (spec §4.4: per group of mr rows, int8 of
(r, k) at (k//4)·4mr + 4r + k%4, then fp16 scales block-major) and the RHS packed by
``rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon`` (§4.1: per group of nr columns, uint16 of the four
unsigned codes of (K group G, column r) at 2·(G·nr + r), then fp16 scales block-major).

Arithmetic (§5.2), the same bits as the SME2 kernels: per block b an exact int32 ``dot_b = Σ q_L·(u − 8)``,
``S_b = s_L·s_R + 0`` (FMLALB from +0: exact, a −0 product becomes +0) and ``acc = fma(f32(dot_b), S_b, acc)``
block after block, from ``acc = +0`` — or ``acc = −0`` for the MOPA kernel, whose first block is an FMUL
(fma(x, y, −0) rounds as x·y and keeps a −0 product).

How: 16 columns per 512-bit vector (4 K values per 32-bit lane, as kr = 4). ``vpdpbusd`` multiplies the
unsigned codes u (nibbles spread to bytes) by the broadcast signed LHS bytes; the integer accumulator of a
block starts at −8·Σ q_L (per row and block), which makes it Σ q_L·(u − 8) exactly. A register tile of rows ×
4 vectors is generated in LLVM IR. With few rows the codes are spread on the fly; otherwise a panel of 64
columns is spread to bytes once and reused by every row tile.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.jit import vnni
from kleidipy.jit.numerics import F16_TABLE
from kleidipy.jit.vnni import F32, F32X16, I32, I32X16, I64, HOST_ISA

#: 16 columns per vector, 4 vectors per tile: a panel of 64 columns.
VEC_COLS = 16
PANEL_VECS = 4
PANEL_COLS = VEC_COLS * PANEL_VECS
#: bytes of one spread K group of a panel (64 columns × 4 codes).
PANEL_GROUP_BYTES = PANEL_COLS * 4
#: rows of a register tile reading a spread panel; up to this many rows the codes are spread on the fly.
import os
PANEL_TILE_ROWS = int(os.environ.get('TR', 4))
DIRECT_MAX_ROWS = 3


def _i64(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


class _Tile:
    """IR of one rows × 4-vector tile over all K blocks; ``rhs_codes``/``rhs_scales`` say where the RHS comes from."""

    def __init__(self, context, builder, native: bool, rows_max: int) -> None:  # noqa: ANN001
        self.context = context
        self.builder = builder
        self.native = native
        self.rows_max = rows_max

    def rows(self, lhs, lstride, mr, i0, rows, corr, sl, nb):  # noqa: ANN001, ANN201
        """Per tile row (rows past ``rows`` repeat the last one): LHS data offset, corr and sL pointers."""
        b = self.builder
        out = []
        for r in range(self.rows_max):
            last = b.sub(rows, _i64(1))
            rr = b.select(b.icmp_signed("<", _i64(r), rows), _i64(r), last)
            i = b.add(i0, rr)
            data = b.add(b.mul(b.udiv(i, mr), lstride), b.mul(b.urem(i, mr), _i64(4)))
            terms = b.mul(b.mul(i, nb), _i64(4))
            out.append((vnni.byte_ptr(b, lhs, data), vnni.byte_ptr(b, corr, terms), vnni.byte_ptr(b, sl, terms)))
        return out

    def run(self, row_ptrs, mr, nb, rhs_codes, rhs_scales, init, acc_mem=None):  # noqa: ANN001, ANN201
        """Accumulate all blocks; returns the float32 accumulators [row][vector] (allocas, or in acc_mem)."""
        b = self.builder
        if acc_mem is None:
            facc = [
                [cgutils.alloca_once_value(b, vnni.splat(b, init, F32X16)) for _ in range(PANEL_VECS)]
                for _ in row_ptrs
            ]
        else:
            facc = [
                [b.bitcast(vnni.byte_ptr(b, acc_mem, 64 * (PANEL_VECS * r + v)), F32X16.as_pointer())
                 for v in range(PANEL_VECS)]
                for r in range(len(row_ptrs))
            ]
            for row in facc:
                for p in row:
                    b.store(vnni.splat(b, init, F32X16), p, align=4)
        zero = vnni.const_splat(F32X16, 0.0)
        kgroup = b.mul(mr, _i64(4))
        with cgutils.for_range(b, nb) as loop:
            blk = loop.index
            iacc = []
            lrow = []
            for data, corr, _ in row_ptrs:
                c = b.load(b.bitcast(vnni.byte_ptr(b, corr, b.mul(blk, _i64(4))), I32.as_pointer()))
                iacc.append([vnni.splat(b, c, I32X16)] * PANEL_VECS)
                lrow.append(vnni.byte_ptr(b, data, b.mul(blk, b.mul(kgroup, _i64(8)))))
            for t in range(8):
                g = b.add(b.mul(blk, _i64(8)), _i64(t))
                codes = [rhs_codes(v, g) for v in range(PANEL_VECS)]
                for r, ptr in enumerate(lrow):
                    q = vnni.load(b, vnni.byte_ptr(b, ptr, b.mul(kgroup, _i64(t))), I32)
                    q = vnni.splat(b, q, I32X16)
                    iacc[r] = [vnni.dpbusd(b, iacc[r][v], codes[v], q, self.native) for v in range(PANEL_VECS)]
            s_r = [rhs_scales(v, blk) for v in range(PANEL_VECS)]
            for r, (_, _, sl) in enumerate(row_ptrs):
                s_l = b.load(b.bitcast(vnni.byte_ptr(b, sl, b.mul(blk, _i64(4))), F32.as_pointer()))
                s_l = vnni.splat(b, s_l, F32X16)
                for v in range(PANEL_VECS):
                    scale = vnni.fma(b, s_l, s_r[v], zero)
                    dot = b.sitofp(iacc[r][v], F32X16)
                    b.store(vnni.fma(b, dot, scale, b.load(facc[r][v], align=4)), facc[r][v], align=4)
        return facc

    def store(self, facc, out, ldo, i0, rows, j0, n) -> None:  # noqa: ANN001
        """Store rows < ``rows`` and vectors whose first column is < n to out[(i0 + r)·ldo + j0 + 16v]."""
        b = self.builder
        for r, accs in enumerate(facc):
            for v, acc in enumerate(accs):
                col = b.add(j0, _i64(VEC_COLS * v))
                ok = b.and_(b.icmp_signed("<", _i64(r), rows), b.icmp_signed("<", col, n))
                with b.if_then(ok):
                    off = b.mul(b.add(b.mul(b.add(i0, _i64(r)), ldo), col), _i64(4))
                    vnni.store(b, b.load(acc, align=4), vnni.byte_ptr(b, out, off))


def _direct_source(tile: _Tile, rhs, rstride, nr, nb, j0, n):  # noqa: ANN001, ANN202
    """RHS read from the packed buffer: codes spread on the fly, fp16 scales converted per block."""
    b = tile.builder
    bases = []
    for v in range(PANEL_VECS):
        col = b.add(j0, _i64(VEC_COLS * v))
        col = b.select(b.icmp_signed("<", col, n), col, j0)  # vectors past n re-read the first one
        group = b.mul(b.udiv(col, nr), rstride)
        r2 = b.mul(b.urem(col, nr), _i64(2))
        data = vnni.byte_ptr(b, rhs, b.add(group, r2))
        scales = vnni.byte_ptr(b, rhs, b.add(b.add(group, b.mul(b.mul(nr, nb), _i64(16))), r2))
        bases.append((data, scales))
    step = b.mul(nr, _i64(2))

    def codes(v: int, g):  # noqa: ANN001, ANN202
        return vnni.spread_nibbles(b, vnni.byte_ptr(b, bases[v][0], b.mul(g, step)), tile.native)

    def scales(v: int, blk):  # noqa: ANN001, ANN202
        return vnni.f16_to_f32(b, vnni.byte_ptr(b, bases[v][1], b.mul(blk, step)), tile.native)

    return codes, scales


def _panel_source(tile: _Tile, scr, srf):  # noqa: ANN001, ANN202
    """RHS read from a spread panel: codes [K group][4 vectors][64 B], float32 scales [block][64]."""
    b = tile.builder

    def codes(v: int, g):  # noqa: ANN001, ANN202
        off = b.add(b.mul(g, _i64(PANEL_GROUP_BYTES)), _i64(64 * v))
        return vnni.load(b, vnni.byte_ptr(b, scr, off), I32X16)

    def scales(v: int, blk):  # noqa: ANN001, ANN202
        off = b.mul(b.add(b.mul(blk, _i64(PANEL_COLS)), _i64(VEC_COLS * v)), _i64(4))
        return vnni.load(b, vnni.byte_ptr(b, srf, off), F32X16)

    return codes, scales


_LHS_ARGS = (types.int64, types.int64, types.int64, types.int64)  # lstride, mr, i0, rows


def _make_direct_tile(rows_max: int):  # noqa: ANN202
    @intrinsic
    def direct_tile(typingctx, isa, lhs, lstride, mr, i0, rows, corr, sl, nb, rhs, rstride, nr, j0, n, out, ldo, init):
        sig = types.void(
            isa, lhs, *_LHS_ARGS, corr, sl, types.int64, rhs, types.int64, types.int64,
            types.int64, types.int64, out, types.int64, types.float32,
        )  # fmt: skip

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            (_, lhs_v, lstride_v, mr_v, i0_v, rows_v, corr_v, sl_v, nb_v, rhs_v, rstride_v, nr_v, j0_v, n_v,
             out_v, ldo_v, init_v) = args  # fmt: skip
            a = signature.args
            tile = _Tile(context, builder, vnni.isa_native(a[0]), rows_max)
            ptr = lambda i, v: vnni.array_ptr(context, builder, a[i], v)  # noqa: E731
            row_ptrs = tile.rows(ptr(1, lhs_v), lstride_v, mr_v, i0_v, rows_v, ptr(6, corr_v), ptr(7, sl_v), nb_v)
            codes, scales = _direct_source(tile, ptr(9, rhs_v), rstride_v, nr_v, nb_v, j0_v, n_v)
            facc = tile.run(row_ptrs, mr_v, nb_v, codes, scales, init_v)
            tile.store(facc, ptr(14, out_v), ldo_v, i0_v, rows_v, j0_v, n_v)
            return context.get_dummy_value()

        return sig, codegen

    return direct_tile


def _make_panel_tile(rows_max: int):  # noqa: ANN202
    @intrinsic
    def panel_tile(typingctx, isa, lhs, lstride, mr, i0, rows, corr, sl, nb, scr, srf, j0, n, out, ldo, init, acc):
        sig = types.void(
            isa, lhs, *_LHS_ARGS, corr, sl, types.int64, scr, srf, types.int64, types.int64, out, types.int64,
            types.float32, acc
        )  # fmt: skip

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            (_, lhs_v, lstride_v, mr_v, i0_v, rows_v, corr_v, sl_v, nb_v, scr_v, srf_v, j0_v, n_v, out_v, ldo_v,
             init_v, acc_v) = args  # fmt: skip
            a = signature.args
            tile = _Tile(context, builder, vnni.isa_native(a[0]), rows_max)
            ptr = lambda i, v: vnni.array_ptr(context, builder, a[i], v)  # noqa: E731
            row_ptrs = tile.rows(ptr(1, lhs_v), lstride_v, mr_v, i0_v, rows_v, ptr(6, corr_v), ptr(7, sl_v), nb_v)
            codes, scales = _panel_source(tile, ptr(9, scr_v), ptr(10, srf_v))
            facc = tile.run(row_ptrs, mr_v, nb_v, codes, scales, init_v, ptr(16, acc_v))
            tile.store(facc, ptr(13, out_v), ldo_v, i0_v, rows_v, j0_v, n_v)
            return context.get_dummy_value()

        return sig, codegen

    return panel_tile


_direct_tile_1 = _make_direct_tile(1)
_direct_tile_2 = _make_direct_tile(2)
_direct_tile_3 = _make_direct_tile(3)
_panel_tile = _make_panel_tile(PANEL_TILE_ROWS)


@intrinsic
def _spread_panel(typingctx, isa, rhs, rstride, nr, nb, j0, n, scr, srf):
    """Spread the codes of the 64 columns from j0 to bytes and their fp16 scales to float32 (vectors past n
    repeat the first one)."""
    sig = types.void(isa, rhs, types.int64, types.int64, types.int64, types.int64, types.int64, scr, srf)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        _, rhs_v, rstride_v, nr_v, nb_v, j0_v, n_v, scr_v, srf_v = args
        a = signature.args
        tile = _Tile(context, builder, vnni.isa_native(a[0]), 0)
        codes, scales = _direct_source(
            tile, vnni.array_ptr(context, builder, a[1], rhs_v), rstride_v, nr_v, nb_v, j0_v, n_v
        )
        scr_p = vnni.array_ptr(context, builder, a[7], scr_v)
        srf_p = vnni.array_ptr(context, builder, a[8], srf_v)
        b = builder
        with cgutils.for_range(b, b.mul(nb_v, _i64(8))) as loop:
            base = b.mul(loop.index, _i64(PANEL_GROUP_BYTES))
            for v in range(PANEL_VECS):
                vnni.store(b, codes(v, loop.index), vnni.byte_ptr(b, scr_p, b.add(base, _i64(64 * v))))
        with cgutils.for_range(b, nb_v) as loop:
            base = b.mul(loop.index, _i64(PANEL_COLS * 4))
            for v in range(PANEL_VECS):
                vnni.store(b, scales(v, loop.index), vnni.byte_ptr(b, srf_p, b.add(base, _i64(64 * v))))
        return context.get_dummy_value()

    return sig, codegen


# --------------------------------------------------------------------------------------------- drivers


@numba.njit(cache=True, nogil=True)
def _lhs_terms(m, k, mr, lhs):
    """Per row and block of a packed LHS: the correction −8·Σ q_L (int32) and the float32 scale s_L."""
    nb = k // 32
    stride = mr * nb * 34
    lhs_i8 = lhs.view(np.int8)
    corr = np.empty(m * nb, np.int32)
    sl = np.empty(m * nb, np.float32)
    for i in range(m):
        base = (i // mr) * stride
        r = i % mr
        for b in range(nb):
            s = 0
            for t in range(8):
                off = base + ((8 * b + t) * mr + r) * 4
                for e in range(4):
                    s += lhs_i8[off + e]
            corr[i * nb + b] = -8 * s
            so = base + mr * nb * 32 + 2 * (b * mr + r)
            sl[i * nb + b] = F16_TABLE[np.int64(lhs[so]) | (np.int64(lhs[so + 1]) << 8)]
    return corr, sl


@numba.njit(cache=True, nogil=True)
def _compute(isa, m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    nb = k // 32
    ldo = (n + VEC_COLS - 1) // VEC_COLS * VEC_COLS
    out = np.empty((m, ldo), np.float32)
    flat = out.reshape(-1)
    corr, sl = _lhs_terms(m, k, mr, lhs)
    init = np.float32(-0.0) if first_block_fmul else np.float32(0.0)
    lstride = mr * nb * 34
    rstride = nr * nb * 18
    if m <= DIRECT_MAX_ROWS:
        for j0 in range(0, n, PANEL_COLS):
            if m == 1:
                _direct_tile_1(isa, lhs, lstride, mr, 0, m, corr, sl, nb, rhs, rstride, nr, j0, n, flat, ldo, init)
            elif m == 2:
                _direct_tile_2(isa, lhs, lstride, mr, 0, m, corr, sl, nb, rhs, rstride, nr, j0, n, flat, ldo, init)
            else:
                _direct_tile_3(isa, lhs, lstride, mr, 0, m, corr, sl, nb, rhs, rstride, nr, j0, n, flat, ldo, init)
    else:
        scr = np.empty(nb * 8 * PANEL_GROUP_BYTES, np.uint8)
        srf = np.empty(nb * PANEL_COLS, np.float32)
        acc = np.empty(PANEL_TILE_ROWS * PANEL_COLS, np.float32)
        for j0 in range(0, n, PANEL_COLS):
            _spread_panel(isa, rhs, rstride, nr, nb, j0, n, scr, srf)
            for i0 in range(0, m, PANEL_TILE_ROWS):
                rows = min(PANEL_TILE_ROWS, m - i0)
                _panel_tile(isa, lhs, lstride, mr, i0, rows, corr, sl, nb, scr, srf, j0, n, flat, ldo, init, acc)
    if ldo != n:
        return np.ascontiguousarray(out[:, :n])
    return out


def compute(
    m: int,
    n: int,
    k: int,
    mr: int,
    nr: int,
    lhs_u8: np.ndarray,
    rhs_u8: np.ndarray,
    first_block_fmul: bool,
    isa: vnni.Isa = HOST_ISA,
) -> np.ndarray:
    """Unclamped float32 [m, n] = packed LHS (§4.4, mr rows per group) × packed RHS (§4.1, nr per group).

    ``rhs_u8`` starts at the first group used; buffers must be large enough (the caller validates sizes).
    ``first_block_fmul`` selects the MOPA recipe (first block FMUL). Releases the GIL.
    """
    return _compute(isa, m, n, k, mr, nr, lhs_u8, rhs_u8, bool(first_block_fmul))
