"""Fast host execution of the Q4_0 kernels with AVX-512 VNNI, reading the packed bytes they read: the SME2 layout
(``qsi8d32p1vlx4_qsi4c32p4vlx4`` MOPA GEMM, ``qsi8d32p1x4_qsi4c32p4vlx4`` SDOT GEMV) and the NEON one (below).

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
block starts at −8·Σ q_L (per row and block, precomputed), which makes it Σ q_L·(u − 8) exactly. A register
tile of up to 4 rows × 4 vectors is generated in LLVM IR (:mod:`kleidipy.core.vnni`), panel (64 columns) by
panel. A GEMM of more than DECODE_ROWS rows first decodes the panel (codes spread to bytes with
``vpmultishiftqb``, scales to float32) into a scratch that every row tile then reads with one load per K group and
vector (``make_decoder``, ``source_spread``: the spreading shares the vpdpbusd ports, and done once per panel
instead of once per row tile the GEMM runs 5-20 % faster at m = 128-512); a few rows spread the codes on the fly
from the packed RHS. The GEMV (one row, memory-bound) reads up to four panels far apart at once, block by block:
four memory streams (``make_gemv_tile``).

The NEON kernels (dotprod / i8mm) run on the same tiles: :mod:`~kleidipy.kernels.qsi8d32p_qsi4c32p.vnni_neon`.

The family's LHS packers, vectorised: :mod:`~kleidipy.kernels.qsi8d32p_qsi4c32p.vnni_pack`.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni
from kleidipy.core.node import clamp_in_place, copy_clamped
from kleidipy.core.numerics import F16_BITS_TO_F32
from kleidipy.core.vnni import F32, F32X16, HOST_ISA, I32, I32X16, I64, i64
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError

#: columns per vector; vectors per tile: a panel of 64 columns.
VEC_COLS = 16
PANEL_VECS = 4
PANEL_COLS = VEC_COLS * PANEL_VECS
#: rows of a full register tile (4 rows × 4 vectors of int32 accumulators + 4 RHS vectors fit in 32 zmm).
TILE_ROWS = 4
#: the SME2 layout's tiles leave the RHS stream to the hardware prefetcher (with a software prefetch 32 K groups
#: ahead a cold 49152 × 576 GEMV took ~1300 µs, without 1070-1140; 1536-wide shapes the same within noise);
#: PARAMS' prefetch slot is the SME1 layout's (vnni_s4s0)
NO_PREFETCH = 0
#: the integer parameters handed to the IR code in one int64 array (see ``_compute``).
PARAMS = ("lstride", "mr", "nb", "rstride", "nr", "n", "ldo", "prefetch")
_LDO, _NB = PARAMS.index("ldo"), PARAMS.index("nb")
#: integer accumulators per row and vector when a tile takes whole blocks (independent vpdpbusd chains)
CHAINS = 2
#: panels (memory streams) the GEMV reads at once, far apart (see ``make_gemv_tile``)
GEMV_PANELS = 4
#: a GEMM of more rows decodes each panel once for its row tiles (at 16 rows, four tiles, spreading on the fly is
#: as fast)
DECODE_ROWS = 16
#: bytes per block of a decoded panel: 8 K groups × 4 vectors of codes, then 4 vectors of float32 scales
SPREAD_BLOCK = (8 + 1) * PANEL_VECS * 64


class Tile:
    """IR of a tile: up to 4 rows × the 64 columns of a panel (4 vectors of 16), all K blocks.

    The RHS comes from a source (:meth:`source` for the SME2 layout, :meth:`source_neon` for the NEON one):
    ``codes(v, blk, step, i)`` (i32x16 of the unsigned codes of vector v, K group step·per + i of block blk,
    spread to bytes) and ``scales(v, blk)`` (float32 s_R); rows are read from the packed LHS (the §4.4 layout)
    and the per-row terms.
    """

    def __init__(self, builder, native: bool, params) -> None:
        self.builder = builder
        self.native = native
        pptr = builder.bitcast(params, I64.as_pointer())
        for i, name in enumerate(PARAMS):
            setattr(self, name, builder.load(builder.gep(pptr, [i64(i)])))

    def rows(self, rows_max: int, lhs, corr, sl, i0, rows):
        """Per tile row (rows past ``rows`` repeat the last one): pointers to its LHS bytes, corr and s_L.

        corr/s_L are laid out as the packed LHS scales: [group][block][mr].
        """
        b = self.builder
        out = []
        for r in range(rows_max):
            rr = b.select(b.icmp_signed("<", i64(r), rows), i64(r), b.sub(rows, i64(1)))
            i = b.add(i0, rr)
            g = b.udiv(i, self.mr)
            rin = b.urem(i, self.mr)
            data = b.add(b.mul(g, self.lstride), b.mul(rin, i64(4)))
            terms = b.mul(b.add(b.mul(b.mul(g, self.nb), self.mr), rin), i64(4))
            out.append((vnni.byte_ptr(b, lhs, data), vnni.byte_ptr(b, corr, terms), vnni.byte_ptr(b, sl, terms)))
        return out

    def run(self, row_ptrs, codes, scales, per: int, acc_mem, init, nvec: int = PANEL_VECS):
        """Accumulate every block into float32 accumulators [row][vector] kept in acc_mem (64 B each), from init,
        for ``nvec`` vectors (a panel's 4, or the GEMV's panels side by side).
        The 8 K groups of a block are taken ``per`` at a time (the codes of one step come from one load); with
        per = 8 (whole blocks, one row) each vector runs through all blocks before the next one starts, so that
        the RHS is read as few streams at a time."""
        b = self.builder
        facc = [[vnni.byte_ptr(b, acc_mem, 64 * (nvec * r + v)) for v in range(nvec)] for r in range(len(row_ptrs))]
        for row in facc:
            for p in row:
                vnni.store(b, vnni.splat(b, init, F32X16), p)
        iacc = [[cgutils.alloca_once(b, I32X16) for _ in range(nvec)] for _ in row_ptrs]
        for vs in [[v] for v in range(nvec)] if per == 8 else [list(range(nvec))]:
            with cgutils.for_range(b, self.nb) as loop:
                self._block(loop.index, vs, row_ptrs, codes, scales, per, iacc, acc_mem)
        return facc

    def _block(self, blk, vs, row_ptrs, codes, scales, per: int, iacc, acc_mem) -> None:
        """One block of the vectors ``vs``: integer dots from the −8·Σq terms, then the float recipe."""
        b = self.builder
        kgroup = b.mul(self.mr, i64(4))  # bytes of one K group of the LHS; also the per-block step of corr/s_L
        lrow = []
        for r, (data, corr, _) in enumerate(row_ptrs):
            c = vnni.load(b, vnni.byte_ptr(b, corr, b.mul(blk, kgroup)), I32)
            for v in vs:
                b.store(vnni.splat(b, c, I32X16), iacc[r][v])
            lrow.append(vnni.byte_ptr(b, data, b.mul(blk, b.mul(kgroup, i64(8)))))
        if per == 8:  # the whole block per vector, each row's LHS bytes broadcast once; the 8 dot products go
            # to CHAINS independent accumulators (exact integer sums), not one chain of dependent vpdpbusd
            qs = [[self.lhs_group(ptr, kgroup, i64(t)) for t in range(8)] for ptr in lrow]
            zeros = vnni.const_splat(I32X16, 0)
            for v in vs:
                parts = [[b.load(iacc[r][v])] + [zeros] * (CHAINS - 1) for r in range(len(lrow))]
                for t in range(8):
                    vec = codes(v, blk, i64(0), t)
                    for r in range(len(lrow)):
                        parts[r][t % CHAINS] = vnni.dpbusd(b, parts[r][t % CHAINS], vec, qs[r][t], self.native)
                for r in range(len(lrow)):
                    while len(parts[r]) > 1:
                        parts[r] = [b.add(parts[r][i], parts[r][i + 1]) for i in range(0, len(parts[r]), 2)]
                    b.store(parts[r][0], iacc[r][v])
        else:  # a real loop over the steps (opaque count: not fully unrolled) keeps the scheduler from hoisting
            # the loads of all K groups above the dot products (register spills)
            with cgutils.for_range(b, vnni.opaque(b, i64(8 // per))) as inner:
                step = inner.index
                for i in range(per):
                    t = b.add(b.mul(step, i64(per)), i64(i))
                    vec = {v: codes(v, blk, step, i) for v in vs}
                    for r, ptr in enumerate(lrow):
                        q = self.lhs_group(ptr, kgroup, t)
                        for v in vs:
                            b.store(vnni.dpbusd(b, b.load(iacc[r][v]), vec[v], q, self.native), iacc[r][v])
        s_r = {v: scales(v, blk) for v in vs}
        zero = vnni.const_splat(F32X16, 0.0)
        acc_base = vnni.opaque(b, acc_mem)  # keep the float accumulators in memory (not promoted)
        for r, (_, _, sl) in enumerate(row_ptrs):
            s_l = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, sl, b.mul(blk, kgroup)), F32), F32X16)
            for v in vs:
                scale = vnni.fma(b, s_l, s_r[v], zero)
                dot = b.sitofp(b.load(iacc[r][v]), F32X16)
                p = vnni.byte_ptr(b, acc_base, 64 * (len(iacc[r]) * r + v))
                vnni.store(b, vnni.fma(b, dot, scale, vnni.load(b, p, F32X16)), p)

    def lhs_group(self, ptr, kgroup, t):
        """The 4 LHS bytes of K group t of a row's block, in every lane."""
        b = self.builder
        return vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, b.mul(kgroup, t)), I32), I32X16)

    def store(self, facc, out, i0, rows, j0, paired: bool) -> None:
        """Store rows < ``rows`` to out[(i0 + r)·ldo + j0 ...] (``paired``: the accumulators are in PAIR_LANES
        order). ldo covers whole panels: vectors past n land in padding columns."""
        b = self.builder
        for r, accs in enumerate(facc):
            values = [vnni.load(b, acc, F32X16) for acc in accs]
            if paired:
                values = [x for v in range(0, PANEL_VECS, 2) for x in vnni.unpair(b, values[v], values[v + 1])]
            with b.if_then(b.icmp_signed("<", i64(r), rows)):
                row = b.add(b.mul(b.add(i0, i64(r)), self.ldo), j0)
                for v, value in enumerate(values):
                    index = b.add(row, i64(VEC_COLS * v))
                    vnni.store(b, value, vnni.byte_ptr(b, out, b.mul(index, i64(4))))

    def source(self, rhs, j0, contiguous: bool):
        """The packed RHS of the panel: codes spread to bytes on the fly, fp16 scales converted per block.

        ``contiguous``: nr is a multiple of 64, so the 4 vectors are side by side in one group (vectors past
        n read the group's padding columns). Otherwise each vector is located on its own, and vectors past n
        re-read the first one (their group may not exist).
        """
        b = self.builder
        scale_region = b.mul(b.mul(self.nr, self.nb), i64(16))
        bases = []
        for v in range(1 if contiguous else PANEL_VECS):
            col = b.add(j0, i64(VEC_COLS * v))
            col = b.select(b.icmp_signed("<", col, self.n), col, j0)
            group = b.mul(b.udiv(col, self.nr), self.rstride)
            r2 = b.mul(b.urem(col, self.nr), i64(2))
            data = vnni.byte_ptr(b, rhs, b.add(group, r2))
            bases.append((data, vnni.byte_ptr(b, rhs, b.add(b.add(group, scale_region), r2))))
        step = b.mul(self.nr, i64(2))
        if contiguous:  # vectors in PAIR_LANES order: (0, 1) from columns j0 .. j0+31, (2, 3) from the next 32
            data, scale = bases[0]
            pairs = {}

            def codes(v: int, blk, t, i: int):
                g = b.add(b.mul(blk, i64(8)), t)
                if v % 2 == 0:
                    ptr = vnni.byte_ptr(b, data, b.add(b.mul(g, step), i64(32 * v)))
                    pairs[v] = vnni.spread_nibble_pairs(b, ptr, self.native)
                return pairs[v - v % 2][v % 2]

            def scales(v: int, blk):
                ptr = vnni.byte_ptr(b, scale, b.add(b.mul(blk, step), i64(32 * (v - v % 2))))
                return vnni.f16_to_f32(b, ptr, self.native, vnni.PAIR_LANES[v % 2])

        else:

            def codes(v: int, blk, t, i: int):
                g = b.add(b.mul(blk, i64(8)), t)
                return vnni.spread_nibbles(b, vnni.byte_ptr(b, bases[v][0], b.mul(g, step)), self.native)

            def scales(v: int, blk):
                return vnni.f16_to_f32(b, vnni.byte_ptr(b, bases[v][1], b.mul(blk, step)), self.native)

        return codes, scales, 1


def make_tile(rows_max: int | None, source: Callable, paired: bool = False):
    """Intrinsic ``tile(isa, params, lhs, corr, sl, rhs, out, acc, i0, rows, j0, init)``: rows i0 .. i0+rows-1
    (rows <= rows_max; more rows repeat the last) × the 64 columns from j0 of out, from ``init``, the RHS read
    through ``source(tile, rhs, j0) -> (codes, scales, per)`` (:meth:`Tile.source` here, the NEON layout's in
    :mod:`~kleidipy.kernels.qsi8d32p_qsi4c32p.vnni_neon`); ``paired``: its vectors come in PAIR_LANES order.
    ``rows_max`` None: a tile of exactly ``rows`` rows for each count 1 .. TILE_ROWS, the one for ``rows`` run (the
    tail rows of m pay for no repeated row)."""

    @intrinsic
    def tile(typingctx, isa, params, lhs, corr, sl, rhs, out, acc, i0, rows, j0, init):
        int64 = types.int64
        sig = types.void(isa, params, lhs, corr, sl, rhs, out, acc, int64, int64, int64, types.float32)

        def codegen(context, builder, signature, args):
            _, params_p, lhs_p, corr_p, sl_p, rhs_p, out_p, acc_p, i0_v, rows_v, j0_v, init_v = vnni.intrinsic_args(
                context, builder, signature, args
            )

            def emit(count: int) -> None:
                t = Tile(builder, vnni.isa_native(signature.args[0]), params_p)
                row_ptrs = t.rows(count, lhs_p, corr_p, sl_p, i0_v, rows_v)
                codes, scales, per = source(t, rhs_p, j0_v)
                facc = t.run(row_ptrs, codes, scales, per, acc_p, init_v)
                t.store(facc, out_p, i0_v, rows_v, j0_v, paired)

            if rows_max is None:
                for count in range(1, TILE_ROWS + 1):
                    with builder.if_then(builder.icmp_signed("==", rows_v, i64(count))):
                        emit(count)
            else:
                emit(rows_max)
            return context.get_dummy_value()

        return sig, codegen

    return tile


def make_gemv_tile(panels: int):
    """Intrinsic ``gemv(isa, params, lhs, corr, sl, rhs, out, acc, js, init)``: the GEMV (row 0) over ``panels``
    panels of 64 columns (nr a multiple of 64) starting at the columns js[0 .. panels-1] (int64), all of them
    block by block in one loop: one memory stream per panel. From DRAM one stream runs at ~15 GB/s on this
    tile for k = 576 (a panel's codes are 18 KB, then its scales: the hardware prefetcher starts over at every
    panel) and four far apart at ~24 (k = 1536: 21 -> 30), in cache the same (~50). acc holds 4·panels vectors."""

    @intrinsic
    def gemv(typingctx, isa, params, lhs, corr, sl, rhs, out, acc, js, init):
        sig = types.void(isa, params, lhs, corr, sl, rhs, out, acc, js, types.float32)

        def codegen(context, builder, signature, args):
            _, params_p, lhs_p, corr_p, sl_p, rhs_p, out_p, acc_p, js_p, init_v = vnni.intrinsic_args(
                context, builder, signature, args
            )
            b = builder
            t = Tile(b, vnni.isa_native(signature.args[0]), params_p)
            row_ptrs = t.rows(1, lhs_p, corr_p, sl_p, i64(0), i64(1))
            j0s = [vnni.load(b, vnni.byte_ptr(b, js_p, i64(8 * p)), I64) for p in range(panels)]
            sources = [t.source(rhs_p, j0, True) for j0 in j0s]

            def codes(v: int, blk, step, i: int):
                return sources[v // PANEL_VECS][0](v % PANEL_VECS, blk, step, i)

            def scales(v: int, blk):
                return sources[v // PANEL_VECS][1](v % PANEL_VECS, blk)

            facc = t.run(row_ptrs, codes, scales, 1, acc_p, init_v, PANEL_VECS * panels)
            for p, j0 in enumerate(j0s):
                t.store([facc[0][PANEL_VECS * p : PANEL_VECS * (p + 1)]], out_p, i64(0), i64(1), j0, True)
            return context.get_dummy_value()

        return sig, codegen

    return gemv


def source_spread(tile: Tile, panel):
    """A panel decoded by a :func:`make_decoder` intrinsic: per block (SPREAD_BLOCK bytes), the unsigned codes of K
    group t of vector v at 64·(4t + v), then the 4 vectors' float32 scales at 64·(32 + v)."""
    b = tile.builder

    def codes(v: int, blk, step, i: int):
        at = b.add(b.mul(blk, i64(SPREAD_BLOCK)), b.mul(b.add(b.mul(step, i64(4)), i64(v)), i64(64)))
        return vnni.load(b, vnni.byte_ptr(b, panel, at), I32X16)

    def scales(v: int, blk):
        return vnni.load(b, vnni.byte_ptr(b, panel, b.add(b.mul(blk, i64(SPREAD_BLOCK)), i64(64 * (32 + v)))), F32X16)

    return codes, scales, 1


def make_decoder(source: Callable):
    """Intrinsic ``decode(isa, params, rhs, j0, panel)``: the 64 columns from j0 of the packed RHS, read through
    ``source(tile, rhs, j0) -> (codes, scales, per)`` (as :func:`make_tile`'s), decoded into ``panel`` (the layout
    of :func:`source_spread`), so that every row tile reads them with one load per K group and vector."""

    @intrinsic
    def decode(typingctx, isa, params, rhs, j0, panel):
        sig = types.void(isa, params, rhs, types.int64, panel)

        def codegen(context, builder, signature, args):
            _, params_p, rhs_p, j0_v, panel_p = vnni.intrinsic_args(context, builder, signature, args)
            t = Tile(builder, vnni.isa_native(signature.args[0]), params_p)
            codes, scales, per = source(t, rhs_p, j0_v)
            b = builder
            with cgutils.for_range(b, t.nb) as loop:
                blk = loop.index
                at = b.mul(blk, i64(SPREAD_BLOCK))
                for g in range(8):  # K group g is step g // per, item g % per of the source
                    for v in range(PANEL_VECS):
                        ptr = vnni.byte_ptr(b, panel_p, b.add(at, i64(64 * (4 * g + v))))
                        vnni.store(b, codes(v, blk, i64(g // per), g % per), ptr)
                for v in range(PANEL_VECS):
                    vnni.store(b, scales(v, blk), vnni.byte_ptr(b, panel_p, b.add(at, i64(64 * (32 + v)))))
            return context.get_dummy_value()

        return sig, codegen

    return decode


#: nr = 16 or 32 (SVL 128/256): one row (the GEMV) or 4 (tail rows repeat the last)
_TILE_1_SINGLE = make_tile(1, lambda t, rhs, j0: t.source(rhs, j0, False))
_TILE_4_SINGLE = make_tile(TILE_ROWS, lambda t, rhs, j0: t.source(rhs, j0, False))
#: tiles of exactly 1 .. 4 rows for nr a multiple of 64
_TILE = make_tile(None, lambda t, rhs, j0: t.source(rhs, j0, True), True)
#: a panel of the SME2 layout (nr a multiple of 64) decoded once, and tiles of 1 .. 4 rows reading it
_DECODE = make_decoder(lambda t, rhs, j0: t.source(rhs, j0, True))
_SPREAD = make_tile(None, lambda t, panel, j0: source_spread(t, panel), True)
#: the GEMV's tiles over 1 .. GEMV_PANELS panels at once (acc holds TILE_ROWS · PANEL_VECS vectors)
_GEMV_1, _GEMV_2, _GEMV_3, _GEMV_4 = (make_gemv_tile(p) for p in range(1, GEMV_PANELS + 1))


# --------------------------------------------------------------------------------------------- drivers


@numba.njit(cache=True, nogil=True)
def lhs_terms(isa, m, k, mr, lhs):
    """Per row and block of a packed LHS, laid out [group][block][mr]: −8·Σ q_L (int32) and s_L (float32)."""
    nb = k // 32
    groups = (m + mr - 1) // mr
    stride = mr * nb * 34
    corr = vnni.neg_block_sums(isa, lhs, m, mr, stride, nb, mr * 32, np.int64(8), np.int64(8))
    sl = np.empty(groups * nb * mr, np.float32)
    for g in range(groups):
        base = g * stride
        off = g * nb * mr
        count = nb * mr
        vec = count // VEC_COLS
        scales = base + mr * nb * 32
        vnni.f16_to_f32_vectors(isa, lhs, scales, vec, sl, off)
        for x in range(vec * VEC_COLS, count):
            sl[off + x] = F16_BITS_TO_F32[np.int64(lhs[scales + 2 * x]) | (np.int64(lhs[scales + 2 * x + 1]) << 8)]
    return corr, sl


@numba.njit(cache=True, nogil=True)
def _gemv(isa, params, lhs, corr, sl, rhs, out, acc, panels, init):  # pragma: no cover - compiled
    """The GEMV over ``panels`` panels (nr a multiple of 64): GEMV_PANELS streams at a time, panels // GEMV_PANELS
    apart, then the panels left over together."""
    js = np.empty(GEMV_PANELS, np.int64)
    streams = min(GEMV_PANELS, panels)
    apart = panels // streams
    for p in range(apart + 1):
        count = streams if p < apart else panels - streams * apart
        for q in range(count):
            js[q] = PANEL_COLS * (p + q * apart if p < apart else streams * apart + q)
        if count == 4:
            _GEMV_4(isa, params, lhs, corr, sl, rhs, out, acc, js, init)
        elif count == 3:
            _GEMV_3(isa, params, lhs, corr, sl, rhs, out, acc, js, init)
        elif count == 2:
            _GEMV_2(isa, params, lhs, corr, sl, rhs, out, acc, js, init)
        elif count == 1:
            _GEMV_1(isa, params, lhs, corr, sl, rhs, out, acc, js, init)


@numba.njit(cache=True, nogil=True)
def _tiles(isa, params, m, nr, lhs, corr, sl, rhs, flat, acc, init, j0s, ld_clamp):  # pragma: no cover - compiled
    """The row tiles of every panel in range(*j0s) into flat (row stride params' ldo); ld_clamp > 0: each tile's
    rows clamped to ±FLT_MAX in place right after it is stored (while it is in L1), at row stride ld_clamp. More
    than DECODE_ROWS rows (nr a multiple of 64) read each panel decoded once (``_DECODE``), fewer spread its codes
    in every row tile (the first streams the panel from memory, the rest from L2)."""
    decoded = m > DECODE_ROWS and nr % PANEL_COLS == 0
    panel = np.empty(params[_NB] * SPREAD_BLOCK if decoded else 0, np.uint8)
    for j0 in range(j0s[0], j0s[1], PANEL_COLS):
        if decoded:
            _DECODE(isa, params, rhs, j0, panel)
        for i0 in range(0, m, TILE_ROWS):
            rows = min(TILE_ROWS, m - i0)
            if decoded:
                _SPREAD(isa, params, lhs, corr, sl, panel, flat, acc, i0, rows, j0, init)
            elif nr % PANEL_COLS == 0:
                _TILE(isa, params, lhs, corr, sl, rhs, flat, acc, i0, rows, j0, init)
            elif m == 1:
                _TILE_1_SINGLE(isa, params, lhs, corr, sl, rhs, flat, acc, i0, rows, j0, init)
            else:
                _TILE_4_SINGLE(isa, params, lhs, corr, sl, rhs, flat, acc, i0, rows, j0, init)
            if ld_clamp > 0:
                for r in range(i0, i0 + rows):
                    clamp_in_place(flat[r * ld_clamp + j0 : r * ld_clamp + j0 + PANEL_COLS])


@numba.njit(cache=True, nogil=True)
def _prologue(isa, m, n, k, mr, nr, lhs, ldo, first_block_fmul):  # pragma: no cover - compiled
    """What every driver sets up: the PARAMS array (output row stride ldo), the per-row terms, the initial value
    and the float accumulators' memory."""
    nb = k // 32
    params = np.array([mr * nb * 34, mr, nb, nr * nb * 18, nr, n, ldo, NO_PREFETCH], np.int64)  # PARAMS
    corr, sl = lhs_terms(isa, m, k, mr, lhs)
    init = np.float32(-0.0) if first_block_fmul else np.float32(0.0)
    return params, corr, sl, init, np.empty(TILE_ROWS * PANEL_COLS, np.float32)


@numba.njit(cache=True, nogil=True)
def _compute(isa, m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    ldo = (n + PANEL_COLS - 1) // PANEL_COLS * PANEL_COLS  # whole panels: tiles store 64 columns
    params, corr, sl, init, acc = _prologue(isa, m, n, k, mr, nr, lhs, ldo, first_block_fmul)
    out = np.empty((m, ldo), np.float32)
    flat = out.reshape(-1)
    if m == 1 and nr % PANEL_COLS == 0:
        _gemv(isa, params, lhs, corr, sl, rhs, flat, acc, ldo // PANEL_COLS, init)
    else:
        _tiles(isa, params, m, nr, lhs, corr, sl, rhs, flat, acc, init, (0, n), 0)
    if ldo != n:
        return np.ascontiguousarray(out[:, :n])
    return out


@numba.njit(cache=True, nogil=True)
def compute_into(isa, m, n, k, mr, nr, lhs, rhs, first_block_fmul, dst, ld):  # pragma: no cover - compiled
    """:func:`_compute` clamped to ±FLT_MAX into dst (flat float32, row i at dst[i·ld :], n columns), with no
    result array in between: the whole panels' tiles store into dst and clamp their rows at once; a last partial
    panel goes through a scratch of whole panels (its tiles store 64 columns). The same bits as ``_compute`` and a
    clamp. For the compiled plan's matmuls, whose results would otherwise be allocated and copied (3 MB for a 512 ×
    1536 GEMM; for a GEMV, whose whole panels take :func:`_gemv` as ``_compute``'s do, ~1.5 µs of a 5 µs 576 × 576
    one in cache)."""
    full = n // PANEL_COLS * PANEL_COLS
    params, corr, sl, init, acc = _prologue(isa, m, n, k, mr, nr, lhs, ld, first_block_fmul)
    if m == 1 and nr % PANEL_COLS == 0:  # the whole panels on the GEMV's streams (as _compute), then their clamp
        if full > 0:
            _gemv(isa, params, lhs, corr, sl, rhs, dst, acc, full // PANEL_COLS, init)
            clamp_in_place(dst[:full])
    else:
        _tiles(isa, params, m, nr, lhs, corr, sl, rhs, dst, acc, init, (0, full), ld)
    if full < n:
        params[_LDO] = PANEL_COLS
        part = np.empty(m * PANEL_COLS + full + PANEL_COLS, np.float32)  # row i at part[i·64 + full ...]
        _tiles(isa, params, m, nr, lhs, corr, sl, rhs, part, acc, init, (full, n), 0)
        for i in range(m):
            copy_clamped(part[i * PANEL_COLS + full : i * PANEL_COLS + n], dst[i * ld + full : i * ld + n])


@numba.njit(cache=True, nogil=True)
def compute_into_host(m, n, k, mr, nr, lhs, rhs, first_block_fmul, dst, ld):  # pragma: no cover - compiled
    """:func:`compute_into` on this host's tiles (``HOST_ISA``: AVX-512 VNNI, else their portable IR)."""
    compute_into(HOST_ISA, m, n, k, mr, nr, lhs, rhs, first_block_fmul, dst, ld)


@numba.njit(cache=True, nogil=True)
def _compute_vnni512(m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    return _compute(vnni.VNNI512, m, n, k, mr, nr, lhs, rhs, first_block_fmul)


@numba.njit(cache=True, nogil=True)
def _compute_portable(m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    return _compute(vnni.PORTABLE, m, n, k, mr, nr, lhs, rhs, first_block_fmul)


_COMPUTE = {vnni.VNNI512: _compute_vnni512, vnni.PORTABLE: _compute_portable}


def check_buffers(m: int, n: int, k: int, mr: int, nr: int, lhs_u8: np.ndarray, rhs_u8: np.ndarray) -> None:
    """The packed LHS (mr rows per group) and RHS (nr columns per group) are contiguous uint8 and large enough: the
    tiles read without bounds checks."""
    for what, buf, need in (
        ("LHS", lhs_u8, -(-m // mr) * mr * k // 32 * 34),
        ("RHS", rhs_u8, -(-n // nr) * nr * k // 32 * 18),
    ):
        if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
            raise DTypeError(f"packed {what} must be a contiguous 1-D uint8 array, got {buf.dtype} {buf.shape}")
        if buf.size < need:
            raise BufferSizeError(f"packed {what} is {buf.size} bytes, m={m}, n={n}, k={k} need {need}")


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

    ``rhs_u8`` starts at the first group used. ``first_block_fmul`` selects the MOPA recipe (first block FMUL).
    Checks dtypes and sizes (the tiles read without bounds checks); releases the GIL.
    """
    lhs_u8, rhs_u8 = np.asarray(lhs_u8), np.asarray(rhs_u8)  # plain arrays (e.g. from a PackedBuffer)
    if m < 1 or n < 1 or k < 1 or k % 32:
        raise KernelShapeError(f"m={m}, n={n}, k={k}: need positive sizes and k a multiple of 32")
    if mr < 1 or nr < VEC_COLS or nr % VEC_COLS:
        raise KernelShapeError(f"mr={mr}, nr={nr}: nr must be a multiple of {VEC_COLS} (4·VL)")
    check_buffers(m, n, k, mr, nr, lhs_u8, rhs_u8)
    return _COMPUTE[isa](m, n, k, mr, nr, lhs_u8, rhs_u8, bool(first_block_fmul))
