"""The ``qai8dxp × qsi8cxp`` family (llama.cpp's Q8_0 route) and the parts both ``qai8dxp`` families share.

Owns:

* the LHS packer ``lhs_quant_pack_qai8dxp_f32``: per-row asymmetric int8 (zero point + f32 ``1/scale``);
* :class:`PerChannelRhsPacker`, the per-channel RHS packers' common part (a group of nr columns is their
  data, then nr int32 row sums, nr f32 scales, nr f32 biases), and its int8 member
  ``rhs_pack_nxk_qsi8cxp_qsi8cx_neon``;
* :func:`requantize_q8_0_per_channel`: how llama.cpp turns GGML Q8_0 blocks into per-channel int8 + scale;
* :class:`Qai8dxpMatmulKernel`, the matmul kernel of both qai8dxp families (integer dot, zero-point
  correction, per-kernel float epilogue :class:`Recipe`), and the eight Q8_0 kernels.

The per-channel int4 family (``qai8dxp_qsi4cxp``) reuses the LHS packer, the RHS base and the kernel class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from typing import ClassVar

import numba
import numpy as np

from kleidipy.core.buffers import check_execution, roundup
from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import F16_BITS_TO_F32, f16_bits_to_f32, fma_f32, round_away
from kleidipy.core.packers import LhsPacker, RhsPacker
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError, NonFiniteInputError
from kleidipy.kernels.qai8dxp_qsi8cxp import jit, neon, sme, sme2, vnni

#: K is padded to a multiple of this in every qai8dxp packed buffer (k_int = roundup(k, 32)).
K_MULTIPLE = 32
#: bytes after the int8 data of one packed LHS row: int32 -zero_point and f32 1/scale.
LHS_PARAM_BYTES = 8
#: bytes after the data of one packed RHS column: int32 row sum, f32 scale, f32 bias.
RHS_PARAM_BYTES = 12

FAMILY_NAME = "qai8dxp_qsi8cxp"
#: the tiers of the family's tile chain this host has, constants of :func:`is_tiled_layout` and :func:`matmul_tiled`
#: (the others are never compiled): the SME tiles (SME2's or SME1's: one set of symbols), the NEON tiles, the VNNI ones
_SME, _NEON, _VNNI = sme2.AVAILABLE or sme.AVAILABLE, neon.AVAILABLE, vnni.HAVE_VNNI


@numba.njit(cache=True, nogil=True)
def is_tiled_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
    """Whether the family's tile chain on this host runs a layout (``jit.matmul_qai8dxp``'s layout arguments): the SME
    kernels' int8 layouts bound to the host's SVL, the NEON kernels', or every int8 layout of the VNNI tiles."""
    if _SME and sme2.is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
        return True
    if _NEON and neon.is_native_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
        return True
    if _VNNI:
        return vnni.is_vnni_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi)
    return False


@numba.njit(cache=True, nogil=True)
def matmul_tiled(m, n, k_int, mr, nr, kbl, kr, lhs_i8, rhs_u8, fma_bias, out):  # pragma: no cover - compiled
    """The family's tile chain: out[m, n] (C-contiguous float32, unclamped) of a layout :func:`is_tiled_layout`
    accepts (kr = blen), the bits of ``jit.matmul_qai8dxp`` with the recipe fma(S, F, bias) (``fma_bias``) or
    f32(f32(F·S) + bias). The SME tiles run the SME kernels bound to the host's SVL with their own recipe, the NEON
    tiles the NEON layouts with theirs, the VNNI tiles every layout; another recipe runs the portable loop."""
    if _SME and m > 0 and n > 0 and k_int >= sme2.BLOCK and sme2.tile_runs(mr, nr, kbl, kr, fma_bias):
        sme2.matmul(m, n, k_int, lhs_i8, rhs_u8, fma_bias, out)
    elif _NEON and not fma_bias and nr == neon.NR and (kr == 4 or kr == 8) and (mr == 1 or (mr == 4 and kbl == kr)):
        neon.matmul(m, n, k_int, mr, kr, lhs_i8, rhs_u8, out)
    elif _VNNI:
        vnni.matmul(m, n, k_int, mr, nr, kbl, kr, lhs_i8, rhs_u8, fma_bias, out)
    else:
        k_lo = jit.int8_k_lo(k_int, nr, kr)
        lhs_i32, lhs_f32 = lhs_i8.view(np.int32), lhs_i8.view(np.float32)
        recipe = jit.RECIPE_FMA_BIAS if fma_bias else jit.RECIPE_FMUL_FADD
        jit.matmul_qai8dxp(
            m, n, k_int, lhs_i8, lhs_i32, lhs_f32, rhs_u8, mr, kbl, nr, kr, 0, k_lo, k_lo[:0], recipe, out
        )


def _tiled(m, n, k_int, lhs_i8, rhs_u8, mr, kbl, nr, blen, nibble_factor, k_lo, k_hi, recipe, out) -> bool:
    """Run a call of ``jit.matmul_qai8dxp`` on :func:`matmul_tiled` and return True if the chain runs its layout,
    else return False."""
    if not is_tiled_layout(mr, k_int, kbl, nr, blen, nibble_factor, k_lo, k_hi):
        return False
    matmul_tiled(m, n, k_int, mr, nr, kbl, blen, lhs_i8, rhs_u8, recipe == jit.RECIPE_FMA_BIAS, out)
    return True


#: the jit's matmul (``jit.matmul_qai8dxp``'s arguments and bits): the family's tile chain on the layouts it runs,
#: the portable loop on the others (the int4 per-channel family's too)
MATMUL_COMPUTE = jit.with_tiles((_tiled,), jit.matmul_qai8dxp)


def k_internal(k: int) -> int:
    """KleidiAI's k_internal: k rounded up to a multiple of 32."""
    return roundup(k, K_MULTIPLE)


def wrap_i32(x: np.ndarray) -> np.ndarray:
    """Two's-complement int32 of an exact integer array (the kernels' int32 accumulators wrap)."""
    return ((np.asarray(x, dtype=np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def _words(block: np.ndarray, dtype: type) -> np.ndarray:
    """[groups, 4·c] bytes → [groups, c] little-endian words of ``dtype``."""
    return np.ascontiguousarray(block).view(dtype)


# --------------------------------------------------------------------------------------------- LHS


class LhsQuantPackQai8dxpF32(LhsPacker):
    """``kai_run_lhs_quant_pack_qai8dxp_f32``: per-row dynamic asymmetric int8 quantization + packing.

    Per row: rmin = min(0, min x), rmax = max(0, max x), scale = f32(255 / (rmax − rmin)) (1 when equal),
    recip = f32(1/scale); zero point from the smaller rounding error of the two ends, clamped, rounded to
    nearest even; q = clamp(roundaway(f32(x·scale)) + zp, −128, 127) (ties away from zero on every path
    at v1.30). K is padded to k_int = roundup(k, 32) with copies of the last value. A group of mr rows
    holds the data in kbl = kr/sr chunks ((k//kbl)·mr·kbl + r·kbl + k%kbl), then mr int32 −zp, then
    mr f32 recip; padding rows are 0.
    """

    name = "lhs_quant_pack_qai8dxp_f32"
    blocked = False

    def get_lhs_packed_stride(self, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return mr * (k_internal(k) + LHS_PARAM_BYTES)

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if bl is not None:
            raise KernelShapeError(f"{self.name}: the packer is not block-quantized (bl must be None, got {bl})")
        if mr <= 0 or kr <= 0 or sr <= 0 or kr % sr or K_MULTIPLE % (kr // sr):
            raise KernelShapeError(f"{self.name}: mr={mr}, kr={kr}, sr={sr}: kr/sr must divide {K_MULTIPLE}")

    @staticmethod
    def quantize(lhs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """int8 q [m, k_int] (padding columns copy the last value), int32 zero points, f32 recip per row."""
        x = np.asarray(lhs, dtype=np.float32)
        m, k = x.shape
        f0, qmin, qmax = np.float32(0), np.float32(-128), np.float32(127)
        mn, mx = x.min(axis=1), x.max(axis=1)
        rmin = np.where(f0 < mn, f0, mn)
        rmax = np.where(f0 > mx, f0, mx)
        span = np.where(rmin == rmax, np.float32(1), rmax - rmin)
        scale = np.where(rmin == rmax, np.float32(1), np.float32(255) / span).astype(np.float32)
        with np.errstate(divide="ignore"):
            recip = np.where(scale != f0, np.float32(1) / scale, f0).astype(np.float32)
        dmin, dmax = rmin * scale, rmax * scale
        err = (qmin + dmin) + (qmax + dmax)
        zp = np.clip(np.where(err > f0, qmin - dmin, qmax - dmax), qmin, qmax)
        nzp = np.rint(zp).astype(np.int32)
        padded = x[:, np.minimum(np.arange(k_internal(k)), k - 1)]
        q = np.clip(round_away(padded * scale[:, None]) + nzp[:, None], -128, 127).astype(np.int8)
        return q, nzp, recip

    def _reference(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        m, k = lhs.shape
        k_int, kbl = k_internal(k), kr // sr
        q, nzp, recip = self.quantize(lhs)
        groups = -(-(m + row_offset) // mr)
        rows = np.arange(m) + row_offset
        data = np.zeros((groups * mr, k_int), dtype=np.int8)
        offsets = np.zeros(groups * mr, dtype=np.int32)
        recips = np.zeros(groups * mr, dtype=np.float32)
        data[rows], offsets[rows], recips[rows] = q, -nzp, recip
        chunks = data.reshape(groups, mr, k_int // kbl, kbl).transpose(0, 2, 1, 3).reshape(groups, -1)
        packed = np.concatenate(
            [
                chunks.view(np.uint8),
                offsets.reshape(groups, mr).view(np.uint8),
                recips.reshape(groups, mr).view(np.uint8),
            ],
            axis=1,
        )
        return packed.reshape(-1)

    def _jit(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        m, k = lhs.shape
        out = np.zeros(self.get_lhs_packed_size(m + row_offset, k, mr, kr, sr), dtype=np.uint8)
        jit.lhs_quant_pack_qai8dxp(np.ascontiguousarray(lhs), mr, kr // sr, row_offset, k_internal(k), out)
        return out


LHS_PACKER = LhsQuantPackQai8dxpF32()


def unpack_lhs(lhs: np.ndarray, m: int, k: int, mr: int, kbl: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read m rows of a packed qai8dxp LHS: int8 q [m, k_int], int32 offsets (−zp) [m], f32 recip [m]."""
    k_int = k_internal(k)
    groups = -(-m // mr)
    buf = lhs[: groups * mr * (k_int + LHS_PARAM_BYTES)].reshape(groups, -1)
    data = buf[:, : mr * k_int].view(np.int8).reshape(groups, k_int // kbl, mr, kbl)
    q = data.transpose(0, 2, 1, 3).reshape(groups * mr, k_int)[:m]
    offsets = _words(buf[:, mr * k_int : mr * (k_int + 4)], np.int32).reshape(-1)[:m]
    recip = _words(buf[:, mr * (k_int + 4) :], np.float32).reshape(-1)[:m]
    return q, offsets, recip


# --------------------------------------------------------------------------------------------- RHS


@dataclass(frozen=True)
class RhsDataLayout:
    """Where the values of one packed RHS group's data live (the same for every group).

    The data is read in chunks of nr·blen bytes; byte e belongs to column ``col[e]`` and holds the value of
    K index ``k_lo[e]`` (int8 format: ``k_hi`` empty, ``nibble_factor`` 0) or two signed nibbles, ``k_lo[e]``
    low and ``k_hi[e]`` high, each weighing ``nibble_factor`` in the kernels (int4 formats).
    """

    blen: int
    nibble_factor: int
    col: np.ndarray
    k_lo: np.ndarray
    k_hi: np.ndarray


class PerChannelRhsPacker(RhsPacker):
    """Common part of the per-channel (``cx``) RHS packers: a group of nr columns is its data, then nr int32
    row sums (``sum_multiplier``·Σw over the real K), nr f32 scales (times ``scale_multiplier`` when set),
    nr f32 biases (0 without bias). Padding columns copy column n−1, or are all 0 (``zero_padding``).
    Subclasses give the data layout and how ``rhs`` holds the weights."""

    blocked = False
    inputs = ("scale",)
    #: row sums are sum_multiplier·Σw
    sum_multiplier = 1
    #: stored scales are f32(scale·scale_multiplier) (None: stored as given)
    scale_multiplier: float | None = None
    #: padding columns are all 0 (else they copy column n−1)
    zero_padding = False
    #: numpy dtype of the ``rhs`` input
    rhs_dtype: type = np.int8

    def data_bytes(self, k: int, nr: int) -> int:
        """Bytes of packed data of one group."""
        raise NotImplementedError

    def layout(self, k: int, nr: int, kr: int, sr: int) -> RhsDataLayout:
        """The data layout of one group (cached: the same for every call with these parameters)."""
        return _layout(type(self), k_internal(k), nr, kr, sr)

    @classmethod
    def build_layout(cls, k_int: int, nr: int, kr: int, sr: int) -> RhsDataLayout:
        raise NotImplementedError

    def get_rhs_packed_stride(self, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return self.data_bytes(k, nr) + nr * RHS_PARAM_BYTES

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        if bl is not None:
            raise KernelShapeError(f"{self.name}: the packer is per channel (bl must be None, got {bl})")
        if nr <= 0 or kr <= 0 or sr <= 0 or kr % sr or K_MULTIPLE % kr:
            raise KernelShapeError(f"{self.name}: nr={nr}, kr={kr}, sr={sr}: kr must divide {K_MULTIPLE}, sr divide kr")

    def weights(self, rhs: np.ndarray, n: int, k: int) -> np.ndarray:
        """The signed weight values w [n, k] (int32) that ``rhs`` holds."""
        raise NotImplementedError

    def _channel_inputs(
        self, n: int, scale: np.ndarray, bias: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        out = []
        for what, arr in (("scale", scale), ("bias", bias)):
            if arr is None:
                out.append(None)
                continue
            arr = np.asarray(arr)
            if arr.dtype != np.float32:
                raise DTypeError(f"{self.name}: {what} must be float32, got {arr.dtype}")
            if arr.size < n:
                raise BufferSizeError(f"{self.name}: {what} holds {arr.size} values, n={n} needs {n}")
            out.append(np.ascontiguousarray(arr).reshape(-1)[:n])
        return out[0], out[1]

    def rhs_rows(self, rhs: np.ndarray, n: int, k: int) -> np.ndarray:
        """The first n rows of ``rhs`` ([n, k] int8 values, or [n, ceil(k/2)] uint8 pairs of 4-bit codes)."""
        row_bytes = k if self.rhs_dtype == np.int8 else -(-k // 2)
        arr = np.asarray(rhs)
        if arr.dtype != self.rhs_dtype:
            raise DTypeError(f"{self.name}: rhs must be {np.dtype(self.rhs_dtype)}, got {arr.dtype}")
        if arr.size < n * row_bytes:
            raise BufferSizeError(
                f"{self.name}: rhs holds {arr.size} values, n={n} rows of {row_bytes} need {n * row_bytes}"
            )
        return np.ascontiguousarray(arr).reshape(-1)[: n * row_bytes].reshape(n, row_bytes)

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        scale, bias = self._channel_inputs(n, scale, bias)
        w = self.weights(rhs, n, k)
        k_int = k_internal(k)
        groups = -(-n // nr)
        cols = np.arange(groups * nr)
        src = np.minimum(cols, n - 1)
        padding = cols >= n
        values = np.zeros((groups * nr, k_int), dtype=np.int32)
        values[:, :k] = w[src]
        sums = (values.sum(axis=1) * self.sum_multiplier).astype(np.int32)
        scales = scale[src] if self.scale_multiplier is None else scale[src] * np.float32(self.scale_multiplier)
        biases = np.zeros(groups * nr, dtype=np.float32) if bias is None else bias[src].copy()
        if self.zero_padding:
            values[padding], sums[padding], scales[padding], biases[padding] = 0, 0, 0, 0
        lay = self.layout(k, nr, kr, sr)
        rows = (np.arange(groups) * nr)[:, None] + lay.col[None, :]
        if lay.nibble_factor:
            data = ((values[rows, lay.k_lo] & 15) | ((values[rows, lay.k_hi] & 15) << 4)).astype(np.uint8)
        else:
            data = values[rows, lay.k_lo].astype(np.int8).view(np.uint8)
        params = [
            a.astype(dt).reshape(groups, nr).view(np.uint8)
            for a, dt in ((sums, np.int32), (scales, np.float32), (biases, np.float32))
        ]
        return np.concatenate([data, *params], axis=1).reshape(-1)

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        scale, bias = self._channel_inputs(n, scale, bias)
        lay = self.layout(k, nr, kr, sr)
        out = np.zeros(self.get_rhs_packed_size(n, k, nr, kr, sr), dtype=np.uint8)
        jit.rhs_pack_per_channel(
            self.rhs_rows(rhs, n, k),
            self.rhs_dtype == np.uint8,
            k,
            scale,
            scale if bias is None else bias,
            bias is not None,
            nr,
            lay.blen,
            lay.k_lo,
            lay.k_hi,
            self.sum_multiplier,
            np.float32(self.scale_multiplier or 0),
            self.zero_padding,
            out,
        )
        return out

    def unpack(
        self, rhs: np.ndarray, n: int, k: int, nr: int, kr: int, sr: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Read n columns of a packed RHS as a kernel does: the int weights it multiplies W [n, k_int] (int64;
        16·w for the NEON int4 format), int32 row sums, f32 scales, f32 biases (each [n])."""
        lay = self.layout(k, nr, kr, sr)
        data_bytes = self.data_bytes(k, nr)
        groups = -(-n // nr)
        buf = rhs[: groups * self.get_rhs_packed_stride(k, nr, kr, sr)].reshape(groups, -1)
        data = buf[:, :data_bytes]
        w = np.zeros((groups * nr, k_internal(k)), dtype=np.int64)
        rows = (np.arange(groups) * nr)[:, None] + lay.col[None, :]
        if lay.nibble_factor:
            lo = ((data & 15).astype(np.int64) ^ 8) - 8
            hi = ((data >> 4).astype(np.int64) ^ 8) - 8
            w[rows, lay.k_lo] = lo * lay.nibble_factor
            w[rows, lay.k_hi] = hi * lay.nibble_factor
        else:
            w[rows, lay.k_lo] = data.view(np.int8)
        params = buf[:, data_bytes:]
        sums = _words(params[:, : 4 * nr], np.int32).reshape(-1)[:n]
        scales = _words(params[:, 4 * nr : 8 * nr], np.float32).reshape(-1)[:n]
        biases = _words(params[:, 8 * nr :], np.float32).reshape(-1)[:n]
        return w[:n], sums, scales, biases


@cache
def _layout(cls: type[PerChannelRhsPacker], k_int: int, nr: int, kr: int, sr: int) -> RhsDataLayout:
    lay = cls.build_layout(k_int, nr, kr, sr)
    for arr in (lay.col, lay.k_lo, lay.k_hi):
        arr.setflags(write=False)
    return lay


class RhsPackNxkQsi8cxpQsi8cxNeon(PerChannelRhsPacker):
    """``kai_run_rhs_pack_nxk_qsi8cxp_qsi8cx_neon``: int8 weights [n, k] + f32 scale [n] (+ bias).

    int8 (col, k) at (k//kr)·nr·kr + col·kr + k%kr of the group, 0 for k ≥ K; row sums = lhs_zero_point·Σq
    with llama.cpp's ``params.lhs_zero_point`` = 1; the scale is stored as given (``params.scale_multiplier``
    is not applied); padding columns copy column n−1.
    """

    name = "rhs_pack_nxk_qsi8cxp_qsi8cx_neon"
    rhs_dtype = np.int8
    sum_multiplier = 1  # params.lhs_zero_point

    def data_bytes(self, k: int, nr: int) -> int:
        return nr * k_internal(k)

    @classmethod
    def build_layout(cls, k_int: int, nr: int, kr: int, sr: int) -> RhsDataLayout:
        e = np.arange(nr * k_int)
        k_lo = jit.int8_k_lo(k_int, nr, kr)
        return RhsDataLayout(kr, 0, (e // kr) % nr, k_lo, np.empty(0, dtype=k_lo.dtype))

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        if sr != 1:
            raise KernelShapeError(f"{self.name}: sr must be 1, got {sr}")

    def weights(self, rhs: np.ndarray, n: int, k: int) -> np.ndarray:
        return self.rhs_rows(rhs, n, k).astype(np.int32)


RHS_PACKER = RhsPackNxkQsi8cxpQsi8cxNeon()


# --------------------------------------------------------------------------------------------- Q8_0


def requantize_q8_0_per_channel(
    q8_0_blocks: np.ndarray, n: int, k: int, *, execution: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q8_0 repack: GGML block_q8_0 rows → per-channel int8 q [n, k] and f32 scale [n].

    v = f32(d)·qs (exact); scale = f32(max|v| / 127) (0 for an all-zero row); q = clamp(lround(f32(v·f32(1/scale))),
    −127, 127) with ties away from zero. ``q8_0_blocks`` holds n·(k/32) blocks of 34 bytes (any shape, uint8).
    """
    execution = check_execution(execution)
    if n <= 0 or k <= 0 or k % 32:
        raise KernelShapeError(f"requantize_q8_0_per_channel: n={n}, k={k}: k must be a positive multiple of 32")
    arr = np.asarray(q8_0_blocks)
    if arr.dtype != np.uint8:
        raise DTypeError(f"requantize_q8_0_per_channel: Q8_0 blocks must be uint8, got {arr.dtype}")
    nb = k // 32
    if arr.size != n * nb * 34:
        raise BufferSizeError(f"requantize_q8_0_per_channel: {arr.size} bytes, {n}x{k} Q8_0 needs {n * nb * 34}")
    blocks = np.ascontiguousarray(arr).reshape(n, nb, 34)
    d = f16_bits_to_f32(blocks[:, :, :2].copy().view(np.uint16)[..., 0])
    if not np.isfinite(d).all():
        raise NonFiniteInputError("requantize_q8_0_per_channel: a Q8_0 block scale d is NaN/Inf")
    if execution == "jit":
        q = np.empty((n, k), dtype=np.int8)
        scale = np.empty(n, dtype=np.float32)
        jit.requantize_q8_0(blocks, F16_BITS_TO_F32, q, scale)
        return q, scale
    return quantize_per_channel((d[:, :, None] * blocks[:, :, 2:].view(np.int8).astype(np.float32)).reshape(n, k))


def quantize_per_channel(v: np.ndarray, execution: str = "reference") -> tuple[np.ndarray, np.ndarray]:
    """float32 rows [n, k] → per-channel int8 q [n, k] and f32 scale [n], rounded as in
    :func:`requantize_q8_0_per_channel`: scale = f32(max|v| / 127), q = clamp(lround(f32(v·f32(1/scale))), ±127)
    (``execution`` "jit": the same bits from ``jit.quantize_per_channel``, ~15x faster)."""
    v = np.asarray(v, dtype=np.float32)
    if not np.isfinite(v).all():
        raise NonFiniteInputError("quantize_per_channel: a weight is NaN/Inf")
    if execution == "jit":
        q, scale = np.empty(v.shape, np.int8), np.empty(v.shape[0], np.float32)
        jit.quantize_per_channel(np.ascontiguousarray(v), q, scale)
        return q, scale
    amax = np.abs(v).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(127), np.float32(0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    q = np.clip(round_away(v * inv[:, None]), -127, 127).astype(np.int8)
    return q, scale


# --------------------------------------------------------------------------------------------- kernels


class Recipe(IntEnum):
    """The float epilogue of a kernel. Every kernel first adds the zero-point term in int32 (MLA, wrapping):
    acc = Σ q·W + (−zp)·Σw; then F = f32(acc) (SCVTF, RNE: rounds once |acc| > 2^24) and S = f32(scale_R·recip_L).

    The SME2 qsi4cxp MOPA kernel did this correction in float up to at least v1.16
    (C = f32(f32(−zp)·f32(Σw))·S, out = fma(S, f32(dot), C) + bias). The v1.30 golden data rules that out:
    it differs from the golden dst in 13 to 706 elements per run, while the integer correction matches every
    element, so that kernel is FMUL_FADD here.
    """

    #: out = f32(f32(F·S) + bias)  — NEON (FMUL, FADD), SME/SME2 MOPA
    FMUL_FADD = jit.RECIPE_FMUL_FADD
    #: out = fma(S, F, bias)  — SME/SME2 GEMV (FMLA into the bias, one rounding)
    FMA_BIAS = jit.RECIPE_FMA_BIAS


class Qai8dxpMatmulKernel(MatmulKernel):
    """A ``matmul_clamp_f32_qai8dxp…`` kernel: qai8dxp LHS × a per-channel RHS (``flags["recipe"]``)."""

    #: the jit execution's code (``jit.matmul_qai8dxp``'s signature): a family with tiles of its own sets its own
    compute: ClassVar[Callable[..., None]] = staticmethod(MATMUL_COMPUTE)

    @property
    def recipe(self) -> Recipe:
        return self.flags["recipe"]

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g = self._geo()
        q, offsets, recip = unpack_lhs(lhs, m, k, g.mr, g.kr // g.sr)
        w, sums, scales, biases = self.rhs_packer.unpack(rhs, n, k, g.nr, g.kr, g.sr)
        acc = wrap_i32(q.astype(np.int64) @ w.T + offsets[:, None].astype(np.int64) * sums[None, :]).astype(np.float32)
        s = scales[None, :] * recip[:, None]
        if self.recipe == Recipe.FMA_BIAS:
            return fma_f32(s, acc, biases[None, :])
        return acc * s + biases

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g = self._geo()
        lay = self.rhs_packer.layout(k, g.nr, g.kr, g.sr)
        lhs = lhs[: self.lhs_packed_size(m, k)]
        rhs = np.ascontiguousarray(rhs[: self.rhs_packed_size(n, k)])
        out = np.empty((m, n), dtype=np.float32)
        self.compute(
            m,
            n,
            k_internal(k),
            lhs.view(np.int8),
            lhs.view(np.int32),
            lhs.view(np.float32),
            rhs,
            g.mr,
            g.kr // g.sr,
            g.nr,
            lay.blen,
            lay.nibble_factor,
            lay.k_lo,
            lay.k_hi,
            int(self.recipe),
            out,
        )
        return out


def neon_geometry(m_step: int, mr: int, kr: int, sr: int, nr: int = 4) -> Callable[[int], Geometry]:
    """Geometry of a NEON kernel (fixed; ``vl`` is ignored)."""
    geo = Geometry(m_step, nr, mr, nr, kr, sr)
    return lambda vl: geo


def sme_geometry(gemm: bool) -> Callable[[int], Geometry]:
    """Geometry of an SME kernel from VL (32-bit lanes): 1VL×4VL tiles (GEMM) or 1×4VL (GEMV), kr = 4, sr = 1."""
    return lambda vl: Geometry(vl if gemm else 1, 4 * vl, vl if gemm else 1, 4 * vl, 4, 1)


def make_kernel(
    name: str,
    family: str,
    tier: str,
    rhs_packer: PerChannelRhsPacker,
    geometry: Callable[[int], Geometry],
    recipe: Recipe,
    kernel_class: type[Qai8dxpMatmulKernel] = Qai8dxpMatmulKernel,
) -> Qai8dxpMatmulKernel:
    """A qai8dxp kernel (GEMV when mr = 1) reading the qai8dxp LHS and ``rhs_packer``'s layout."""
    kind = "gemv" if geometry(4).mr == 1 else "gemm"
    return kernel_class(name, family, tier, kind, LHS_PACKER, rhs_packer, geometry, bl=None, flags={"recipe": recipe})


KERNELS = [
    make_kernel(f"matmul_clamp_f32_qai8dxp{lhs}_qsi8cxp{rhs}_{tile}", FAMILY_NAME, tier, RHS_PACKER, geo, recipe)
    for lhs, rhs, tile, tier, geo, recipe in (
        ("1vlx4", "4vlx4", "1vlx4vl_sme2_mopa", "sme2", sme_geometry(True), Recipe.FMUL_FADD),
        ("1x4", "4vlx4", "1x4vl_sme2_dot", "sme2", sme_geometry(False), Recipe.FMA_BIAS),
        ("1vlx4", "4vlx4", "1vlx4vl_sme_mopa", "sme", sme_geometry(True), Recipe.FMUL_FADD),
        ("1x4", "4vlx4", "1x4vl_sme_dot", "sme", sme_geometry(False), Recipe.FMA_BIAS),
        ("4x8", "4x8", "16x4_neon_i8mm", "i8mm", neon_geometry(16, 4, 8, 1), Recipe.FMUL_FADD),
        ("1x8", "4x8", "1x4_neon_dotprod", "dotprod", neon_geometry(1, 1, 8, 1), Recipe.FMUL_FADD),
        ("4x4", "4x4", "16x4_neon_dotprod", "dotprod", neon_geometry(16, 4, 4, 1), Recipe.FMUL_FADD),
        ("1x4", "4x4", "1x4_neon_dotprod", "dotprod", neon_geometry(1, 1, 4, 1), Recipe.FMUL_FADD),
    )
]

PACKERS = [LHS_PACKER, RHS_PACKER]
