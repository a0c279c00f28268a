"""GGML Q4_1 (``block_q4_1``): 32 elements in 20 bytes, value = u * d + m.

Bytes 0-1: fp16 d, bytes 2-3: fp16 m (the block minimum), bytes 4-19: qs[16] with byte j = u[j] | u[j+16] << 4.
:func:`quantize` is ggml's ``quantize_row_q4_1_ref`` bit for bit; :func:`dequantize` is
``dequantize_row_q4_1`` (f32(u*d) then f32(+m): a multiply and an add, not a fused multiply-add).
:func:`kai_scale` / :func:`kai_zero` give the per-block f32 scale and offset the KleidiAI ``qai4c32``
packers take, so that scale*(u-8) + zero = u*d + m exactly.
"""

from __future__ import annotations

import numpy as np

from kleidipy.formats import (
    QK,
    block_view,
    c_trunc_code,
    fp16_field,
    join_nibbles,
    row_chunks,
    rows_f32,
    split_nibbles,
    store_fp16_field,
)
from kleidipy.numerics import f16_bits_to_f32, f32_to_f16_bits

BLOCK_SIZE = QK
TYPE_SIZE = 4 + QK // 2
#: code u -> u as float32
_CODE_VALUES = np.arange(16, dtype=np.float32)


def _view(blocks: np.ndarray, rows: int | None, k: int | None) -> np.ndarray:
    return block_view(blocks, BLOCK_SIZE, TYPE_SIZE, "Q4_1", rows, k)


def d_bits(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """fp16 bit pattern of every block's scale d: uint16 [rows, k/32]."""
    return fp16_field(_view(blocks, rows, k), 0)


def m_bits(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """fp16 bit pattern of every block's offset m (its minimum): uint16 [rows, k/32]."""
    return fp16_field(_view(blocks, rows, k), 2)


def codes(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """Unsigned 4-bit codes u in element order: uint8 [rows, k] (value = u * d + m)."""
    view = _view(blocks, rows, k)
    return split_nibbles(view[..., 4:]).reshape(view.shape[0], -1)


def kai_scale(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """KleidiAI qai4c32 ``scale`` per block: f32(d), float32 [rows, k/32]."""
    return f16_bits_to_f32(d_bits(blocks, rows, k))


def kai_zero(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """KleidiAI qai4c32 ``zero`` per block: f32(m + 8*d), float32 [rows, k/32].

    The packers treat code u as u - 8, so the offset absorbs 8*d; the sum of two fp16 values is exact in f32.
    """
    view = _view(blocks, rows, k)
    d = f16_bits_to_f32(fp16_field(view, 0))
    m = f16_bits_to_f32(fp16_field(view, 2))
    return m + np.float32(8) * d


def from_fields(d: np.ndarray, m: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Q4_1 blocks [rows, k/32, 20] from fp16 bits d and m [rows, k/32] and codes u [rows, k] (0..15)."""
    rows, nb = d.shape
    out = np.empty((rows, nb, TYPE_SIZE), dtype=np.uint8)
    store_fp16_field(out, 0, np.asarray(d, dtype=np.uint16))
    store_fp16_field(out, 2, np.asarray(m, dtype=np.uint16))
    out[..., 4:] = join_nibbles(np.asarray(u).reshape(rows, nb, BLOCK_SIZE))
    return out


def _first_equal(b: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The first element of each block equal to ``value`` (keeps its sign: ggml's '<'/'>' scans keep the
    first of +0.0 / -0.0, which only matters when the extreme is zero)."""
    out = value.copy()
    zero = np.nonzero(value == 0)[0]
    if zero.size:
        sub = b[zero]
        out[zero] = sub[np.arange(zero.size), (sub == 0).argmax(axis=1)]
    return out


def _quantize_blocks(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantize_row_q4_1_ref on blocks b [n, 32] float32 -> (fp16 bits of d [n], of m [n], codes [n, 32])."""
    vmin = _first_equal(b, b.min(axis=1))
    vmax = _first_equal(b, b.max(axis=1))
    # float overflow (max - min = Inf, tiny d -> 1/d = Inf, fp16 Inf) behaves as in C: no warnings
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = (vmax - vmin) / np.float32(15)
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0))
        v = (b - vmin[:, None]) * inv[:, None] + np.float32(0.5)  # three f32 roundings, as in C
        return f32_to_f16_bits(d), f32_to_f16_bits(vmin), c_trunc_code(v, 15)


def quantize(x: np.ndarray) -> np.ndarray:
    """ggml ``quantize_row_q4_1_ref`` of float32 rows [rows, k] -> uint8 blocks [rows, k/32, 20]."""
    x = rows_f32(x, BLOCK_SIZE, "Q4_1 quantize")
    rows, k = x.shape
    nb = k // BLOCK_SIZE
    out = np.empty((rows, nb, TYPE_SIZE), dtype=np.uint8)
    for sl in row_chunks(rows, k):
        d, m, u = _quantize_blocks(x[sl].reshape(-1, BLOCK_SIZE))
        n = sl.stop - sl.start
        out[sl] = from_fields(d.reshape(n, nb), m.reshape(n, nb), u.reshape(n, k))
    return out


def dequantize(blocks: np.ndarray, rows: int, k: int) -> np.ndarray:
    """ggml ``dequantize_row_q4_1``: float32 [rows, k] = f32(f32(u * d) + m).

    u * d is exact in float32 (4-bit times 11-bit significands), so the result is also what a compiler that
    contracts ``x*d + m`` into a fused multiply-add produces.
    """
    view = _view(blocks, rows, k)
    out = np.empty((rows, k // BLOCK_SIZE, BLOCK_SIZE), dtype=np.float32)
    for sl in row_chunks(rows, k):
        d = f16_bits_to_f32(fp16_field(view[sl], 0))[..., None]
        m = f16_bits_to_f32(fp16_field(view[sl], 2))[..., None]
        qs = view[sl, :, 4:]
        with np.errstate(invalid="ignore"):  # Inf d or m give NaN/Inf, as in C
            np.multiply(_CODE_VALUES[qs & 0x0F], d, out=out[sl, :, :16])
            np.multiply(_CODE_VALUES[qs >> 4], d, out=out[sl, :, 16:])
            out[sl] += m
    return out.reshape(rows, k)
