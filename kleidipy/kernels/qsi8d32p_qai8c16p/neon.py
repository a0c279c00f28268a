"""The exact-weight family's kernels (LHS ``lhs_quant_pack_qsi8d32pscalef32_f32_neon`` with kr 4, sr 1; RHS
``rhs_pack_nxk_qai8c16p_qai8c16_f32_f32_f32_neon``, nr 16) as native aarch64 tiles with ``sdot`` (DotProd), the
instructions of the family's emulator programs (:mod:`~kleidipy.kernels.qsi8d32p_qai8c16p.isa`) and the
recipe of :mod:`~kleidipy.kernels.qsi8d32p_qai8c16p.ukernels` (the bits of ``jit.matmul``). kleidipy's own: KleidiAI
has no kernel to compare with.

How: per group of mr rows (1 or 4) and group of 16 columns, 16-block after 16-block, the block's LHS quads (the
GEMM's 16 bytes of quad u: 4 rows × 4 values; the GEMV's 16 bytes: its row's 4 quads); per vector of 4 columns,
``sdot`` by element of each quad's 16 code bytes with the row's quad, converted ``scvtf`` (exact), then acc =
fma(scale·rc, a, acc) (``fmul`` by element, ``fmla``); when one of the block's 16 offsets is not ±0 (``orr``,
``bic`` of the sign bits), Σq per row by ``sdot`` against a vector of ones and acc = fma(offset·rc, Σq, acc) (a ±0
offset's step would leave acc unchanged: the symmetric types skip them all); at the end the bias is added
(``fadd``), unclamped.

:func:`tile_module` builds a tile's LLVM module for a :class:`~kleidipy.core.native.NativeIsa` (``kleidipy kernels
--asm`` cross-compiles it on any host, through :func:`kernel_tile`); on an aarch64 host with DotProd the two tiles
are compiled at import and :func:`compute` (``ukernels.COMPUTE`` there) runs them. Hand-written LLVM IR for the
reason of :mod:`kleidipy.core.native`: numba's code never uses these instructions.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils

from kleidipy.core import native, neon_ir
from kleidipy.core.neon_ir import F32, I32, I64, SDOT, V4F32, V4I32, V16I8
from kleidipy.kernels.qsi8d32p_qai8c16p import jit as _jit

BL = _jit.BL
#: columns of a group of the RHS layout (and of a tile): four vectors of 4
NR = 16
#: bytes of one 16-block of a packed RHS group: 16 columns × 16 int8 codes, 16 f32 offsets, 16 f32 scales
RHS_BLOCK = NR * _jit.RHS_BLOCK_BYTES
#: bytes of one row of one 32-block of a packed LHS group: 32 int8 (then, per group, mr f32 row sums and mr recips)
LHS_BLOCK = 40
#: the (mr, kr) of the family's kernels: a tile each
SHAPES = ((1, 4), (4, 4))
#: the bits of an f32 but its sign: an offset is ±0 when they are all 0
MAGNITUDE = 0x7FFFFFFF


def symbol(mr: int, kr: int) -> str:
    """The LLVM name of the tile for mr rows per LHS group and kr."""
    return f"kleidipy_qai8c16p_neon_mr{mr}_kr{kr}"


def tile_module(mr: int, kr: int, isa: native.NativeIsa) -> ir.Module:
    """The LLVM module of the tile ``void symbol(mr, kr)(i64 m, i64 n, i64 nb, i8* lhs, i8* rhs, float* out)``:
    out [m, n] (rows of n floats) = the packed LHS (m rows, groups of mr) × the packed RHS (n columns, groups of 16),
    nb blocks of 16 values each, plus the bias, unclamped."""
    module, b, (m, n, nb, lhs, rhs, out) = neon_ir.tile_function(symbol(mr, kr), isa)
    quads = BL // kr
    lstride = b.mul(b.udiv(nb, I64(2)), I64(mr * LHS_BLOCK))
    rstride = b.add(b.mul(nb, I64(RHS_BLOCK)), I64(4 * NR))
    accs = [cgutils.alloca_once(b, V4F32) for _ in range(mr * NR // 4)]  # row r, vector v: accs[4r + v]
    ones, zero = neon_ir.vec(V16I8, [1] * 16), ir.Constant(V4I32, None)
    fields = ir.VectorType(F32, mr)
    with neon_ir.group_pairs(b, m, n, mr, lhs, rhs, (lstride, rstride), accs, NR) as (gi, gj, lhs0, rhs0):
        with cgutils.for_range(b, nb, intp=I64) as blk:
            rb = b.gep(rhs0, [b.mul(blk.index, I64(RHS_BLOCK))])
            lb = b.gep(lhs0, [b.mul(b.lshr(blk.index, I64(1)), I64(mr * LHS_BLOCK))])
            lq = b.gep(lb, [b.mul(b.and_(blk.index, I64(1)), I64(BL * mr))])
            data = [neon_ir.load(b, lq, 16 * u, V16I8) for u in range(mr * quads // 4)]

            def quad(u: int, r: int) -> ir.Value:  # row r's quad u in every lane
                return b.bitcast(neon_ir.lane(b, *((data[u], V4I32, r) if mr == 4 else (data[0], V4I32, u))), V16I8)

            recip = neon_ir.load(b, lb, (2 * BL + 4) * mr, fields)
            undef = ir.Constant(fields, ir.Undefined)
            rcs = [b.shuffle_vector(recip, undef, neon_ir.vec(V4I32, [r] * 4)) for r in range(mr)]
            for v in range(NR // 4):
                codes = [neon_ir.load(b, rb, 4 * NR * u + 16 * v, V16I8) for u in range(quads)]
                scale = neon_ir.load(b, rb, (BL + 4) * NR + 16 * v, V4F32)
                for r in range(mr):
                    dot = zero
                    for u in range(quads):
                        dot = neon_ir.call(b, SDOT, V4I32, [dot, codes[u], quad(u, r)])
                    acc = b.load(accs[NR // 4 * r + v])
                    acc = neon_ir.call(b, "llvm.fma.v4f32", V4F32, [b.fmul(scale, rcs[r]), b.sitofp(dot, V4F32), acc])
                    b.store(acc, accs[NR // 4 * r + v])
            offsets = [neon_ir.load(b, rb, BL * NR + 16 * v, V4F32) for v in range(NR // 4)]
            bits = functools.reduce(b.or_, [b.bitcast(o, V4I32) for o in offsets])
            bits = b.and_(bits, neon_ir.vec(V4I32, [MAGNITUDE] * 4))
            any_bits = neon_ir.call(b, "llvm.vector.reduce.or.v4i32", I32, [bits])
            with b.if_then(b.icmp_unsigned("!=", any_bits, I32(0))):  # some offset not ±0: the offset steps
                qsum = zero
                for u in range(quads):  # GEMM: lane r = row r's Σq; GEMV: every lane = the row's Σq
                    pair = [data[u], ones] if mr == 4 else [ones, quad(u, 0)]
                    qsum = neon_ir.call(b, SDOT, V4I32, [qsum, *pair])
                qsum = b.sitofp(qsum, V4F32)
                for v, offset in enumerate(offsets):
                    for r in range(mr):
                        acc = b.load(accs[NR // 4 * r + v])
                        step = [b.fmul(offset, rcs[r]), neon_ir.lane(b, qsum, V4F32, r), acc]
                        b.store(neon_ir.call(b, "llvm.fma.v4f32", V4F32, step), accs[NR // 4 * r + v])
        biases = b.mul(nb, I64(RHS_BLOCK))
        rows = [b.add(b.mul(gi, I64(mr)), I64(r)) for r in range(mr)]
        for v in range(NR // 4):
            bias = neon_ir.load(b, rhs0, b.add(biases, I64(16 * v)), V4F32)
            col0 = b.add(b.mul(gj, I64(NR)), I64(4 * v))
            for r, row in enumerate(rows):
                neon_ir.store_row(b, out, m, n, row, col0, b.fadd(b.load(accs[NR // 4 * r + v]), bias))
    b.ret_void()
    return module


#: ``kernel_tile`` (the tile module of one of the family's kernels for an aarch64 ISA, None on x86); the native ISA
#: of this host's tiles (None: no DotProd, or not aarch64 — :func:`compute` is not available); the tiles' caller
kernel_tile, HOST_ISA, _TILES = neon_ir.neon_tiles(tile_module, symbol, SHAPES, lambda kernel: (kernel.mr, kernel.kr))
AVAILABLE = HOST_ISA is not None


@numba.njit(cache=True, nogil=True)
def compute(m, n, k, mr, nr, kbl, lhs, rhs):  # pragma: no cover - compiled (aarch64 with DotProd)
    """Both kernels on the native tiles (``ukernels.COMPUTE``'s signature, as :func:`.vnni.compute`, and
    ``jit.matmul``'s bits): float32 [m, n], unclamped (mr 1 or 4, nr 16, kbl = kr = 4)."""
    out = np.empty((m, n), np.float32)
    _TILES((mr, kbl), (m, n, k // BL), lhs, rhs, out)
    return out
