"""GGML Q4_1 (``block_q4_1``): 32 elements in 20 bytes, value = u * d + m.

Bytes 0-1: fp16 d, bytes 2-3: fp16 m (the block minimum), bytes 4-19: qs[16] with byte j = u[j] | u[j+16] << 4.
:func:`quantize` is ggml's ``quantize_row_q4_1_ref`` bit for bit; :func:`dequantize` is
``dequantize_row_q4_1`` (f32(u*d) then f32(+m): a multiply and an add, not a fused multiply-add). The field
accessors give what the runtime and ``kleidipy.kernels.qsi8d32p_qai4c32p.ukernels.q4_1_to_qai4c32`` (the KleidiAI
``qai4c32`` packers' inputs) read.
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.numerics import f16_bits_to_f32, f32_to_f16_bits
from kleidipy.formats.blocks import (
    QK,
    BlockFormat,
    c_trunc_code,
    fp16_field,
    join_nibbles,
    scale_nibbles,
    store_fp16_field,
)

FORMAT = BlockFormat("Q4_1", 4 + QK // 2)
#: code u -> u as float32
_CODE_VALUES = np.arange(16, dtype=np.float32)


def d_bits(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """fp16 bit pattern of every block's scale d: uint16 [rows, k/32]."""
    return FORMAT.fp16_bits(blocks, 0, rows, k)


def m_bits(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """fp16 bit pattern of every block's offset m (its minimum): uint16 [rows, k/32]."""
    return FORMAT.fp16_bits(blocks, 2, rows, k)


def codes(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """Unsigned 4-bit codes u in element order: uint8 [rows, k] (value = u * d + m)."""
    return FORMAT.nibble_codes(blocks, 4, rows, k)


def from_fields(d: np.ndarray, m: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Q4_1 blocks [rows, k/32, 20] from fp16 bits d and m [rows, k/32] and codes u [rows, k] (0..15)."""
    out = FORMAT.with_d(d)
    store_fp16_field(out, 2, np.asarray(m, dtype=np.uint16))
    out[..., 4:] = join_nibbles(np.asarray(u).reshape(*d.shape, QK))
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
    return FORMAT.quantize(x, _quantize_blocks, from_fields)


def _dequantize_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    d = f16_bits_to_f32(fp16_field(blocks, 0))[..., None]
    m = f16_bits_to_f32(fp16_field(blocks, 2))[..., None]
    with np.errstate(invalid="ignore"):  # Inf d or m give NaN/Inf, as in C
        scale_nibbles(blocks[..., 4:], _CODE_VALUES, d, out)
        out += m


def dequantize(blocks: np.ndarray, rows: int, k: int) -> np.ndarray:
    """ggml ``dequantize_row_q4_1``: float32 [rows, k] = f32(f32(u * d) + m).

    u * d is exact in float32 (4-bit times 11-bit significands), so the result is also what a compiler that
    contracts ``x*d + m`` into a fused multiply-add produces.
    """
    return FORMAT.dequantize(blocks, rows, k, _dequantize_blocks)
