"""The Q4_0 NEON kernels (dotprod / i8mm: LHS ``lhs_quant_pack_qsi8d32p_f32``, RHS ``qsi4c32pscalef16`` with
nr = 4, kr 8 or 16) on the family's AVX-512 VNNI tiles (:mod:`~kleidipy.kernels.qsi8d32p_qsi4c32p.vnni`), reading the
packed bytes they read, with their arithmetic (§5.2 from +0: the bits of ``jit.matmul_qsi8d32p_qsi4c32pscalef16``).

How: the small packed LHS is moved into the §4.4 layout the tiles read (K quads of each block in QUAD_ORDER);
each 16-column vector gathers four 4-column groups. The GEMV reads the packed RHS directly: whole blocks of the
four groups, transposed by 128-bit lanes, one vector through all blocks after the other, with a linear prefetch
of the vector two on. More rows read a 64-column panel decoded once into a scratch buffer (``source_spread``), so
every row tile takes a K group with one load. Hand-written LLVM IR for the reason the SME2 tiles are.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir

from kleidipy.core import vnni
from kleidipy.core.vnni import HOST_ISA, I16, I32X16, i64
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.qsi8d32p_qsi4c32p.vnni import (
    NO_PREFETCH,
    PANEL_COLS,
    PANEL_VECS,
    SPREAD_BLOCK,
    TILE_ROWS,
    VEC_COLS,
    Tile,
    check_buffers,
    lhs_terms,
    make_decoder,
    make_tile,
    source_spread,
)

#: columns per group of the NEON RHS layout
NEON_NR = 4
#: the GEMV prefetches its RHS this many groups ahead (two vectors: each runs through all blocks in turn)
PREFETCH_NEON_GROUPS = 8
#: K quads (4 values) of a 32-block in the order the NEON tiles take them (low nibbles of quad s, then high)
QUAD_ORDER = np.array([0, 4, 1, 5, 2, 6, 3, 7], np.int64)
#: (group, column) of the 16 lanes of a NEON vector
QC = [(q, c) for q in range(4) for c in range(NEON_NR)]


def source_neon(tile: Tile, rhs, j0, inner: int, prefetch: bool):
    """The packed RHS of the panel in the NEON layout (``qsi4c32pscalef16``, nr = 4, ``inner`` = kr/2 bytes
    per column run): each vector gathers 4 groups of 4 columns (groups past n re-read the last one).

    A group's block is 4 fp16 d then 64 bytes whose 32-bit words each hold 4 bytes of one column c; byte t
    of a word holds the signed (XOR 8) codes of K = 4·quad + t (low nibble) and 4·(quad + 4) + t (high),
    in word 4·quad + c (``inner`` 4) or 8·(quad // 2) + 2c + quad % 2 (``inner`` 8). The four groups'
    blocks are loaded whole and transposed by 128-bit lanes (then, for ``inner`` 8, words paired within
    lanes), so that every K group of the block comes out at once (per = 8), in QUAD_ORDER. With ``prefetch``
    (the GEMV, whose vectors run through all blocks one after the other) each block also prefetches its share
    of the vector two on, in address order.
    """
    b = tile.builder
    bases = vnni.group_bases(b, rhs, j0, tile.n, tile.rstride, PANEL_VECS, NEON_NR)
    block = NEON_NR * 18
    quads = {}
    mask = vnni.const_splat(I32X16, 0x0F0F0F0F)
    flip = vnni.const_splat(I32X16, 0x08080808)

    def lanes(x, y, pairs):
        """128-bit lanes (source, lane) of x ‖ y, four of them."""
        return vnni.pick(b, x, y, [16 * s + 4 * lane + w for s, lane in pairs for w in range(4)])

    def codes(v: int, blk, step, i: int):
        if i == 0:
            at = b.add(b.mul(blk, i64(block)), i64(2 * NEON_NR))
            a, c, e, g = (vnni.load(b, vnni.byte_ptr(b, base, at), I32X16) for base in bases[v])
            t0, t1 = lanes(a, c, [(0, 0), (0, 2), (1, 0), (1, 2)]), lanes(a, c, [(0, 1), (0, 3), (1, 1), (1, 3)])
            t2, t3 = lanes(e, g, [(0, 0), (0, 2), (1, 0), (1, 2)]), lanes(e, g, [(0, 1), (0, 3), (1, 1), (1, 3)])
            pick_even, pick_odd = [(0, 0), (0, 2), (1, 0), (1, 2)], [(0, 1), (0, 3), (1, 1), (1, 3)]
            # out[L] = lane L of each group: [A_L, B_L, C_L, D_L]
            out = [lanes(t0, t2, pick_even), lanes(t1, t3, pick_even), lanes(t0, t2, pick_odd)]
            out.append(lanes(t1, t3, pick_odd))
            if inner == 4:  # lane L of a group is quad L
                quads[v] = out
            else:  # quad 2h + s of column c sits in out[2h + c // 2] at word 2(c % 2) + s of its group's lane
                quads[v] = [
                    vnni.pick(b, out[2 * h], out[2 * h + 1], [16 * (c // 2) + 4 * q + 2 * (c % 2) + s for q, c in QC])
                    for h in (0, 1)
                    for s in (0, 1)
                ]
        words = quads[v][i // 2]
        if i % 2:
            words = b.lshr(words, vnni.const_splat(I32X16, 4))
        return b.xor(b.and_(words, mask), flip)

    def scales(v: int, blk):
        at = b.mul(blk, i64(block))
        parts = [vnni.load(b, vnni.byte_ptr(b, base, at), ir.VectorType(I16, NEON_NR)) for base in bases[v]]
        if prefetch:  # the bytes of the vector PREFETCH_NEON_GROUPS groups on, in address order: this block's share
            span = block * (VEC_COLS // NEON_NR)
            start = b.add(b.mul(tile.rstride, i64(PREFETCH_NEON_GROUPS)), b.mul(blk, i64(span)))
            for j in range(0, span + 63, 64):
                vnni.prefetch(b, vnni.byte_ptr(b, bases[v][0], b.add(start, i64(min(j, span - 1)))))
        return vnni.f16_bits_to_f32(b, vnni.concat(b, parts), tile.native)

    return codes, scales, 8


#: the GEMV (kr 8: 4 bytes per column run; kr 16: 8), one row straight from the packed RHS
_NEON_1_4 = make_tile(1, lambda t, rhs, j0: source_neon(t, rhs, j0, 4, True))
_NEON_1_8 = make_tile(1, lambda t, rhs, j0: source_neon(t, rhs, j0, 8, True))
#: more rows: 4 (tail rows repeat the last) from a decoded panel
_SPREAD_4 = make_tile(TILE_ROWS, lambda t, rhs, j0: source_spread(t, rhs))


#: the panel decoders (kr 8, kr 16) of the tiles of more rows
_DECODE_4, _DECODE_8 = (
    make_decoder(lambda t, rhs, j0, inner=inner: source_neon(t, rhs, j0, inner, False)) for inner in (4, 8)
)


@numba.njit(cache=True, nogil=True)
def _lhs_from_neon(m, k, mr, kbl, lhs):
    """The §4.4 layout (K quads of each block in QUAD_ORDER) of an LHS packed by ``lhs_quant_pack_qsi8d32p_f32``
    (per block mr fp16 scales, then the int8 in chunks of kbl values per row): the same values, moved."""
    nb = k // 32
    stride = mr * nb * 34
    groups = (m + mr - 1) // mr
    out = np.empty(groups * stride, np.uint8)
    for g in range(groups):
        base = g * stride
        for b in range(nb):
            src = base + b * mr * 34
            for r in range(mr):
                dst = base + mr * nb * 32 + 2 * (b * mr + r)
                out[dst] = lhs[src + 2 * r]
                out[dst + 1] = lhs[src + 2 * r + 1]
                for t in range(8):
                    k4 = 4 * QUAD_ORDER[t]
                    at = src + 2 * mr + (k4 // kbl) * mr * kbl + r * kbl + k4 % kbl
                    dst = base + (b * 8 + t) * 4 * mr + 4 * r
                    for e in range(4):
                        out[dst + e] = lhs[at + e]
    return out


@numba.njit(cache=True, nogil=True)
def _compute_neon(isa, m, n, k, mr, nr, kr, kbl, lhs, rhs):
    """Unclamped float32 [m, n] of a NEON-packed LHS (``lhs_quant_pack_qsi8d32p_f32``, chunks of kbl) × the
    NEON RHS (``qsi4c32pscalef16``, nr = 4, kr 8 or 16): the NEON kernels' bits (recipe §5.2 from +0)."""
    nb = k // 32
    ldo = (n + PANEL_COLS - 1) // PANEL_COLS * PANEL_COLS
    params = np.array([mr * nb * 34, mr, nb, nr * nb * 18, nr, n, ldo, NO_PREFETCH], np.int64)  # PARAMS
    out = np.empty((m, ldo), np.float32)
    flat = out.reshape(-1)
    moved = _lhs_from_neon(m, k, mr, kbl, lhs)
    corr, sl = lhs_terms(isa, m, k, mr, moved)
    init = np.float32(0.0)
    acc = np.empty(TILE_ROWS * PANEL_COLS, np.float32)
    panel = np.empty(nb * SPREAD_BLOCK if m > 1 else 0, np.uint8)
    for j0 in range(0, n, PANEL_COLS):
        if m == 1:
            if kr == 8:
                _NEON_1_4(isa, params, moved, corr, sl, rhs, flat, acc, 0, 1, j0, init)
            else:
                _NEON_1_8(isa, params, moved, corr, sl, rhs, flat, acc, 0, 1, j0, init)
            continue
        if kr == 8:  # decoded once, read by every row tile
            _DECODE_4(isa, params, rhs, j0, panel)
        else:
            _DECODE_8(isa, params, rhs, j0, panel)
        for i0 in range(0, m, TILE_ROWS):
            _SPREAD_4(isa, params, moved, corr, sl, panel, flat, acc, i0, min(TILE_ROWS, m - i0), j0, init)
    if ldo != n:
        return np.ascontiguousarray(out[:, :n])
    return out


@numba.njit(cache=True, nogil=True)
def compute_neon_vnni512(m, n, k, mr, nr, kr, sr, lhs, rhs):
    """The NEON kernels on the VNNI tiles: ``jit.matmul_qsi8d32p_qsi4c32pscalef16``'s signature and bits (the
    family's NEON chain on a host with AVX-512 VNNI)."""
    return _compute_neon(vnni.VNNI512, m, n, k, mr, nr, kr, kr // sr, lhs, rhs)


@numba.njit(cache=True, nogil=True)
def _compute_neon_portable(m, n, k, mr, nr, kr, sr, lhs, rhs):
    return _compute_neon(vnni.PORTABLE, m, n, k, mr, nr, kr, kr // sr, lhs, rhs)


_COMPUTE_NEON = {vnni.VNNI512: compute_neon_vnni512, vnni.PORTABLE: _compute_neon_portable}


def compute_neon(
    m: int,
    n: int,
    k: int,
    mr: int,
    nr: int,
    kr: int,
    sr: int,
    lhs_u8: np.ndarray,
    rhs_u8: np.ndarray,
    isa: vnni.Isa = HOST_ISA,
) -> np.ndarray:
    """Unclamped float32 [m, n] of the NEON kernels (dotprod / i8mm): the LHS packed by
    ``lhs_quant_pack_qsi8d32p_f32`` (mr rows per group, chunks of kr/sr values) × the RHS packed by
    ``rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0`` (nr = 4, kr 8 or 16) — the bits of
    ``jit.matmul_qsi8d32p_qsi4c32pscalef16``. Checks shapes, dtypes and sizes; releases the GIL."""
    lhs_u8, rhs_u8 = np.asarray(lhs_u8), np.asarray(rhs_u8)
    if m < 1 or n < 1 or k < 1 or k % 32:
        raise KernelShapeError(f"m={m}, n={n}, k={k}: need positive sizes and k a multiple of 32")
    if nr != NEON_NR or kr not in (8, 16) or sr < 1 or (kr // sr) % 4 or 32 % (kr // sr):
        raise KernelShapeError(f"nr={nr}, kr={kr}, sr={sr}: not a NEON layout of this family")
    check_buffers(m, n, k, mr, nr, lhs_u8, rhs_u8)
    return _COMPUTE_NEON[isa](m, n, k, mr, nr, kr, sr, lhs_u8, rhs_u8)
