"""The block helpers the GGML format modules share: :class:`BlockFormat` (block views, fp16 fields, the chunked
quantize/dequantize loops over rows), nibbles and C rounding of codes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from kleidipy.core.buffers import check_finite
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError

#: Elements per block of Q4_0, Q4_1 and Q8_0 (QK4_0 = QK4_1 = QK8_0).
QK = 32
#: Elements handled per vectorised step when quantizing (keeps temporaries in cache).
_CHUNK_ELEMENTS = 1 << 18


def rows_f32(x: np.ndarray, block_size: int, who: str) -> np.ndarray:
    """Validate float32 rows [rows, k] for a quantizer: k a multiple of block_size, all values finite.

    ggml's reference quantizers are undefined for NaN/Inf (float->int conversion of NaN), so they are refused.
    """
    arr = np.asarray(x)
    if arr.dtype != np.float32:
        raise DTypeError(f"{who}: input must be float32, got {arr.dtype}")
    if arr.ndim != 2:
        raise KernelShapeError(f"{who}: input must be 2-D [rows, k], got shape {arr.shape}")
    if arr.shape[1] % block_size:
        raise KernelShapeError(f"{who}: k={arr.shape[1]} is not a multiple of the block size {block_size}")
    check_finite(arr, who, "input")
    return np.ascontiguousarray(arr)


def row_chunks(rows: int, k: int) -> Iterator[slice]:
    """Row ranges of about _CHUNK_ELEMENTS elements (at least one row), covering range(rows)."""
    step = max(1, _CHUNK_ELEMENTS // max(k, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def fp16_field(view: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian fp16 bit pattern at byte ``offset`` of every block: uint16 [rows, nb]."""
    return view[..., offset].astype(np.uint16) | (view[..., offset + 1].astype(np.uint16) << 8)


def store_fp16_field(view: np.ndarray, offset: int, bits: np.ndarray) -> None:
    view[..., offset] = bits & 0xFF
    view[..., offset + 1] = bits >> 8


def split_nibbles(qs: np.ndarray) -> np.ndarray:
    """GGML 4-bit ``qs[..., 16]`` -> codes ``[..., 32]`` in element order: byte j holds element j in its low
    nibble and element j+16 in its high nibble (KleidiAI's ``s16s0``)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def join_nibbles(codes: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_nibbles`: codes ``[..., 32]`` (0..15) -> ``qs[..., 16]``."""
    codes = codes.astype(np.uint8)
    return codes[..., :16] | (codes[..., 16:] << 4)


def scale_nibbles(qs: np.ndarray, values: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    """``out[..., :16]`` = values[low nibbles of qs] · d, ``out[..., 16:]`` = values[high nibbles] · d (float32)."""
    np.multiply(values[qs & 0x0F], d, out=out[..., :16])
    np.multiply(values[qs >> 4], d, out=out[..., 16:])


def c_trunc_code(v: np.ndarray, top: int) -> np.ndarray:
    """ggml's ``MIN(top, (int8_t)v)`` for v >= 0: truncation toward zero, capped at ``top``.

    A non-finite v only arises when 1/d overflows (a block whose largest magnitude is below ~1e-37); C leaves
    that conversion undefined and x86 yields 0, which is what this returns.
    """
    return np.where(np.isfinite(v), np.minimum(np.trunc(v), top), 0).astype(np.uint8)


@dataclass(frozen=True)
class BlockFormat:
    """A GGML block format: ``block_size`` elements in ``type_size`` bytes; the views, fields and row loops its
    module builds its accessors, ``quantize`` and ``dequantize`` on."""

    name: str
    type_size: int
    block_size: int = QK

    def view(self, blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
        """uint8 view [rows, k // block_size, type_size] of GGML blocks.

        ``rows``/``k`` may be omitted when ``blocks`` already has that 3-D shape.
        """
        who, block_size, type_size = self.name, self.block_size, self.type_size
        arr = np.asarray(blocks)
        if arr.dtype != np.uint8:
            raise DTypeError(f"{who}: blocks must be uint8, got {arr.dtype}")
        if rows is None or k is None:
            if arr.ndim != 3 or arr.shape[2] != type_size:
                raise KernelShapeError(
                    f"{who}: pass rows and k, or blocks shaped [rows, k/{block_size}, {type_size}] (got {arr.shape})"
                )
            rows, k = arr.shape[0], arr.shape[1] * block_size
        if rows < 0 or k < 0 or k % block_size:
            raise KernelShapeError(f"{who}: k={k} is not a multiple of the block size {block_size}")
        need = rows * (k // block_size) * type_size
        if arr.size != need:
            raise BufferSizeError(f"{who}: {arr.size} bytes given, {rows}x{k} needs {need}")
        return np.ascontiguousarray(arr).reshape(rows, k // block_size, type_size)

    def fp16_bits(self, blocks: np.ndarray, offset: int, rows: int | None, k: int | None) -> np.ndarray:
        """The fp16 bit pattern at byte ``offset`` of every block: uint16 [rows, k // block_size]."""
        return fp16_field(self.view(blocks, rows, k), offset)

    def nibble_codes(self, blocks: np.ndarray, offset: int, rows: int | None, k: int | None) -> np.ndarray:
        """The 4-bit codes of the ``qs`` that start at byte ``offset``, in element order: uint8 [rows, k]."""
        view = self.view(blocks, rows, k)
        return split_nibbles(view[..., offset:]).reshape(view.shape[0], -1)

    def with_d(self, d: np.ndarray) -> np.ndarray:
        """Blocks [rows, nb, type_size] for fp16 bits d [rows, nb], d stored at byte 0 and the rest to be written."""
        rows, nb = d.shape
        out = np.empty((rows, nb, self.type_size), dtype=np.uint8)
        store_fp16_field(out, 0, np.asarray(d, dtype=np.uint16))
        return out

    def quantize(
        self,
        x: np.ndarray,
        quantize_blocks: Callable[[np.ndarray], tuple[np.ndarray, ...]],
        from_fields: Callable[..., np.ndarray],
    ) -> np.ndarray:
        """The module's ``quantize``: validated float32 rows [rows, k] -> uint8 blocks [rows, k // block_size,
        type_size], a chunk of rows at a time. ``quantize_blocks(b [nblocks, block_size])`` returns the format's
        fields (one value per block or per element), ``from_fields`` builds the blocks of the chunk's rows from them."""
        x = rows_f32(x, self.block_size, f"{self.name} quantize")
        rows, k = x.shape
        out = np.empty((rows, k // self.block_size, self.type_size), dtype=np.uint8)
        for sl in row_chunks(rows, k):
            fields = quantize_blocks(x[sl].reshape(-1, self.block_size))
            n = sl.stop - sl.start
            out[sl] = from_fields(*(f.reshape(n, -1) for f in fields))
        return out

    def dequantize(
        self, blocks: np.ndarray, rows: int, k: int, dequantize_blocks: Callable[[np.ndarray, np.ndarray], None]
    ) -> np.ndarray:
        """The module's ``dequantize``: float32 [rows, k] of the blocks, a chunk of rows at a time;
        ``dequantize_blocks(blocks, out)`` writes the values of blocks [r, nb, type_size] into out [r, nb,
        block_size]."""
        view = self.view(blocks, rows, k)
        nb = view.shape[1]
        out = np.empty((rows, nb, self.block_size), dtype=np.float32)
        for sl in row_chunks(rows, nb * self.block_size):
            dequantize_blocks(view[sl], out[sl])
        return out.reshape(rows, nb * self.block_size)
