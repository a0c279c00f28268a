"""Q4_1 family ``qsi8d32p × qai4c32p``: 8-bit blocked activations × asymmetric 4-bit blocked weights.

Owns the LHS packer ``lhs_quant_pack_qsi8d32pscalef32_f32_neon``, the RHS packers
``rhs_pack_nxk_qai4c32p_qau4c32s0s1_f32_f32_f32_neon`` (NEON) and
``rhs_pack_nxk_qai4c32ps1s0nrx4_qau4c32{s1s0,s0s1}_f32_f32_f32_neon`` (SME2), the six matmul kernels, the GGML
Q4_1 → packer-input mapping (:func:`q4_1_to_qai4c32`) and GET_ROWS from a packed RHS (:func:`get_rows`).

Quantities (bl = 32, block b of row i / column j):

* LHS (per row and block): q int8 = clamp(rne(f32(x·s)), −128, 127) with s = f32(127/amax) (0 when amax = 0),
  recip rc = f32(1/s) (0 when s = 0), row sum rs = f32(f32(Σq)·rc).
* RHS (per column and block): unsigned codes u, f32 ``scale`` and f32 ``zero`` (an offset, not an integer zero
  point); the weight is scale·(u − 8) + zero, and for Q4_1 scale = d, zero = m + 8d, so that is u·d + m.

Kernel recipe (all six kernels, float32 throughout, confirmed bit for bit on every golden run)::

    a_b  = f32(Σ_t q[i, t]·(u[j, t] − 8))        int32 dot of the block, converted exactly (|a| < 2^24)
    S_b  = f32(scale[j, b] · rc[i, b])            FMUL
    acc  = +0
    for b in blocks:  acc = fma(zero[j, b], rs[i, b], acc)   zero term first, fused
                      acc = fma(S_b, a_b, acc)               then the scale term, fused
    dst  = f32(acc + bias[j])                     FADD (bias is 0 when the packer got none), then clamp

The SME2 MOPA kernel starts with ``acc = f32(zero·rs)`` (FMUL) for the first block instead of fma from +0 (its
``flags["first_block_fmul"]``); that differs only in the sign of an exact zero, which only a −0.0 bias shows.
KleidiAI's SME2 sources state this order; the golden dst rule out every other combination tried (per-block sum
added to acc, scale term first, an unfused zero or scale term). The NEON layout stores scale/16 and its
nibbles sit in the high half of an int8 (weight 16·(u − 8)); (scale/16)·rc times 16·dot is the same product,
so the NEON kernels use the recipe as written on the stored values (identical unless scale/16 is subnormal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from kleidipy.core.buffers import check_execution
from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import f16_bits_to_f32, fma_f32, round_even
from kleidipy.core.packers import LhsPacker, RhsPacker
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError
from kleidipy.formats import q4_1
from kleidipy.kernels.qsi8d32p_qai4c32p import jit as _jit
from kleidipy.kernels.qsi8d32p_qai4c32p import neon as _neon
from kleidipy.kernels.qsi8d32p_qai4c32p import sme2 as _sme2
from kleidipy.kernels.qsi8d32p_qai4c32p import vnni as _vnni
from kleidipy.kernels.qsi8d32p_qai4c32p import vnni_pack as _pack

FAMILY_NAME = "qsi8d32p_qai4c32p"
#: the family's tile chain, one per RHS layout, for its jit and its compiled-plan routines (unclamped float32
#: [m, n], the same bits every way): the native SME2 tiles (kernels bound to the host's SVL) or sdot/smmla tiles on
#: aarch64, else the AVX-512 VNNI tiles, else the portable loops. SME2: ``(m, n, k, mr, nr, lhs, rhs,
#: first_block_fmul)``; NEON: ``(m, n, k, mr, nr, kbl, lhs, rhs)``.
SME2_COMPUTE = _sme2.compute if _sme2.AVAILABLE else _vnni.compute_sme2 if _vnni.HAVE_VNNI else _jit.matmul_sme2
NEON_COMPUTE = _neon.compute if _neon.AVAILABLE else _vnni.compute_neon if _vnni.HAVE_VNNI else _jit.matmul_neon

BL = _jit.BL
LHS_BLOCK_BYTES = _jit.LHS_BLOCK_BYTES
RHS_BLOCK_BYTES = _jit.RHS_BLOCK_BYTES

CodeOrder = Literal["s0s1", "s1s0"]


def _f32_fields(raw: np.ndarray) -> np.ndarray:
    """float32 values of little-endian bytes (last axis a multiple of 4)."""
    return np.ascontiguousarray(raw).view("<f4")


def writable(arr: np.ndarray) -> np.ndarray:
    """A writable C-contiguous array for the numba code (one compiled signature; read-only input is copied)."""
    flags = arr.flags
    return arr if flags.c_contiguous and flags.writeable else np.require(arr, requirements=["C", "W"])


def _bytes(values: np.ndarray) -> np.ndarray:
    """The little-endian bytes of float32 values (last axis ×4)."""
    return np.ascontiguousarray(values, dtype="<f4").view(np.uint8)


# --------------------------------------------------------------------------------------------- LHS


def quantize_lhs_blocks(lhs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-32-block quantization of float32 rows [m, k]: (q int8 [m, nb, 32], row sum, recip f32 [m, nb])."""
    m, k = lhs.shape
    x = lhs.reshape(m, k // BL, BL)
    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        scale = np.where(amax == 0, np.float32(0), np.float32(127) / amax).astype(np.float32)
        recip = np.where(scale == 0, np.float32(0), np.float32(1) / scale).astype(np.float32)
        y = x * scale[..., None]
    y = np.where(np.isnan(y), 0, y)  # 0·inf (subnormal amax) converts to 0, as FCVTNS does
    q = np.clip(round_even(y), -128, 127).astype(np.int8)
    row_sum = q.sum(axis=-1, dtype=np.int32).astype(np.float32) * recip
    return q, row_sum, recip


def unpack_lhs(lhs: np.ndarray, m: int, k: int, mr: int, kbl: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read a packed LHS back: (q int32 [m, nb, 32], row sum f32 [m, nb], recip f32 [m, nb])."""
    nb, groups = k // BL, -(-m // mr)
    blocks = lhs[: groups * nb * mr * LHS_BLOCK_BYTES].reshape(groups, nb, mr * LHS_BLOCK_BYTES)
    data = blocks[:, :, : BL * mr].view(np.int8).reshape(groups, nb, BL // kbl, mr, kbl)
    q = data.transpose(0, 3, 1, 2, 4).reshape(groups * mr, nb, BL)[:m].astype(np.int32)
    fields = _f32_fields(blocks[:, :, BL * mr :]).reshape(groups, nb, 2, mr).transpose(2, 0, 3, 1)
    row_sum, recip = (f.reshape(groups * mr, nb)[:m] for f in fields)
    return q, row_sum, recip


class LhsQuantPackQsi8d32pscalef32F32Neon(LhsPacker):
    """``kai_run_lhs_quant_pack_qsi8d32pscalef32_f32_neon``: per group of mr rows and block b (mr·40 bytes), the
    int8 values in chunks of kbl = kr/sr per row (element (r, 32b + c·kbl + t) at c·mr·kbl + r·kbl + t), then mr
    f32 row sums, then mr f32 recips. Padding rows are 0."""

    name = "lhs_quant_pack_qsi8d32pscalef32_f32_neon"

    def get_lhs_packed_stride(self, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return mr * (k // BL) * LHS_BLOCK_BYTES

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if mr <= 0 or sr <= 0 or kr <= 0 or kr % sr or BL % kr or (kr // sr) % 4:
            raise KernelShapeError(f"{self.name}: mr={mr}, kr={kr}, sr={sr} not supported (kr/sr in 4, 8, 16)")

    def _reference(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        m, k = lhs.shape
        nb, kbl = k // BL, kr // sr
        groups = -(-(m + row_offset) // mr)
        q, row_sum, recip = quantize_lhs_blocks(np.asarray(lhs))
        rows = slice(row_offset, row_offset + m)
        q_all = np.zeros((groups * mr, nb, BL), np.int8)
        q_all[rows] = q
        fields = np.zeros((2, groups * mr, nb), np.float32)
        fields[0, rows], fields[1, rows] = row_sum, recip
        data = q_all.reshape(groups, mr, nb, BL // kbl, kbl).transpose(0, 2, 3, 1, 4).reshape(groups, nb, -1)
        params = fields.reshape(2, groups, mr, nb).transpose(1, 3, 0, 2).reshape(groups, nb, -1)
        return np.concatenate([data.view(np.uint8), _bytes(params)], axis=-1).reshape(-1)

    def _jit(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        return _pack.lhs_quant_pack(writable(lhs), mr, kr // sr, row_offset)  # (the reference's bytes)


# --------------------------------------------------------------------------------------------- RHS


def inputs_f32(arr: np.ndarray | None, size: int, what: str, who: str) -> np.ndarray | None:
    """A packer's float32 input ``what`` of at least ``size`` values, flat and writable (None stays None)."""
    if arr is None:
        return None
    a = np.asarray(arr)
    if a.dtype != np.float32:
        raise DTypeError(f"{who}: {what} must be float32, got {a.dtype}")
    if a.size < size:
        raise BufferSizeError(f"{who}: {what} holds {a.size} values, {size} needed")
    return writable(a.reshape(-1)[:size])


def codes_to_u(codes: np.ndarray, order: CodeOrder) -> np.ndarray:
    """Unsigned 4-bit codes u [n, k] from packed bytes [n, k/2] in ``order`` (s0s1: element 2i in the high nibble)."""
    hi, lo = codes >> 4, codes & 0x0F
    pair = (hi, lo) if order == "s0s1" else (lo, hi)
    return np.stack(pair, axis=-1).reshape(codes.shape[0], -1)


class Qai4c32pRhsPacker(RhsPacker):
    """The qai4c32p RHS layout shared by the three packers: per group of nr columns and block b (nr·24 bytes)
    nr·16 bytes of nibbles, nr f32 ``zero``, nr f32 scale; after the last block nr f32 bias. Columns past n
    repeat column n−1. Subclasses fix the nibble arrangement (``neon``), the input nibble order and kr/sr."""

    inputs = ("scale", "zero")
    #: nibble order of the ``rhs`` codes this packer reads.
    code_order: CodeOrder = "s0s1"
    #: NEON layout (pairs (t, t+16) XOR 0x88, scale/16, chunks of kr/sr bytes) or SME2 nrx4 (pairs (2j, 2j+1),
    #: uint16 quads, chunks of 2 bytes).
    neon: bool = False

    def get_rhs_packed_stride(self, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return nr * ((k // BL) * RHS_BLOCK_BYTES + 4)

    def chunk(self, kr: int, sr: int) -> int:
        """Bytes of one column stored together before the next column's."""
        return kr // sr if self.neon else _jit.SME_CHUNK

    def _inputs(
        self, n: int, k: int, rhs: np.ndarray, scale: np.ndarray, zero: np.ndarray, bias: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        codes = np.asarray(rhs)
        if codes.dtype != np.uint8:
            raise DTypeError(f"{self.name}: rhs codes must be uint8, got {codes.dtype}")
        if codes.size < n * k // 2:
            raise BufferSizeError(f"{self.name}: rhs holds {codes.size} bytes, n={n}, k={k} needs {n * k // 2}")
        nb = k // BL
        codes = writable(codes.reshape(-1)[: n * k // 2]).reshape(n, k // 2)
        scale = inputs_f32(scale, n * nb, "scale", self.name).reshape(n, nb)
        zero = inputs_f32(zero, n * nb, "zero", self.name).reshape(n, nb)
        return codes, scale, zero, inputs_f32(bias, n, "bias", self.name)

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        codes, scale, zero, bias = self._inputs(n, k, rhs, scale, zero, bias)
        nb, groups, chunk = k // BL, -(-n // nr), self.chunk(kr, sr)
        src = np.minimum(np.arange(groups * nr), n - 1)
        u = codes_to_u(codes, self.code_order)[src].reshape(groups * nr, nb, BL)
        if self.neon:
            col_bytes = (u[..., :16] | u[..., 16:] << 4) ^ 0x88
            scale = scale * np.float32(0.0625)
        else:
            col_bytes = u[..., 0::2] | u[..., 1::2] << 4
        data = col_bytes.reshape(groups, nr, nb, 16 // chunk, chunk).transpose(0, 2, 3, 1, 4)
        params = np.stack([zero[src], scale[src]]).reshape(2, groups, nr, nb).transpose(1, 3, 0, 2)
        blocks = np.concatenate(
            [data.reshape(groups, nb, -1).astype(np.uint8), _bytes(params.reshape(groups, nb, -1))], axis=-1
        )
        pad_bias = np.zeros((groups, nr), np.float32)
        if bias is not None:
            pad_bias.reshape(-1)[:] = np.where(self.neon | (np.arange(groups * nr) < n), bias[src], 0)
        return np.concatenate([blocks.reshape(groups, -1), _bytes(pad_bias)], axis=1).reshape(-1)

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        codes, scale, zero, bias = self._inputs(n, k, rhs, scale, zero, bias)
        has_bias = bias is not None
        bias = bias if has_bias else np.zeros(1, np.float32)
        high_first = self.code_order == "s0s1"
        return _jit.rhs_pack(codes, high_first, zero, scale, bias, has_bias, n, k, nr, self.chunk(kr, sr), self.neon)

    # --- reading a packed buffer back (the kernels' reference and GET_ROWS) -------------------------
    def unpack(
        self, rhs: np.ndarray, n: int, k: int, nr: int, kr: int, sr: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(w int32 [n, nb, 32], zero, scale f32 [n, nb], bias f32 [n]) as the kernels read them: w is u − 8
        (SME2) or 16·(u − 8) (NEON: the signed nibble in the high half of a byte); scale is as stored."""
        nb, groups, chunk = k // BL, -(-n // nr), self.chunk(kr, sr)
        stride = self.get_rhs_packed_stride(k, nr, kr, sr)
        grp = rhs[: groups * stride].reshape(groups, stride)
        blocks = grp[:, : nb * nr * RHS_BLOCK_BYTES].reshape(groups, nb, nr * RHS_BLOCK_BYTES)
        data = blocks[:, :, : 16 * nr].reshape(groups, nb, 16 // chunk, nr, chunk)
        col_bytes = data.transpose(0, 3, 1, 2, 4).reshape(groups * nr, nb, 16)[:n].astype(np.int32)
        if self.neon:
            w = np.concatenate([((col_bytes & 0x0F) << 4) ^ 0x80, (col_bytes & 0xF0) ^ 0x80], axis=-1) - 0x80
        else:
            w = np.stack([col_bytes & 0x0F, col_bytes >> 4], axis=-1).reshape(n, nb, BL) - 8
        fields = _f32_fields(blocks[:, :, 16 * nr :]).reshape(groups, nb, 2, nr).transpose(2, 0, 3, 1)
        zero, scale = (f.reshape(groups * nr, nb)[:n] for f in fields)
        bias = _f32_fields(grp[:, nb * nr * RHS_BLOCK_BYTES :]).reshape(-1)[:n]
        return w, zero, scale, bias

    def get_rows(
        self,
        rhs_packed: np.ndarray,
        rows: np.ndarray,
        n: int,
        k: int,
        nr: int,
        kr: int,
        sr: int,
        *,
        execution: str | None = None,
    ) -> np.ndarray:
        """GET_ROWS: dequantize weight rows (output columns) ``rows`` to float32 [len(rows), k] straight from the
        packed buffer: f32(f32(scale·w) + zero), i.e. scale·(u − 8) + zero with the product rounded first
        (exact for Q4_1 data: an fp16 d times a 4-bit integer), which equals GGML's u·d + m."""
        execution = check_execution(execution)
        buf, idx = self.get_rows_operands(rhs_packed, rows, n, k, nr, kr, sr)
        buf = writable(buf)
        if execution == "jit":
            return _jit.get_rows(buf, idx, k, nr, self.chunk(kr, sr), self.neon)
        w, zero, scale, _ = self.unpack(buf, n, k, nr, kr, sr)
        values = scale[idx, :, None] * w[idx].astype(np.float32) + zero[idx, :, None]
        return values.reshape(idx.size, k)


class RhsPackNxkQai4c32pQau4c32s0s1F32F32F32Neon(Qai4c32pRhsPacker):
    """NEON layout: column bytes t < 16 of a block are (u[t] | u[t+16] << 4) XOR 0x88, stored in chunks of kr/sr
    bytes per column (byte t at ((t // (kr/sr))·nr + col)·(kr/sr) + t % (kr/sr)); scale stored ×0.0625; padding
    columns copy column n−1, bias included."""

    name = "rhs_pack_nxk_qai4c32p_qau4c32s0s1_f32_f32_f32_neon"
    code_order = "s0s1"
    neon = True

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        if nr <= 0 or sr != 2 or kr not in (2, 4, 8, 16):
            raise KernelShapeError(f"{self.name}: needs sr=2 and kr in 2, 4, 8, 16 (got nr={nr}, kr={kr}, sr={sr})")


class Qai4c32ps1s0nrx4RhsPacker(Qai4c32pRhsPacker):
    """SME2 nrx4 layout: the uint16 at index (q·nr + col) of a block holds the unsigned codes u[4q..4q+3] in
    nibbles 0..3 (no XOR); scale stored as given; padding columns repeat column n−1 except for bias 0."""

    neon = False

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        if nr <= 0 or nr % 4 or kr != 8 or sr != 2:
            raise KernelShapeError(f"{self.name}: needs nr a multiple of 4, kr=8, sr=2 (got nr={nr}, kr={kr}, sr={sr})")


class RhsPackNxkQai4c32ps1s0nrx4Qau4c32s1s0F32F32F32Neon(Qai4c32ps1s0nrx4RhsPacker):
    name = "rhs_pack_nxk_qai4c32ps1s0nrx4_qau4c32s1s0_f32_f32_f32_neon"
    code_order = "s1s0"


class RhsPackNxkQai4c32ps1s0nrx4Qau4c32s0s1F32F32F32Neon(Qai4c32ps1s0nrx4RhsPacker):
    name = "rhs_pack_nxk_qai4c32ps1s0nrx4_qau4c32s0s1_f32_f32_f32_neon"
    code_order = "s0s1"


# --------------------------------------------------------------------------------------------- Q4_1 input


def q4_1_to_qai4c32(
    blocks: np.ndarray, n: int, k: int, order: CodeOrder = "s0s1"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGML Q4_1 rows (n·k/32 ``block_q4_1`` of 20 bytes) -> the RHS packers' inputs (codes, scale, zero).

    codes uint8 [n, k/2]: the unchanged 4-bit codes in sequential order (``order`` "s0s1": element 2i in the
    high nibble, for the NEON and ``…qau4c32s0s1`` packers; "s1s0": in the low nibble). scale = f32(d) and
    zero = f32(f32(m) + 8·f32(d)), both f32 [n, k/32], so that scale·(u − 8) + zero = u·d + m."""
    if n <= 0 or k <= 0 or k % BL:
        raise KernelShapeError(f"Q4_1: n={n}, k={k}: k must be a positive multiple of {BL}")
    d = f16_bits_to_f32(q4_1.d_bits(blocks, n, k))
    m = f16_bits_to_f32(q4_1.m_bits(blocks, n, k))
    zero = m + np.float32(8) * d
    return codes_in_order(q4_1.codes(blocks, n, k), order), d, zero.astype(np.float32)


def codes_in_order(u: np.ndarray, order: CodeOrder = "s0s1") -> np.ndarray:
    """Unsigned 4-bit codes u [n, k] -> uint8 [n, k/2] two per byte in the packer's ``order`` (see
    :func:`q4_1_to_qai4c32`)."""
    if order not in ("s0s1", "s1s0"):
        raise ValueError(f"order must be 's0s1' or 's1s0', got {order!r}")
    first, second = u[:, 0::2], u[:, 1::2]
    return ((first << 4 | second) if order == "s0s1" else (first | second << 4)).astype(np.uint8)


# --------------------------------------------------------------------------------------------- kernels


def matmul_reference(
    q: np.ndarray,
    row_sum: np.ndarray,
    recip: np.ndarray,
    w: np.ndarray,
    zero: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    first_block_fmul: bool,
) -> np.ndarray:
    """The recipe of the module docstring on unpacked operands: LHS q [m, nb, 32], row_sum/recip [m, nb]; RHS
    w [n, nb, 32], zero/scale [n, nb], bias [n]. Returns the unclamped float32 [m, n]."""
    a = np.einsum("mbt,nbt->bmn", q.astype(np.int64), w.astype(np.int64)).astype(np.float32)
    m, n = q.shape[0], w.shape[0]
    acc = np.zeros((m, n), np.float32)
    for b in range(q.shape[1]):
        s = scale[None, :, b] * recip[:, None, b]
        zero_term = (zero[None, :, b], row_sum[:, None, b])
        acc = zero_term[0] * zero_term[1] if first_block_fmul and b == 0 else fma_f32(*zero_term, acc)
        acc = fma_f32(s, a[b], acc)
    return acc + bias[None, :]


class Qsi8d32pQai4c32pKernel(MatmulKernel):
    """A qsi8d32p × qai4c32p kernel. Its ``alt_rhs_packers`` write the same bytes as ``rhs_packer`` from another
    input nibble order."""

    def _operands(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> tuple:
        g = self._geo()
        lhs = lhs[: self.lhs_packed_size(m, k)]
        rhs = rhs[: self.rhs_packer.get_rhs_packed_size(n, k, g.nr, g.kr, g.sr)]
        return g, writable(lhs), writable(rhs)

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g, lhs, rhs = self._operands(m, n, k, lhs, rhs)
        q, row_sum, recip = unpack_lhs(lhs, m, k, g.mr, g.kr // g.sr)
        w, zero, scale, bias = self.rhs_packer.unpack(rhs, n, k, g.nr, g.kr, g.sr)
        return matmul_reference(q, row_sum, recip, w, zero, scale, bias, self.flags.get("first_block_fmul", False))

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g, lhs, rhs = self._operands(m, n, k, lhs, rhs)
        if self.rhs_packer.neon:
            return NEON_COMPUTE(m, n, k, g.mr, g.nr, g.kr // g.sr, lhs, rhs)
        return SME2_COMPUTE(m, n, k, g.mr, g.nr, lhs, rhs, self.flags.get("first_block_fmul", False))


def get_rows(
    kernel: MatmulKernel, rhs_packed: np.ndarray, rows: np.ndarray, n: int, k: int, *, execution: str | None = None
) -> np.ndarray:
    """GET_ROWS from an RHS packed for ``kernel`` (bound to its SVL for SME2): float32 [len(rows), k]."""
    if not isinstance(kernel, Qsi8d32pQai4c32pKernel):
        raise KernelShapeError(f"{kernel.name} does not read a qai4c32p RHS")
    packed = kernel.as_packer_buffer(rhs_packed, "rhs")
    return kernel.rhs_packer.get_rows(packed, rows, n, k, kernel.nr, kernel.kr, kernel.sr, execution=execution)


LHS_PACKER = LhsQuantPackQsi8d32pscalef32F32Neon()
RHS_PACKER_NEON = RhsPackNxkQai4c32pQau4c32s0s1F32F32F32Neon()
RHS_PACKER_SME2_S1S0 = RhsPackNxkQai4c32ps1s0nrx4Qau4c32s1s0F32F32F32Neon()
RHS_PACKER_SME2_S0S1 = RhsPackNxkQai4c32ps1s0nrx4Qau4c32s0s1F32F32F32Neon()


def _neon_geometry(m_step: int, mr: int, kr: int) -> Callable[[int], Geometry]:
    return lambda vl: Geometry(m_step=m_step, n_step=4, mr=mr, nr=4, kr=kr, sr=2)


def _sme_geometry(rows_vl: bool) -> Callable[[int], Geometry]:
    return lambda vl: Geometry(
        m_step=vl if rows_vl else 1, n_step=4 * vl, mr=vl if rows_vl else 1, nr=4 * vl, kr=8, sr=2
    )


def _kernel(
    name: str, tier: str, kind: str, geometry: Callable[[int], Geometry], **kw: object
) -> Qsi8d32pQai4c32pKernel:
    return Qsi8d32pQai4c32pKernel(name, FAMILY_NAME, tier, kind, LHS_PACKER, geometry=geometry, **kw)


#: The SME2 kernels default to the s0s1 packer (the code order the NEON packer reads too, so one set of
#: codes serves every kernel); the s1s0 packer writes identical bytes and is accepted as an alternative.
_SME2 = {"rhs_packer": RHS_PACKER_SME2_S0S1, "alt_rhs_packers": (RHS_PACKER_SME2_S1S0,)}

KERNELS = [
    _kernel(
        "matmul_clamp_f32_qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa",
        "sme2",
        "gemm",
        _sme_geometry(True),
        flags={"first_block_fmul": True},
        **_SME2,
    ),
    _kernel("matmul_clamp_f32_qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot", "sme2", "gemv", _sme_geometry(False), **_SME2),
    _kernel(
        "matmul_clamp_f32_qsi8d32p4x8_qai4c32p4x8_8x4_neon_i8mm",
        "i8mm",
        "gemm",
        _neon_geometry(8, 4, 16),
        rhs_packer=RHS_PACKER_NEON,
    ),
    _kernel(
        "matmul_clamp_f32_qsi8d32p4x4_qai4c32p4x4_8x4_neon_dotprod",
        "dotprod",
        "gemm",
        _neon_geometry(8, 4, 8),
        rhs_packer=RHS_PACKER_NEON,
    ),
    _kernel(
        "matmul_clamp_f32_qsi8d32p1x8_qai4c32p4x8_1x4_neon_dotprod",
        "dotprod",
        "gemv",
        _neon_geometry(1, 1, 16),
        rhs_packer=RHS_PACKER_NEON,
    ),
    _kernel(
        "matmul_clamp_f32_qsi8d32p1x4_qai4c32p4x4_1x4_neon_dotprod",
        "dotprod",
        "gemv",
        _neon_geometry(1, 1, 8),
        rhs_packer=RHS_PACKER_NEON,
    ),
]

PACKERS = [LHS_PACKER, RHS_PACKER_NEON, RHS_PACKER_SME2_S1S0, RHS_PACKER_SME2_S0S1]
