"""AVX-512 VNNI host execution of the Q4_1 kernels: the SME2-layout ``…qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa``
and ``…qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot`` and the four NEON-layout ``…_neon_dotprod`` / ``…_neon_i8mm``:
:func:`compute_sme2` and :func:`compute_neon`, drop-ins for ``matmul_sme2`` / ``matmul_neon`` of
:mod:`kleidipy.kernels.qsi8d32p_qai4c32p.jit`, same arguments, same bits (the recipe is in
:mod:`kleidipy.kernels.qsi8d32p_qai4c32p.ukernels`). Hand-written LLVM IR because numba cannot emit
``vpdpbusd`` or keep a register tile of 16 accumulators.

Layouts read (bl = 32): the LHS group of mr rows holds per block mr·40 bytes, the int8 of row r in chunks of kbl
values (K group t of 4 values at (t // p)·kbl·mr + kbl·r + 4·(t % p), p = kbl/4), then mr f32 row sums, mr f32
recips. The RHS group of nr columns holds per block nr·24 bytes: nr·16 bytes of codes, nr f32 zeros, nr f32
scales, and after the last block nr f32 biases. SME2 (nr % 16 == 0, kbl = 4): the uint16 of the four codes of
(K group t, column c) at 2·(t·nr + c). NEON (nr = 4, chunk = kbl bytes per column run): byte j of column c at
((j // chunk)·4 + c)·chunk + j % chunk holds the codes of K = j (low nibble) and j + 16 (high), each XOR 8; the
scale is stored /16.

How: 16 columns per 512-bit vector, 4 K values per 32-bit lane. ``vpdpbusd`` multiplies unsigned codes (nibbles
spread to bytes) by the broadcast signed LHS bytes into an int32 accumulator that starts at −w·Σq of the row's
block: SME2 codes u with w = 8 give Σ q·(u − 8); NEON codes 16·u with w = 128 give Σ q·16·(u − 8), the NEON
kernels' own dot (their int8 weight is 16·(u − 8)). A NEON vector gathers 4 groups of 4 columns: one 64-byte
load per group and two rounds of shuffles give byte quad s of the 16 columns, whose low nibbles are K group s
and high nibbles K group s + 4, so the tiles take K groups in QUAD_ORDER; the LHS is read in its own chunks.
Per block the float steps run on whole vectors in the recipe's order: ``acc = fma(zero, rs, acc)``,
``acc = fma(f32(scale·rc), f32(dot), acc)`` from acc = +0 (−0 for the MOPA kernel: fma(x, y, −0) is the FMUL x·y,
signed zeros included); finally ``acc + bias``. A register tile of rows × 4 vectors (64 columns) is generated in
LLVM IR with :mod:`kleidipy.core.vnni`. With few rows the codes are spread straight from the packed RHS;
otherwise a panel of 64 columns is spread to bytes once and every row tile reads it. A lone row on the NEON layout
(the GEMV) takes 16 columns and reads their 4 groups one after the other, one memory stream
(:func:`_make_neon_gemv_tile`).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kleidipy.core import vnni, vnni_columns
from kleidipy.core.vnni import F32, F32X16, I32, I32X16, i64
from kleidipy.kernels.qsi8d32p_qai4c32p import jit as _portable
from kleidipy.kernels.qsi8d32p_qai4c32p.jit import BL, LHS_BLOCK_BYTES, RHS_BLOCK_BYTES

#: the host runs these tiles (``ukernels``' chain takes them then).
HAVE_VNNI = vnni.HAS_AVX512_VNNI

K_GROUPS = BL // 4  # K groups of 4 values per block
#: the order the tiles take a block's K groups: a NEON byte quad s gives K groups s and s + 4
QUAD_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
#: columns per group of the NEON layout
NEON_NR = 4
#: the NEON codes are 16·u, so the accumulators start at −128·Σq (SME2: codes u, −8·Σq)
NEON_WEIGHT = 128
SME2_WEIGHT = 8
VEC_COLS = 16
TILE_VECS = 4
TILE_COLS = VEC_COLS * TILE_VECS
#: rows of a register tile reading a spread panel; up to DIRECT_ROWS rows the codes are spread on the fly by tiles
#: of 2 rows, the second re-reading the panel from cache (m = 4 on the SME2 layout: ~69 -> ~60 us for 1536 x 576,
#: a 4-sequence decode step of SmolLM2 17.6 -> 13.4 ms, against the spread panel)
PANEL_ROWS = 4
DIRECT_ROWS = 4
#: the NEON sources prefetch the next tile: per block and vector this many lines, front to back over its 4 groups
#: (4·(nb·96 + 16) bytes in nb blocks)
PREFETCH_LINES = 7
#: bytes of a spread panel: per block 8 K groups × 4 vectors × 64 B of codes, then 2 × 64 f32 (zero, scale).
PANEL_BLOCK_BYTES = K_GROUPS * TILE_VECS * 64 + 2 * TILE_COLS * 4
#: bytes of a NEON group's block: 64 of codes, 4 f32 zeros, 4 f32 scales
NEON_BLOCK = NEON_NR * RHS_BLOCK_BYTES


def _neon_params(b: ir.IRBuilder, groups: list, blk: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The f32x16 zeros and scales of block blk of 4 NEON groups (lane 4g + c: column c of groups[g])."""
    at = b.add(b.mul(blk, i64(NEON_BLOCK)), i64(16 * NEON_NR))
    fields = [vnni.load(b, vnni.byte_ptr(b, base, at), ir.VectorType(F32, 2 * NEON_NR)) for base in groups]
    both = [vnni.concat(b, fields[:2]), vnni.concat(b, fields[2:])]
    lanes = [[8 * q + 4 * f + c for q in range(4) for c in range(NEON_NR)] for f in (0, 1)]  # zeros, scales
    return vnni.pick(b, both[0], both[1], lanes[0]), vnni.pick(b, both[0], both[1], lanes[1])


def _neon_bias(b: ir.IRBuilder, groups: list, nb: ir.Value) -> ir.Value:
    """The f32x16 biases of 4 NEON groups (after their nb blocks)."""
    at = b.mul(nb, i64(NEON_BLOCK))
    return vnni.concat(b, [vnni.load(b, vnni.byte_ptr(b, base, at), ir.VectorType(F32, NEON_NR)) for base in groups])


class _Tile:
    """IR of a tile of ``len(rows)`` rows × 4 vectors of 16 columns over all K blocks.

    ``geo`` = (mr, nb, nr, n) as i64 values; rows read the packed LHS (chunks of ``kbl`` values) and the −w·Σq
    terms ``corr`` (int32 laid out as the LHS row sums: [group][block][mr]); the RHS comes from a source
    (:meth:`direct`, :meth:`neon`, :meth:`panel`): ``codes(v, blk, t)`` (i32x16: the codes of vector v, K group t
    of block blk, one per byte), ``params(v, blk)`` (f32x16 zeros and scales) and ``bias(v)``.
    """

    def __init__(self, builder: ir.IRBuilder, geo: tuple, kbl: int = 4) -> None:
        vnni.require_vnni()
        self.b = builder
        self.kbl = kbl
        self.mr, self.nb, self.nr, self.n = geo
        b = builder
        self.lhs_block = b.mul(self.mr, i64(LHS_BLOCK_BYTES))
        self.rhs_block = b.mul(self.nr, i64(RHS_BLOCK_BYTES))
        self.rhs_stride = b.add(b.mul(self.rhs_block, self.nb), b.mul(self.nr, i64(4)))

    def rows(self, count: int, lhs, corr, i0, rows):
        """Per tile row (rows past ``rows`` repeat the last one): i8* to its int8, to its f32 row sum (the recip
        follows mr·4 bytes on) in the packed LHS group's first block, and to its corr terms."""
        b = self.b
        out = []
        for r in range(count):
            i = b.add(i0, b.select(b.icmp_signed("<", i64(r), rows), i64(r), b.sub(rows, i64(1))))
            g, ri = b.udiv(i, self.mr), b.urem(i, self.mr)
            group = vnni.byte_ptr(b, lhs, b.mul(g, b.mul(self.lhs_block, self.nb)))
            data = vnni.byte_ptr(b, group, b.mul(ri, i64(self.kbl)))
            fields = vnni.byte_ptr(b, group, b.add(b.mul(self.mr, i64(BL)), b.mul(ri, i64(4))))
            terms = b.mul(b.add(b.mul(b.mul(g, self.nb), self.mr), ri), i64(4))
            out.append((data, fields, vnni.byte_ptr(b, corr, terms)))
        return out

    def direct(self, rhs, j0):
        """Source reading the packed RHS: codes spread on the fly (vectors past n re-read the first one). A panel's
        blocks are one memory stream (codes, zeros, scales side by side), left to the hardware prefetcher: with a
        software prefetch 4 blocks ahead a cold GEMV ran at ~21 GB/s on this project's machine, without at ~27."""
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

        def codes(v: int, blk, t: int):
            ptr = vnni.byte_ptr(b, bases[v][0], b.add(b.mul(blk, self.rhs_block), b.mul(kgroup, i64(t))))
            return vnni.spread_nibbles(b, ptr, True)

        def params(v: int, blk):
            base = vnni.byte_ptr(b, bases[v][1], b.mul(blk, self.rhs_block))
            return (
                vnni.load(b, vnni.byte_ptr(b, base, zero_off), F32X16),
                vnni.load(b, vnni.byte_ptr(b, base, scale_off), F32X16),
            )

        def bias(v: int):
            return vnni.load(b, vnni.byte_ptr(b, bases[v][1], b.mul(self.rhs_block, self.nb)), F32X16)

        return codes, params, bias

    def neon(self, rhs, j0, chunk: int):
        """Source reading the packed NEON RHS (``chunk`` = kbl bytes per column run): vector v gathers the 4
        groups of columns j0 + 16v … (groups past n re-read the last one).

        A group's block holds 64 bytes of codes, 4 f32 zeros, 4 f32 scales (4 f32 biases follow the last block).
        Byte quad s (bytes 4s … 4s + 3) of column c is the 32-bit word 4s + c of the codes (chunk 4) or
        8·(s // 2) + 2c + s % 2 (chunk 8); its low nibbles are K group s, its high ones K group s + 4, both XOR 8.
        One 64-byte load per group and two rounds of shuffles give the 4 quads of 16 columns when codes(v, blk, 0)
        is asked for; the K groups come out as 16·u per byte. The next tile's groups are prefetched front to back
        while this one runs (per vector PREFETCH_LINES lines a block: a group stream alone is not fetched ahead
        fast enough).
        """
        b = self.b
        bases = vnni.group_bases(b, rhs, j0, self.n, self.rhs_stride, TILE_VECS, NEON_NR)
        ahead = [vnni.byte_ptr(b, row[0], b.mul(self.rhs_stride, i64(TILE_COLS // NEON_NR))) for row in bases]
        high = vnni.const_splat(I32X16, 0xF0F0F0F0)
        flip = vnni.const_splat(I32X16, 0x80808080)
        # lanes of two vectors: the 256-bit half h of each; then quad s of 4 groups from two such pairs
        halves = ([*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)])
        if chunk == 4:  # 128-bit lane s % 2 of each group's half s // 2
            quad_lanes = [[4 * (s % 2) + 8 * p + x for p in range(4) for x in range(4)] for s in range(4)]
        else:  # the half s // 2 of a group holds words 2c + e of quad s // 2·2 + e: even words, then odd
            quad_lanes = [[2 * j + s % 2 for j in range(VEC_COLS)] for s in range(4)]
        quads = {}  # v -> (blk, the 4 byte quads of the vector's 16 columns)

        def codes(v: int, blk, t: int):
            if quads.get(v, (None,))[0] is not blk:
                g = [vnni.load(b, vnni.byte_ptr(b, base, b.mul(blk, i64(NEON_BLOCK))), I32X16) for base in bases[v]]
                pairs = [[vnni.pick(b, g[i], g[i + 1], half) for half in halves] for i in (0, 2)]
                quads[v] = (blk, [vnni.pick(b, pairs[0][s // 2], pairs[1][s // 2], quad_lanes[s]) for s in range(4)])
            words = quads[v][1][t % 4]
            if t < 4:  # the low nibbles move to the high half of each byte
                words = b.shl(words, vnni.const_splat(I32X16, 4))
            return b.xor(b.and_(words, high), flip)

        def params(v: int, blk):
            lines = vnni.byte_ptr(b, ahead[v], b.mul(blk, i64(64 * PREFETCH_LINES)))
            for line in range(PREFETCH_LINES):
                vnni.prefetch(b, vnni.byte_ptr(b, lines, 64 * line))
            return _neon_params(b, bases[v], blk)

        def bias(v: int):
            return _neon_bias(b, bases[v], self.nb)

        return codes, params, bias

    def panel(self, scr):
        """Source reading a spread panel (PANEL_BLOCK_BYTES per block, then 4 × 16 f32 biases)."""
        b = self.b

        def codes(v: int, blk, t: int):
            off = b.add(b.mul(blk, i64(PANEL_BLOCK_BYTES)), i64(64 * (TILE_VECS * t + v)))
            return vnni.load(b, vnni.byte_ptr(b, scr, off), I32X16)

        def params(v: int, blk):
            base = b.add(b.mul(blk, i64(PANEL_BLOCK_BYTES)), i64(K_GROUPS * TILE_VECS * 64 + 64 * v))
            return (
                vnni.load(b, vnni.byte_ptr(b, scr, base), F32X16),
                vnni.load(b, vnni.byte_ptr(b, scr, b.add(base, i64(TILE_COLS * 4))), F32X16),
            )

        def bias(v: int):
            return vnni.load(
                b, vnni.byte_ptr(b, scr, b.add(b.mul(self.nb, i64(PANEL_BLOCK_BYTES)), i64(64 * v))), F32X16
            )

        return codes, params, bias

    def run(self, row_ptrs, source, init, out, i0, rows, j0) -> None:
        """All blocks of the tile, then out[i0 + r, j0 + 16v …] = acc + bias (rows < ``rows``, columns < n)."""
        b = self.b
        codes, params, bias = source
        facc = [[cgutils.alloca_once_value(b, vnni.splat(b, init, F32X16)) for _ in range(TILE_VECS)] for _ in row_ptrs]
        iacc = [[cgutils.alloca_once(b, I32X16) for _ in range(TILE_VECS)] for _ in row_ptrs]
        kgroup = b.mul(self.mr, i64(4))
        per = self.kbl // 4  # K groups per chunk of a row
        at = {t: b.add(b.mul(self.mr, i64(self.kbl * (t // per))), i64(4 * (t % per))) for t in QUAD_ORDER}
        with cgutils.for_range(b, self.nb) as loop:
            blk = loop.index
            lrow, frow = [], []
            for r, (data, fields, corr) in enumerate(row_ptrs):
                c = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, corr, b.mul(blk, kgroup)), I32), I32X16)
                for v in range(TILE_VECS):
                    b.store(c, iacc[r][v])
                lrow.append(vnni.byte_ptr(b, data, b.mul(blk, self.lhs_block)))
                frow.append(vnni.byte_ptr(b, fields, b.mul(blk, self.lhs_block)))
            for t in QUAD_ORDER:
                vec = [codes(v, blk, t) for v in range(TILE_VECS)]
                for r, ptr in enumerate(lrow):
                    q = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, at[t]), I32), I32X16)
                    for v in range(TILE_VECS):
                        b.store(vnni.dpbusd(b, b.load(iacc[r][v]), vec[v], q, True), iacc[r][v])
            zs = [params(v, blk) for v in range(TILE_VECS)]
            for r, ptr in enumerate(frow):
                rs = vnni.splat(b, vnni.load(b, ptr, F32), F32X16)
                rc = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, kgroup), F32), F32X16)
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


def _source(t: _Tile, rhs, j0, neon_chunk: int):
    """The source reading the packed RHS: the NEON layout with ``neon_chunk`` bytes per column run, else SME2."""
    return t.neon(rhs, j0, neon_chunk) if neon_chunk else t.direct(rhs, j0)


def _make_tile(rows_max: int, direct: bool, neon_chunk: int = 0, lhs_kbl: int = 4):
    """Intrinsic ``tile(geo, lhs, corr, src, out, i0, rows, j0, init)``: src is the packed RHS (``direct``; the
    NEON layout when ``neon_chunk``, see :func:`_source`) or a spread panel; the LHS has chunks of ``lhs_kbl``."""

    @intrinsic
    def tile(typingctx, geo, lhs, corr, src, out, i0, rows, j0, init):
        sig = types.void(geo, lhs, corr, src, out, types.int64, types.int64, types.int64, types.float32)

        def codegen(context, builder, signature, args):
            geo_v, lhs_p, corr_p, src_p, out_p, i0_v, rows_v, j0_v, init_v = vnni.intrinsic_args(
                context, builder, signature, args
            )
            t = _Tile(builder, geo_v, lhs_kbl)
            source = _source(t, src_p, j0_v, neon_chunk) if direct else t.panel(src_p)
            t.run(t.rows(rows_max, lhs_p, corr_p, i0_v, rows_v), source, init_v, out_p, i0_v, rows_v, j0_v)
            return context.get_dummy_value()

        return sig, codegen

    return tile


#: one or two rows on the packed SME2 RHS, two on the NEON chunk-4 / chunk-8 one (LHS chunks alike); 4 rows on a
#: spread panel, LHS chunks of 4 or 8
_direct_tile_1 = _make_tile(1, True)
_direct_tile_2 = _make_tile(2, True)
_neon4_tile_2, _neon8_tile_2 = _make_tile(2, True, 4), _make_tile(2, True, 8, 8)
_panel_tile = _make_tile(PANEL_ROWS, False)
_panel_tile_8 = _make_tile(PANEL_ROWS, False, lhs_kbl=8)


@numba.njit(cache=True, nogil=True)
def _lane_quad(lane: int, chunk: int) -> int:
    """The byte quad s (K groups s and s + 4) that lane ``lane`` of a 64-byte load of a NEON group's block holds."""
    return lane // 4 if chunk == 4 else 2 * (lane // 8) + lane % 2


def _make_neon_gemv_tile(chunk: int):
    """Intrinsic ``tile(geo, lhs, corr, qvec, scr, rhs, out, j0, init)``: a lone row × the 16 columns from j0 of
    the NEON layout (``chunk`` = the LHS kbl). It reads the 4 RHS groups one after the other — one memory stream,
    which the hardware prefetcher follows (the 64-column tile's 16 group streams ran at half the SME2 layout's
    bandwidth from memory). Per group and block, the codes' low and high nibbles times the row's LHS vectors
    (qvec, :func:`gemv_lhs`) give one int32 vector; the first 3 groups' are kept in scr, and the last group's
    pass adds its own, sums the 4 per column (``vnni_columns.sum_columns``: the layout puts column c of a load in
    the lanes a Q8_0 NEON load of kr = chunk does), adds corr and does the float steps of :meth:`_Tile.run` in
    the recipe's order (memory keeps streaming while they run; a separate pass after the groups was slower)."""

    @intrinsic
    def tile(typingctx, geo, lhs, corr, qvec, scr, rhs, out, j0, init):
        sig = types.void(geo, lhs, corr, qvec, scr, rhs, out, types.int64, types.float32)

        def codegen(context, builder, signature, args):
            geo_v, lhs_p, corr_p, q_p, scr_p, rhs_p, out_p, j0_v, init_v = vnni.intrinsic_args(
                context, builder, signature, args
            )
            b = builder
            t = _Tile(b, geo_v, chunk)
            ((_, fields, terms),) = t.rows(1, lhs_p, corr_p, i64(0), i64(1))
            (groups,) = vnni.group_bases(b, rhs_p, j0_v, t.n, t.rhs_stride, 1, NEON_NR)
            high, flip = vnni.const_splat(I32X16, 0xF0F0F0F0), vnni.const_splat(I32X16, 0x80808080)

            def dot(base, blk):
                words = vnni.load(b, vnni.byte_ptr(b, base, b.mul(blk, i64(NEON_BLOCK))), I32X16)
                q = vnni.byte_ptr(b, q_p, b.mul(blk, i64(128)))
                low = b.xor(b.and_(b.shl(words, vnni.const_splat(I32X16, 4)), high), flip)
                acc = vnni.dpbusd(b, vnni.const_splat(I32X16, 0), low, vnni.load(b, q, I32X16), True)
                hi_q = vnni.load(b, vnni.byte_ptr(b, q, 64), I32X16)
                return vnni.dpbusd(b, acc, b.xor(b.and_(words, high), flip), hi_q, True)

            def kept(blk, g):
                return vnni.byte_ptr(b, scr_p, b.mul(b.add(b.mul(blk, i64(NEON_NR - 1)), i64(g)), i64(64)))

            for g, base in enumerate(groups[:-1]):
                with cgutils.for_range(b, t.nb) as loop:
                    vnni.store(b, dot(base, loop.index), kept(loop.index, g))
            facc = cgutils.alloca_once_value(b, vnni.splat(b, init_v, F32X16))
            kgroup = b.mul(t.mr, i64(4))
            with cgutils.for_range(b, t.nb) as loop:
                blk = loop.index
                accs = [vnni.load(b, kept(blk, g), I32X16) for g in range(NEON_NR - 1)]
                total = vnni_columns.sum_columns(b, [*accs, dot(groups[-1], blk)], chunk)
                c = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, terms, b.mul(blk, kgroup)), I32), I32X16)
                ptr = vnni.byte_ptr(b, fields, b.mul(blk, t.lhs_block))
                rs = vnni.splat(b, vnni.load(b, ptr, F32), F32X16)
                rc = vnni.splat(b, vnni.load(b, vnni.byte_ptr(b, ptr, kgroup), F32), F32X16)
                zero, scale = _neon_params(b, groups, blk)
                acc = vnni.fma(b, zero, rs, b.load(facc))
                b.store(vnni.fma(b, b.fmul(scale, rc), b.sitofp(b.add(total, c), F32X16), acc), facc)
            res = b.fadd(b.load(facc), _neon_bias(b, groups, t.nb))
            with b.if_then(b.icmp_signed("<", j0_v, t.n)):
                vnni.masked_store(b, res, vnni.byte_ptr(b, out_p, b.mul(j0_v, i64(4))), b.sub(t.n, j0_v))
            return context.get_dummy_value()

        return sig, codegen

    return tile


_neon4_gemv, _neon8_gemv = _make_neon_gemv_tile(4), _make_neon_gemv_tile(8)


@numba.njit(cache=True, nogil=True)
def gemv_lhs(k, mr, kbl, lhs):
    """Row 0's LHS vectors as the one-row NEON tile reads them: per block two of 16 int32 lanes, lane L of the
    second h holding the 4 int8 of K group _lane_quad(L, kbl) + 4h (the LHS group's chunks of kbl values)."""
    words = lhs.view(np.int32)
    per = kbl // 4
    qvec = np.empty(k // BL * 2 * VEC_COLS, np.int32)
    for blk in range(k // BL):
        for h in range(2):
            for lane in range(VEC_COLS):
                kg = _lane_quad(lane, kbl) + 4 * h
                at = blk * mr * LHS_BLOCK_BYTES + (kg // per) * kbl * mr + 4 * (kg % per)
                qvec[(2 * blk + h) * VEC_COLS + lane] = words[at // 4]
    return qvec


def _make_spread_panel(neon_chunk: int):
    """Intrinsic ``spread(geo, rhs, j0, scr)``: spread the codes of the 64 columns from j0 to bytes and copy their
    zeros, scales and biases into scr (the packed RHS as :func:`_source` reads it)."""

    @intrinsic
    def spread(typingctx, geo, rhs, j0, scr):
        sig = types.void(geo, rhs, types.int64, scr)

        def codegen(context, builder, signature, args):
            geo_v, rhs_p, j0_v, scr_p = vnni.intrinsic_args(context, builder, signature, args)
            t = _Tile(builder, geo_v)
            _spread(builder, t, _source(t, rhs_p, j0_v, neon_chunk), scr_p)
            return context.get_dummy_value()

        return sig, codegen

    return spread


def _spread(b: ir.IRBuilder, t: _Tile, source: tuple, scr_p: ir.Value) -> None:
    """IR of a spread panel (PANEL_BLOCK_BYTES per block, then 4 × 16 f32 biases) from a source."""
    codes, params, bias = source
    with cgutils.for_range(b, t.nb) as loop:
        base = vnni.byte_ptr(b, scr_p, b.mul(loop.index, i64(PANEL_BLOCK_BYTES)))
        for v in range(TILE_VECS):
            for k in QUAD_ORDER:
                vnni.store(b, codes(v, loop.index, k), vnni.byte_ptr(b, base, 64 * (TILE_VECS * k + v)))
            zero, scale = params(v, loop.index)
            vnni.store(b, zero, vnni.byte_ptr(b, base, K_GROUPS * TILE_VECS * 64 + 64 * v))
            vnni.store(b, scale, vnni.byte_ptr(b, base, K_GROUPS * TILE_VECS * 64 + TILE_COLS * 4 + 64 * v))
    end = vnni.byte_ptr(b, scr_p, b.mul(t.nb, i64(PANEL_BLOCK_BYTES)))
    for v in range(TILE_VECS):
        vnni.store(b, bias(v), vnni.byte_ptr(b, end, 64 * v))


_spread_panel = _make_spread_panel(0)
_spread_panel_neon4 = _make_spread_panel(4)
_spread_panel_neon8 = _make_spread_panel(8)


@numba.njit(cache=True, nogil=True)
def _lhs_terms(m, k, mr, kbl, lhs, weight):
    """−weight·Σq per row and block of a packed LHS with chunks of kbl = 4 or 8, laid out [group][block][mr]: for
    kbl = 8 the 4-byte halves (e) of row r's chunks are summed as rows 2r + e of 4 K groups, then added."""
    nb = k // BL
    block_bytes = mr * LHS_BLOCK_BYTES
    if kbl == 4:
        return vnni.neg_block_sums(
            vnni.VNNI512, lhs, m, mr, nb * block_bytes, nb, block_bytes, np.int64(K_GROUPS), weight
        )
    halves = vnni.neg_block_sums(
        vnni.VNNI512, lhs, 2 * m, 2 * mr, nb * block_bytes, nb, block_bytes, np.int64(4), weight
    )
    return halves[0::2] + halves[1::2]


@numba.njit(cache=True, nogil=True)
def _matmul(m, n, k, mr, nr, kbl, lhs, rhs, neon, first_block_fmul):
    """Every Q4_1 kernel: the NEON layout (nr = 4, RHS chunk = LHS kbl = 4 or 8) when ``neon``, else SME2
    (kbl = 4)."""
    nb = k // BL
    geo = (np.int64(mr), np.int64(nb), np.int64(nr), np.int64(n))
    corr = _lhs_terms(m, k, mr, kbl, lhs, NEON_WEIGHT if neon else SME2_WEIGHT)
    out = np.empty((m, n), np.float32)
    init = np.float32(-0.0) if first_block_fmul else np.float32(0.0)
    if m == 1 and neon:
        qvec, scr = gemv_lhs(k, mr, kbl, lhs), np.empty(nb * (NEON_NR - 1) * VEC_COLS, np.int32)
        for j0 in range(0, n, VEC_COLS):
            if kbl == 4:
                _neon4_gemv(geo, lhs, corr, qvec, scr, rhs, out, j0, init)
            else:
                _neon8_gemv(geo, lhs, corr, qvec, scr, rhs, out, j0, init)
        return out
    if m <= DIRECT_ROWS:
        for j0 in range(0, n, TILE_COLS):
            for i0 in range(0, m, 2):
                rows = min(2, m - i0)
                if not neon:
                    if m == 1:
                        _direct_tile_1(geo, lhs, corr, rhs, out, 0, m, j0, init)
                    else:
                        _direct_tile_2(geo, lhs, corr, rhs, out, i0, rows, j0, init)
                elif kbl == 4:
                    _neon4_tile_2(geo, lhs, corr, rhs, out, i0, rows, j0, init)
                else:
                    _neon8_tile_2(geo, lhs, corr, rhs, out, i0, rows, j0, init)
        return out
    scr = np.empty(nb * PANEL_BLOCK_BYTES + TILE_COLS * 4, np.uint8)
    for j0 in range(0, n, TILE_COLS):
        if not neon:
            _spread_panel(geo, rhs, j0, scr)
        elif kbl == 4:
            _spread_panel_neon4(geo, rhs, j0, scr)
        else:
            _spread_panel_neon8(geo, rhs, j0, scr)
        for i0 in range(0, m, PANEL_ROWS):
            if kbl == 4:
                _panel_tile(geo, lhs, corr, scr, out, i0, min(PANEL_ROWS, m - i0), j0, init)
            else:
                _panel_tile_8(geo, lhs, corr, scr, out, i0, min(PANEL_ROWS, m - i0), j0, init)
    return out


@numba.njit(cache=True, nogil=True)
def compute_sme2(m, n, k, mr, nr, lhs, rhs, first_block_fmul):
    """The SME2 kernels: ``jit.matmul_sme2``'s signature and bits. Needs AVX-512 VNNI."""
    return _matmul(m, n, k, mr, nr, _portable.SME_LHS_KBL, lhs, rhs, False, first_block_fmul)


@numba.njit(cache=True, nogil=True)
def compute_neon(m, n, k, mr, nr, kbl, lhs, rhs):
    """The four NEON kernels: ``jit.matmul_neon``'s signature and bits. Needs AVX-512 VNNI."""
    return _matmul(m, n, k, mr, nr, kbl, lhs, rhs, True, False)
