"""The Q4_0 RHS packers (``rhs_pack_nxk_qsi4c32p*_qsu4c32s16s0*``): GGML Q4_0 blocks packed for the NEON, SME2 and
SME1 kernels. Shared by the families that read them (``qsi8d32p_qsi4c32p``: int8 LHS; ``f16p_qsi4c32p``: F16 LHS), as
KleidiAI keeps them in ``kai/ukernels/matmul/pack/``; their numba code is :mod:`.qsi4c32p_jit`.

The reference execution states each layout as reshapes/transposes of the blocks (pack) and their inverse (unpack,
which is how the reference kernels read packed bytes); GET_ROWS dequantizes output channels from a packed buffer.
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.buffers import check_execution, check_finite
from kleidipy.core.numerics import f16_bits_to_f32, f32_to_f16_bits
from kleidipy.core.packers import RhsPacker
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError
from kleidipy.formats import q4_0
from kleidipy.kernels.pack import qsi4c32p_jit as jit

BL = 32
#: bytes of one GGML block_q4_0 (fp16 d + 16 bytes of codes) — also the packed bytes per block and column.
Q4_0_BLOCK_BYTES = 18


def fp16_le_bytes(bits: np.ndarray) -> np.ndarray:
    """Little-endian byte pairs of uint16 values: shape (..., n) -> (..., 2n)."""
    arr = np.ascontiguousarray(bits, dtype="<u2")
    return arr.view(np.uint8).reshape(*arr.shape[:-1], 2 * arr.shape[-1])


def fp16_from_le_bytes(raw: np.ndarray) -> np.ndarray:
    """uint16 values of little-endian byte pairs: shape (..., 2n) -> (..., n)."""
    return np.ascontiguousarray(raw).view("<u2").astype(np.uint16)


def frozen(arr: np.ndarray) -> np.ndarray:
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
        return jit.rhs_pack(frozen(q4_0_blocks(rhs, n, k, self.name)), nr, kr, self.layout)

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
            return jit.get_rows(frozen(buf), frozen(idx), k, nr, kr, self.layout)
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
        scales = fp16_from_le_bytes(blocks[:, :, : 2 * nr]).transpose(0, 2, 1).reshape(groups * nr, nb)
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
        scale_bytes = fp16_le_bytes(scales.reshape(groups, nr, nb).transpose(0, 2, 1)).reshape(groups, -1)
        return np.concatenate([data, scale_bytes], axis=1).reshape(-1)

    def unpack(self, packed: np.ndarray, n: int, k: int, nr: int, kr: int) -> tuple[np.ndarray, np.ndarray]:
        nb = k // BL
        groups = -(-n // nr)
        group_bytes = packed[: groups * nr * nb * Q4_0_BLOCK_BYTES].reshape(groups, nr * nb * Q4_0_BLOCK_BYTES)
        units = group_bytes[:, : nr * nb * 16].reshape(groups, -1, nr, self.unit).transpose(0, 2, 1, 3)
        scales = fp16_from_le_bytes(group_bytes[:, nr * nb * 16 :]).reshape(groups, nb, nr).transpose(0, 2, 1)
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
        return fp16_le_bytes(words).reshape(codes.shape[0], -1, 2)

    def _values(self, units: np.ndarray) -> np.ndarray:
        words = fp16_from_le_bytes(units.reshape(units.shape[0], -1))
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


RHS_QSI4C32PSCALEF16 = RhsPackNxkQsi4c32pscalef16Qsu4c32s16s0()
RHS_QSI4C32PS1S0SCALEF16_NEON = RhsPackNxkQsi4c32ps1s0scalef16Qsu4c32s16s0Neon()
RHS_QSI4C32PS4S0SF16_NEON = RhsPackNxkQsi4c32ps4s0sf16Qsu4c32s16s0Neon()
