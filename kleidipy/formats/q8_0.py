"""GGML Q8_0 (``block_q8_0``): 32 elements in 34 bytes, value = qs * d.

Bytes 0-1: fp16 d (little-endian); bytes 2-33: int8 qs[32] in element order. :func:`quantize` is ggml's
``quantize_row_q8_0_ref`` bit for bit (d = amax/127, roundf: ties away from zero, no clamp).
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.numerics import f16_bits_to_f32, f32_to_f16_bits, round_away
from kleidipy.formats.blocks import QK, BlockFormat, fp16_field

FORMAT = BlockFormat("Q8_0", 2 + QK)


def d_bits(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """fp16 bit pattern of every block's scale d: uint16 [rows, k/32]."""
    return FORMAT.fp16_bits(blocks, 0, rows, k)


def qs(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """The int8 quants in element order: int8 [rows, k] (value = qs * d)."""
    view = FORMAT.view(blocks, rows, k)
    return view[..., 2:].view(np.int8).reshape(view.shape[0], -1)


def from_fields(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q8_0 blocks [rows, k/32, 34] from fp16 bits d [rows, k/32] and int8 quants q [rows, k]."""
    out = FORMAT.with_d(d)
    out[..., 2:] = np.asarray(q, dtype=np.int8).reshape(*d.shape, QK).view(np.uint8)
    return out


def _quantize_blocks(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q8_0_ref on blocks b [n, 32] float32 -> (fp16 bits of d [n], int8 qs [n, 32])."""
    d = np.abs(b).max(axis=1) / np.float32(127)
    # float overflow (tiny d -> 1/d = Inf, huge d -> fp16 Inf) behaves as in C: no warnings
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0))
        q = round_away(b * inv[:, None])  # f32 product, then roundf
        # a non-finite product only arises when 1/d overflows (amax below ~4e-37): undefined in C, 0 on x86
        q = np.where(np.isfinite(q), q, 0).astype(np.int8)
        return f32_to_f16_bits(d), q


def quantize(x: np.ndarray) -> np.ndarray:
    """ggml ``quantize_row_q8_0_ref`` of float32 rows [rows, k] -> uint8 blocks [rows, k/32, 34]."""
    return FORMAT.quantize(x, _quantize_blocks, from_fields)


def _dequantize_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    d = f16_bits_to_f32(fp16_field(blocks, 0))[..., None]
    with np.errstate(invalid="ignore"):  # d = Inf times qs 0 gives NaN, as in C
        np.multiply(blocks[..., 2:].view(np.int8), d, out=out)


def dequantize(blocks: np.ndarray, rows: int, k: int) -> np.ndarray:
    """ggml ``dequantize_row_q8_0``: float32 [rows, k] = qs * d (exact in float32)."""
    return FORMAT.dequantize(blocks, rows, k, _dequantize_blocks)
