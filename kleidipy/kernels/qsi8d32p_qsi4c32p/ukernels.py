"""The Q4_0 family ``qsi8d32p × qsi4c32p``: GGML Q4_0 weights packed verbatim, activations quantized to int8 per
32-block, as llama.cpp's KleidiAI backend runs Q4_0 models.

This module owns the family's packers (three RHS layouts, three LHS quantize+pack routines), its nine matmul
kernels (SME2 / SME1 / I8MM / DotProd, GEMM and GEMV) and GET_ROWS (dequantizing selected output channels
straight from a packed RHS, as llama.cpp does for token embeddings). Layouts: spec §4.1–4.4 and the golden
README; arithmetic: spec §5.2 (see ``jit.py`` beside this module for the recipe in one paragraph).

The reference execution states each layout as reshapes/transposes of the logical arrays (pack) and their
inverse (unpack, which is how the reference kernels read packed bytes); the jit execution is the numba code.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kleidipy.core.buffers import check_execution, check_finite
from kleidipy.core.matmul import Geometry, MatmulKernel
from kleidipy.core.numerics import f16_bits_to_f32, f32_to_f16_bits, fma_f32, round_away, round_even
from kleidipy.core.packers import LhsPacker, RhsPacker
from kleidipy.core.vnni import HAS_AVX512_VNNI
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError
from kleidipy.formats import q4_0
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit, neon, sme, sme2, vnni, vnni_neon, vnni_s4s0
from kleidipy.kernels.qsi8d32p_qsi4c32p.vnni_pack import lhs_quant_pack_qsi8d32p as vnni_lhs_pack

FAMILY_NAME = "qsi8d32p_qsi4c32p"
BL = 32
#: bytes of one GGML block_q4_0 (fp16 d + 16 bytes of codes) — also the packed bytes per block and column.
Q4_0_BLOCK_BYTES = 18


# --------------------------------------------------------------------------------------------- helpers


def _fp16_le_bytes(bits: np.ndarray) -> np.ndarray:
    """Little-endian byte pairs of uint16 values: shape (..., n) -> (..., 2n)."""
    arr = np.ascontiguousarray(bits, dtype="<u2")
    return arr.view(np.uint8).reshape(*arr.shape[:-1], 2 * arr.shape[-1])


def _fp16_from_le_bytes(raw: np.ndarray) -> np.ndarray:
    """uint16 values of little-endian byte pairs: shape (..., 2n) -> (..., n)."""
    return np.ascontiguousarray(raw).view("<u2").astype(np.uint16)


def _frozen(arr: np.ndarray) -> np.ndarray:
    """A read-only contiguous view: the jit functions then see one array type (one numba compilation) whether
    the caller's buffer is writable or not (golden files are read-only)."""
    view = np.ascontiguousarray(arr).view(np.ndarray)
    view.flags.writeable = False
    return view


def _sext4(nibbles: np.ndarray) -> np.ndarray:
    """Two's-complement values of 4-bit fields."""
    return ((nibbles.astype(np.int8) ^ 8) - 8).astype(np.int8)


def q4_0_blocks(rhs: np.ndarray, n: int, k: int, who: str) -> np.ndarray:
    """GGML Q4_0 data for n rows of k values as uint8 [n, k/32, 18] (accepts that shape or any flat buffer)."""
    arr = np.asarray(rhs)
    if arr.dtype != np.uint8:
        raise DTypeError(f"{who}: rhs must be uint8 GGML Q4_0 blocks, got {arr.dtype}")
    nb = k // BL
    if arr.ndim == 3 and arr.shape[1:] != (nb, Q4_0_BLOCK_BYTES):
        raise KernelShapeError(f"{who}: rhs blocks have shape {arr.shape}, k={k} needs [n, {nb}, 18]")
    need = n * nb * Q4_0_BLOCK_BYTES
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.size < need:
        raise BufferSizeError(f"{who}: rhs holds {flat.size} bytes, {n} rows of {nb} Q4_0 blocks need {need}")
    blocks = flat[:need].reshape(n, nb, Q4_0_BLOCK_BYTES)
    check_finite(blocks[:, :, :2].copy().view(np.float16), who, "Q4_0 block scale d")
    return blocks


def quantize_qsi8d32(lhs: np.ndarray, ties_even: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-32-block symmetric int8 quantization of float32 rows [m, k] (spec §4.3).

    Returns q int8 [m, k] and the fp16 bits of the block scales [m, k/32]: amax = max|x|, sf = f32(amax/127),
    inv = f32(1/sf) (0 when sf is 0), q = round(f32(x·inv)) — roundf, or ties-to-even (``vcvtnq``) — and the
    stored scale is fp16(sf) (RNE), while quantization used the float32 inv.
    """
    m, k = lhs.shape
    x = lhs.reshape(m, k // BL, BL)
    amax = np.abs(x).max(axis=2)
    sf = (amax / np.float32(127)).astype(np.float32)
    inv = np.zeros_like(sf)
    np.divide(np.float32(1), sf, out=inv, where=sf != 0)
    scaled = (x * inv[:, :, None]).astype(np.float32)
    q = (round_even(scaled) if ties_even else round_away(scaled)).astype(np.int8)
    return q.reshape(m, k), f32_to_f16_bits(sf)


# --------------------------------------------------------------------------------------------- LHS


class _Qsi8d32pLhsPacker(LhsPacker):
    """Common part of the qsi8d32p LHS packers: size, argument rules, quantization, jit call."""

    blocked = True
    #: jit layout id (LHS_QSI8D32P or LHS_QSI8D32P_NEON)
    layout: int = jit.LHS_QSI8D32P
    ties_even: bool = False

    def get_lhs_packed_stride(self, k: int, mr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return mr * (k // BL) * (BL + 2)

    def chunk(self, kr: int, sr: int) -> int:
        """K values per row per interleaved chunk (kbl)."""
        return kr // sr

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if mr < 1 or kr < 1 or sr < 1 or kr % sr:
            raise KernelShapeError(f"{self.name}: mr={mr}, kr={kr}, sr={sr} must be positive with sr dividing kr")
        if BL % self.chunk(kr, sr):
            raise KernelShapeError(f"{self.name}: a chunk of {self.chunk(kr, sr)} K values does not divide bl=32")

    def _reference(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        q, scale_bits = quantize_qsi8d32(np.asarray(lhs, dtype=np.float32), self.ties_even)
        m, k = q.shape
        groups = -(-(row_offset + m) // mr)
        q_all = np.zeros((groups * mr, k), np.int8)
        s_all = np.zeros((groups * mr, k // BL), np.uint16)
        q_all[row_offset : row_offset + m] = q
        s_all[row_offset : row_offset + m] = scale_bits
        return self._place(q_all, s_all, mr, self.chunk(kr, sr))

    def _jit(self, lhs: np.ndarray, mr: int, kr: int, sr: int, bl: int | None, row_offset: int) -> np.ndarray:
        rows = _frozen(np.asarray(lhs, dtype=np.float32))
        kbl = self.chunk(kr, sr)  # the vectorised packer (the same bytes as jit.lhs_quant_pack_qsi8d32p)
        return vnni_lhs_pack(rows, mr, kbl, row_offset, self.layout, self.ties_even)

    def _place(self, q: np.ndarray, scale_bits: np.ndarray, mr: int, kbl: int) -> np.ndarray:
        """Packed bytes of whole groups: q int8 [groups·mr, k], scale bits [groups·mr, k/32]."""
        raise NotImplementedError

    def unpack(self, packed: np.ndarray, m: int, k: int, mr: int, kr: int, sr: int) -> tuple[np.ndarray, np.ndarray]:
        """int8 values [m, k] and float32 block scales [m, k/32] of a packed LHS (how the kernels read it)."""
        raise NotImplementedError


class LhsQuantPackQsi8d32pF32(_Qsi8d32pLhsPacker):
    """``kai_run_lhs_quant_pack_qsi8d32p_f32`` (§4.3): per block, mr fp16 scales then mr × 32 int8 in kr/sr chunks.

    Rounds ties away from zero (roundf). Used by every NEON kernel of the family.
    """

    name = "lhs_quant_pack_qsi8d32p_f32"

    def _place(self, q: np.ndarray, scale_bits: np.ndarray, mr: int, kbl: int) -> np.ndarray:
        rows, k = q.shape
        groups, nb = rows // mr, k // BL
        data = q.view(np.uint8).reshape(groups, mr, nb, BL // kbl, kbl).transpose(0, 2, 3, 1, 4)
        scales = _fp16_le_bytes(scale_bits.reshape(groups, mr, nb).transpose(0, 2, 1))
        return np.concatenate([scales, data.reshape(groups, nb, mr * BL)], axis=2).reshape(-1)

    def unpack(self, packed: np.ndarray, m: int, k: int, mr: int, kr: int, sr: int) -> tuple[np.ndarray, np.ndarray]:
        nb, kbl = k // BL, self.chunk(kr, sr)
        groups = -(-m // mr)
        blocks = packed[: groups * self.get_lhs_packed_stride(k, mr, kr, sr)].reshape(groups, nb, mr * (BL + 2))
        scales = _fp16_from_le_bytes(blocks[:, :, : 2 * mr]).transpose(0, 2, 1).reshape(groups * mr, nb)
        data = blocks[:, :, 2 * mr :].reshape(groups, nb, BL // kbl, mr, kbl).transpose(0, 3, 1, 2, 4)
        q = data.reshape(groups * mr, k).view(np.int8)
        return q[:m], f16_bits_to_f32(scales[:m])


class LhsQuantPackQsi8d32p4x8sbF32Neon(LhsQuantPackQsi8d32pF32):
    """``kai_run_lhs_quant_pack_qsi8d32p4x8sb_f32_neon``: the §4.3 layout for mr=4, kr=16, sr=2 only, rounding
    ties to even (``vcvtnq_s32_f32``). llama.cpp pairs it with the I8MM GEMM; its bytes are layout-compatible with
    ``lhs_quant_pack_qsi8d32p_f32`` (they differ only on exact .5 ties), so the I8MM kernels accept both.

    KleidiAI's 4-row fast path reads rows 1–3 at +k floats (dense rows) and misplaces rows when m_idx_start is
    not a multiple of 4; here rows honour ``lhs_stride`` and ``m_idx_start`` as in the generic packer.
    """

    name = "lhs_quant_pack_qsi8d32p4x8sb_f32_neon"
    ties_even = True

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if (mr, kr, sr) != (4, 16, 2):
            raise KernelShapeError(f"{self.name}: takes only mr=4, kr=16, sr=2 (got {mr}, {kr}, {sr})")


class LhsQuantPackQsi8d32pF32Neon(_Qsi8d32pLhsPacker):
    """``kai_run_lhs_quant_pack_qsi8d32p_f32_neon`` (§4.4, SME kernels): all int8 in chunks of kr = 4 values per
    row, then the fp16 scales block-major. Rounds ties away from zero.

    KleidiAI ignores ``m_idx_start`` and ``lhs_stride`` (it reads dense rows into an mr-aligned group); here the
    rows given are the rows packed, at row position ``m_idx_start % mr``, like every other LHS packer.
    """

    name = "lhs_quant_pack_qsi8d32p_f32_neon"
    layout = jit.LHS_QSI8D32P_NEON

    def chunk(self, kr: int, sr: int) -> int:
        return kr

    def check_args(self, m: int, k: int, mr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(m, k, mr, kr, sr, bl)
        if kr != 4:
            raise KernelShapeError(f"{self.name}: takes only kr=4 (got {kr})")

    def _place(self, q: np.ndarray, scale_bits: np.ndarray, mr: int, kbl: int) -> np.ndarray:
        rows, k = q.shape
        groups, nb = rows // mr, k // BL
        data = q.view(np.uint8).reshape(groups, mr, k // kbl, kbl).transpose(0, 2, 1, 3).reshape(groups, mr * k)
        scales = _fp16_le_bytes(scale_bits.reshape(groups, mr, nb).transpose(0, 2, 1)).reshape(groups, 2 * mr * nb)
        return np.concatenate([data, scales], axis=1).reshape(-1)

    def unpack(self, packed: np.ndarray, m: int, k: int, mr: int, kr: int, sr: int) -> tuple[np.ndarray, np.ndarray]:
        nb, kbl = k // BL, self.chunk(kr, sr)
        groups = -(-m // mr)
        group_bytes = packed[: groups * self.get_lhs_packed_stride(k, mr, kr, sr)].reshape(groups, mr * (k + 2 * nb))
        data = group_bytes[:, : mr * k].reshape(groups, k // kbl, mr, kbl).transpose(0, 2, 1, 3)
        q = data.reshape(groups * mr, k).view(np.int8)
        scales = _fp16_from_le_bytes(group_bytes[:, mr * k :]).reshape(groups, nb, mr).transpose(0, 2, 1)
        return q[:m], f16_bits_to_f32(scales.reshape(groups * mr, nb)[:m])


# --------------------------------------------------------------------------------------------- RHS


class _Qsi4c32pRhsPacker(RhsPacker):
    """Common part of the Q4_0 RHS packers: GGML Q4_0 blocks in, nr·(k/32)·18 bytes per group of nr rows.

    KleidiAI's params ``{lhs_zero_point=1, rhs_zero_point=8}`` are fixed (Q4_0 codes are unsigned with zero
    point 8); bias must be absent (NULL), and there are no scale/zero inputs: the scales are the blocks' d.
    """

    blocked = True
    inputs = ()
    #: jit layout id (RHS_SCALEF16 / RHS_S1S0 / RHS_S4S0)
    layout: int = jit.RHS_SCALEF16
    #: what the kernels' integer block dot is multiplied by (16 when the stored scale is d/16)
    dot_multiplier: int = 1
    #: whether GET_ROWS can read GGML's exact (u − 8)·d from this layout
    has_get_rows: bool = True
    #: the only (kr, sr) the packer takes, or None when kr is free
    fixed_kr_sr: tuple[int, int] | None = (4, 2)

    def get_rhs_packed_stride(self, k: int, nr: int, kr: int, sr: int, bl: int | None = None) -> int:
        return nr * (k // BL) * Q4_0_BLOCK_BYTES

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        if nr < 1:
            raise KernelShapeError(f"{self.name}: nr={nr} must be positive")
        if self.fixed_kr_sr is not None and (kr, sr) != self.fixed_kr_sr:
            raise KernelShapeError(f"{self.name}: takes only kr={self.fixed_kr_sr[0]}, sr={self.fixed_kr_sr[1]}")

    def check_inputs(self, given: dict[str, np.ndarray | None]) -> None:
        """Q4_0 blocks (uint8 [n, k/32, 18] or flat) are the only input: scale, zero and bias must be None."""
        for name, value in given.items():
            if value is not None:
                raise KernelShapeError(f"{self.name}: takes no '{name}' input (Q4_0 scales are in the blocks)")

    def _reference(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        return self._pack(q4_0_blocks(rhs, n, k, self.name), nr, kr)

    def _jit(self, n, k, nr, kr, sr, bl, rhs, *, scale, zero, bias) -> np.ndarray:
        return jit.rhs_pack(_frozen(q4_0_blocks(rhs, n, k, self.name)), nr, kr, self.layout)

    def _pack(self, blocks: np.ndarray, nr: int, kr: int) -> np.ndarray:
        raise NotImplementedError

    def unpack(self, packed: np.ndarray, n: int, k: int, nr: int, kr: int) -> tuple[np.ndarray, np.ndarray]:
        """Signed int4 values w [n, k] (int8) and float32 stored scales [n, k/32] (how the kernels read it)."""
        raise NotImplementedError

    # --- GET_ROWS ---------------------------------------------------------------------------------
    def get_rows(
        self,
        rhs_packed: np.ndarray,
        rows: np.ndarray,
        n: int,
        k: int,
        nr: int,
        kr: int,
        *,
        execution: str | None = None,
    ) -> np.ndarray:
        """GET_ROWS: float32 [len(rows), k] of output channels ``rows``, dequantized from the packed RHS.

        The value is GGML's Q4_0 dequantization (u − 8)·d, read from this packer's layout (llama.cpp's
        ``dequantize_row_qsi4c32ps1s0scalef16`` / ``…qsi4c32pscalef16`` for embeddings in a KleidiAI buffer).
        """
        execution = check_execution(execution)
        if not self.has_get_rows:
            raise KernelShapeError(f"{self.name}: GET_ROWS is not supported on this layout (its scales are d/16)")
        sr = self.fixed_kr_sr[1] if self.fixed_kr_sr else 2
        buf, idx = self.get_rows_operands(rhs_packed, rows, n, k, nr, kr, sr)
        if execution == "jit":
            return jit.get_rows(_frozen(buf), _frozen(idx), k, nr, kr, self.layout)
        w, scale = self.unpack(buf, n, k, nr, kr)
        return (w[idx].reshape(idx.size, k // BL, BL) * scale[idx][:, :, None]).astype(np.float32).reshape(idx.size, k)


class RhsPackNxkQsi4c32pscalef16Qsu4c32s16s0(_Qsi4c32pRhsPacker):
    """``kai_run_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0`` (§4.2, NEON kernels).

    Per group and block: nr fp16 d, then 32/kr segments of nr × kr/2 bytes, row r's bytes of segment s being the
    Q4_0 qs bytes [s·kr/2, (s+1)·kr/2) XOR 0x88 (signed nibbles of element j low, j+16 high). Requires sr = 2
    and an even kr dividing 32. Padding rows copy row n−1.
    """

    name = "rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0"
    layout = jit.RHS_SCALEF16
    fixed_kr_sr = None

    def check_args(self, n: int, k: int, nr: int, kr: int, sr: int, bl: int | None) -> None:
        super().check_args(n, k, nr, kr, sr, bl)
        if sr != 2 or kr not in (2, 4, 8, 16, 32):
            raise KernelShapeError(f"{self.name}: needs sr=2 and kr in 2, 4, 8, 16, 32 (got kr={kr}, sr={sr})")

    def _pack(self, blocks: np.ndarray, nr: int, kr: int) -> np.ndarray:
        n, nb, _ = blocks.shape
        groups = -(-n // nr)
        padded = blocks[np.minimum(np.arange(groups * nr), n - 1)]
        half = kr // 2
        qs = (padded[:, :, 2:] ^ 0x88).reshape(groups, nr, nb, BL // kr, half).transpose(0, 2, 3, 1, 4)
        scales = padded[:, :, :2].reshape(groups, nr, nb, 2).transpose(0, 2, 1, 3).reshape(groups, nb, 2 * nr)
        return np.concatenate([scales, qs.reshape(groups, nb, nr * 16)], axis=2).reshape(-1)

    def unpack(self, packed: np.ndarray, n: int, k: int, nr: int, kr: int) -> tuple[np.ndarray, np.ndarray]:
        nb, half = k // BL, kr // 2
        groups = -(-n // nr)
        blocks = packed[: groups * nr * nb * Q4_0_BLOCK_BYTES].reshape(groups, nb, nr * Q4_0_BLOCK_BYTES)
        scales = _fp16_from_le_bytes(blocks[:, :, : 2 * nr]).transpose(0, 2, 1).reshape(groups * nr, nb)
        qs = blocks[:, :, 2 * nr :].reshape(groups, nb, BL // kr, nr, half).transpose(0, 3, 1, 2, 4)
        qs = qs.reshape(groups * nr, nb, 16)
        w = np.concatenate([_sext4(qs & 0x0F), _sext4(qs >> 4)], axis=2).reshape(groups * nr, k)
        return w[:n], f16_bits_to_f32(scales[:n])


class _SmeQsi4c32pRhsPacker(_Qsi4c32pRhsPacker):
    """The SME layouts (kr=4, sr=2): per group of nr rows, the data first, a ``unit``-byte value per (K unit U of
    the row's codes, row r) at (U·nr + r)·unit, then the stored fp16 scales block-major. Padding rows are 0.
    Subclasses give a row's units from its codes and back, and the stored scale."""

    #: bytes of one row's value at each data position
    unit: int

    def _units(self, codes: np.ndarray) -> np.ndarray:
        """uint8 [rows, k / (2·unit), unit] of unsigned codes u [rows, k]."""
        raise NotImplementedError

    def _values(self, units: np.ndarray) -> np.ndarray:
        """Signed int4 values w = u − 8, int8 [rows, k], of units [rows, k / (2·unit), unit]."""
        raise NotImplementedError

    def _scale_bits(self, d_bits: np.ndarray) -> np.ndarray:
        """The stored fp16 scales of the blocks' d (fp16 bits)."""
        return d_bits

    def _pack(self, blocks: np.ndarray, nr: int, kr: int) -> np.ndarray:
        n, nb, _ = blocks.shape
        groups = -(-n // nr)
        units = np.zeros((groups * nr, nb * 16 // self.unit, self.unit), np.uint8)
        scales = np.zeros((groups * nr, nb), np.uint16)
        units[:n] = self._units(q4_0.codes(blocks))
        scales[:n] = self._scale_bits(q4_0.d_bits(blocks))
        data = units.reshape(groups, nr, -1, self.unit).transpose(0, 2, 1, 3).reshape(groups, -1)
        scale_bytes = _fp16_le_bytes(scales.reshape(groups, nr, nb).transpose(0, 2, 1)).reshape(groups, -1)
        return np.concatenate([data, scale_bytes], axis=1).reshape(-1)

    def unpack(self, packed: np.ndarray, n: int, k: int, nr: int, kr: int) -> tuple[np.ndarray, np.ndarray]:
        nb = k // BL
        groups = -(-n // nr)
        group_bytes = packed[: groups * nr * nb * Q4_0_BLOCK_BYTES].reshape(groups, nr * nb * Q4_0_BLOCK_BYTES)
        units = group_bytes[:, : nr * nb * 16].reshape(groups, -1, nr, self.unit).transpose(0, 2, 1, 3)
        scales = _fp16_from_le_bytes(group_bytes[:, nr * nb * 16 :]).reshape(groups, nb, nr).transpose(0, 2, 1)
        w = self._values(units.reshape(groups * nr, -1, self.unit)[:n])
        return w, f16_bits_to_f32(scales.reshape(groups * nr, nb)[:n])


class RhsPackNxkQsi4c32ps1s0scalef16Qsu4c32s16s0Neon(_SmeQsi4c32pRhsPacker):
    """``kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon`` (§4.1, SME2 kernels; kr=4, sr=2).

    Data first: a uint16 per (4-value K group G, row r) at index G·nr + r holding the unsigned codes of
    k = 4G..4G+3 in nibbles 0..3 (no XOR: the kernels' LUT maps u to u − 8); then fp16 d block-major.
    Padding rows are 0.
    """

    name = "rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon"
    layout = jit.RHS_S1S0
    unit = 2

    def _units(self, codes: np.ndarray) -> np.ndarray:
        quads = codes.astype(np.uint16).reshape(codes.shape[0], -1, 4)
        words = quads[..., 0] | quads[..., 1] << 4 | quads[..., 2] << 8 | quads[..., 3] << 12
        return _fp16_le_bytes(words).reshape(codes.shape[0], -1, 2)

    def _values(self, units: np.ndarray) -> np.ndarray:
        words = _fp16_from_le_bytes(units.reshape(units.shape[0], -1))
        codes = np.stack([(words >> (4 * e)) & 0x0F for e in range(4)], axis=-1).reshape(units.shape[0], -1)
        return (codes.astype(np.int8) - 8).astype(np.int8)


class RhsPackNxkQsi4c32ps4s0sf16Qsu4c32s16s0Neon(_SmeQsi4c32pRhsPacker):
    """``kai_run_rhs_pack_nxk_qsi4c32ps4s0sf16_qsu4c32s16s0_neon`` (SME1 kernels; kr=4, sr=2; golden README).

    Data first: a uint32 per (8-value packet p of block b, row r) at index (b·4 + p)·nr + r; its byte j holds the
    signed nibbles (u XOR 8) of k = 8p+j (low) and 8p+j+4 (high). Then the scales block-major, stored as
    fp16(f32(d)/16): the kernels extract nibbles as 16·w. Padding rows are 0.
    """

    name = "rhs_pack_nxk_qsi4c32ps4s0sf16_qsu4c32s16s0_neon"
    layout = jit.RHS_S4S0
    dot_multiplier = 16
    has_get_rows = False
    unit = 4

    def _units(self, codes: np.ndarray) -> np.ndarray:
        packets = codes.reshape(codes.shape[0], -1, 2, 4)  # [row, packet, low/high half, j]
        return (packets[:, :, 0] | packets[:, :, 1] << 4) ^ 0x88

    def _values(self, units: np.ndarray) -> np.ndarray:
        halves = units[:, :, None, :]
        return np.concatenate([_sext4(halves & 0x0F), _sext4(halves >> 4)], axis=2).reshape(units.shape[0], -1)

    def _scale_bits(self, d_bits: np.ndarray) -> np.ndarray:
        return f32_to_f16_bits(f16_bits_to_f32(d_bits) / np.float32(16))


LHS_QSI8D32P_F32 = LhsQuantPackQsi8d32pF32()
LHS_QSI8D32P4X8SB_F32_NEON = LhsQuantPackQsi8d32p4x8sbF32Neon()
LHS_QSI8D32P_F32_NEON = LhsQuantPackQsi8d32pF32Neon()
RHS_QSI4C32PSCALEF16 = RhsPackNxkQsi4c32pscalef16Qsu4c32s16s0()
RHS_QSI4C32PS1S0SCALEF16_NEON = RhsPackNxkQsi4c32ps1s0scalef16Qsu4c32s16s0Neon()
RHS_QSI4C32PS4S0SF16_NEON = RhsPackNxkQsi4c32ps4s0sf16Qsu4c32s16s0Neon()

PACKERS = [
    LHS_QSI8D32P_F32,
    LHS_QSI8D32P4X8SB_F32_NEON,
    LHS_QSI8D32P_F32_NEON,
    RHS_QSI4C32PSCALEF16,
    RHS_QSI4C32PS1S0SCALEF16_NEON,
    RHS_QSI4C32PS4S0SF16_NEON,
]


# --------------------------------------------------------------------------------------------- kernels


def block_scaled_sum(
    q: np.ndarray, lhs_scale: np.ndarray, w: np.ndarray, rhs_scale: np.ndarray, dot_multiplier: int, fmul: bool
) -> np.ndarray:
    """The §5.2 recipe on unpacked operands: q int8 [m, k], w int8 [n, k], scales float32 [m|n, k/32].

    Per block b: a = f32(dot_multiplier · Σ q·w) (exact int32), S = f32(s_L·s_R) + 0, acc = fma(a, S, acc), from
    acc = +0, or −0 for the MOPA kernels (first block FMUL).
    """
    m, k = q.shape
    n, nb = w.shape[0], k // BL
    dots = np.einsum(
        "ibt,jbt->ijb", q.reshape(m, nb, BL).astype(np.int32), w.reshape(n, nb, BL).astype(np.int32), dtype=np.int32
    )
    acc = np.full((m, n), -0.0 if fmul else 0.0, dtype=np.float32)
    for b in range(nb):
        scale = (lhs_scale[:, b, None] * rhs_scale[None, :, b]).astype(np.float32) + np.float32(0)
        acc = fma_f32((dots[:, :, b] * dot_multiplier).astype(np.float32), scale, acc)
    return acc


#: the family's tile chain, one per RHS layout, for its jit and its compiled-plan routines (the same bits every
#: way). SME2 ``(m, n, k, mr, nr, lhs, rhs, first_block_fmul, dst, ld)``, the result clamped to ±FLT_MAX into the
#: flat rows dst (row i at dst[i·ld :]): the native SME2 tiles (kernels bound to the host's SVL), else the VNNI
#: tiles (their portable IR without AVX-512 VNNI)
SME2_COMPUTE = sme2.compute_into if sme2.AVAILABLE else vnni.compute_into_host
#: SME1 (s4s0 codes) ``(m, n, k, mr, nr, lhs, rhs, first_block_fmul) -> f32 [m, n]``: the native SME tiles (bound to
#: the host's SVL), the AVX-512 VNNI tiles, else the portable jit
SME_COMPUTE = (
    sme.compute_s4s0
    if sme.AVAILABLE
    else vnni_s4s0.compute_s4s0
    if HAS_AVX512_VNNI
    else jit.matmul_qsi8d32p_qsi4c32ps4s0sf16
)
#: NEON (dotprod / i8mm) ``(m, n, k, mr, nr, kr, sr, lhs, rhs) -> f32 [m, n]``: the native sdot/smmla tiles on
#: aarch64 with DotProd, the AVX-512 VNNI tiles, else the portable jit
NEON_COMPUTE = (
    neon.compute
    if neon.AVAILABLE
    else vnni_neon.compute_neon_vnni512
    if HAS_AVX512_VNNI
    else jit.matmul_qsi8d32p_qsi4c32pscalef16
)


class Qsi8d32pQsi4c32pKernel(MatmulKernel):
    """A matmul kernel of the family. ``flags["first_block_fmul"]`` marks the MOPA kernels (−0.0 quirk);
    ``alt_lhs_packers`` lists LHS packers whose buffers share the kernel's layout (accepted by ``run``)."""

    def _reference(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g = self._geo()
        q, lhs_scale = self.lhs_packer.unpack(lhs, m, k, g.mr, g.kr, g.sr)
        w, rhs_scale = self.rhs_packer.unpack(rhs, n, k, g.nr, g.kr)
        fmul = self.flags.get("first_block_fmul", False)
        return block_scaled_sum(q, lhs_scale, w, rhs_scale, self.rhs_packer.dot_multiplier, fmul)

    def _jit(self, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        g = self._geo()
        lhs, rhs = _frozen(lhs), _frozen(rhs)
        fmul = self.flags.get("first_block_fmul", False)
        if self.tier == "sme2":
            out = np.empty((m, n), np.float32)
            SME2_COMPUTE(m, n, k, g.mr, g.nr, lhs, rhs, fmul, out.reshape(-1), n)
            return out
        if self.is_sme:
            return SME_COMPUTE(m, n, k, g.mr, g.nr, lhs, rhs, fmul)
        return NEON_COMPUTE(m, n, k, g.mr, g.nr, g.kr, g.sr, lhs, rhs)


def _sme_gemm(vl: int) -> Geometry:
    return Geometry(m_step=vl, n_step=4 * vl, mr=vl, nr=4 * vl, kr=4, sr=2)


def _sme_gemv(vl: int) -> Geometry:
    return Geometry(m_step=1, n_step=4 * vl, mr=1, nr=4 * vl, kr=4, sr=2)


def _neon(m_step: int, mr: int, kr: int) -> Callable[[int], Geometry]:
    def geometry(vl: int) -> Geometry:
        return Geometry(m_step=m_step, n_step=4, mr=mr, nr=4, kr=kr, sr=2)

    return geometry


def _kernel(
    name: str,
    tier: str,
    kind: str,
    geometry: Callable[[int], Geometry],
    first_block_fmul: bool = False,
    lhs_packers: tuple[LhsPacker, ...] = (LHS_QSI8D32P_F32,),
) -> Qsi8d32pQsi4c32pKernel:
    """A kernel with the packers of its tier: SME2 / SME1 RHS layouts with the SME LHS, or the NEON pair (the NEON
    kernels pack with lhs_packers[0] and accept the other packers' buffers too)."""
    if tier in ("sme", "sme2"):
        lhs_packers = (LHS_QSI8D32P_F32_NEON,)
        rhs = RHS_QSI4C32PS1S0SCALEF16_NEON if tier == "sme2" else RHS_QSI4C32PS4S0SF16_NEON
    else:
        rhs = RHS_QSI4C32PSCALEF16
    flags = {"first_block_fmul": True} if first_block_fmul else {}
    return Qsi8d32pQsi4c32pKernel(
        name, FAMILY_NAME, tier, kind, lhs_packers[0], rhs, geometry, flags=flags, alt_lhs_packers=lhs_packers[1:]
    )


#: the I8MM GEMMs' LHS packers, both of one layout: the 16x4 one packs as llama.cpp pairs them (4x8sb, ties to even:
#: bit for bit with llama.cpp), the 8x4x32 one with the generic packer (ties away); each accepts the other's buffers
_SB, _GENERIC = (LHS_QSI8D32P4X8SB_F32_NEON, LHS_QSI8D32P_F32), (LHS_QSI8D32P_F32, LHS_QSI8D32P4X8SB_F32_NEON)

KERNELS = [
    _kernel("matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa", "sme2", "gemm", _sme_gemm, True),
    _kernel("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot", "sme2", "gemv", _sme_gemv),
    _kernel("matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme_mopa", "sme", "gemm", _sme_gemm, True),
    _kernel("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme_dot", "sme", "gemv", _sme_gemv),
    _kernel("matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", "i8mm", "gemm", _neon(16, 4, 16), False, _SB),
    _kernel(
        "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_8x4x32_neon_i8mm", "i8mm", "gemm", _neon(8, 4, 16), False, _GENERIC
    ),
    _kernel("matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod", "dotprod", "gemm", _neon(16, 4, 8)),
    _kernel("matmul_clamp_f32_qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod", "dotprod", "gemv", _neon(1, 1, 16)),
    _kernel("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod", "dotprod", "gemv", _neon(1, 1, 8)),
]
