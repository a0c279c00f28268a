"""GGML Q4_0 (``block_q4_0``): 32 elements in 18 bytes, value = (u - 8) * d.

Bytes 0-1: fp16 d (little-endian); bytes 2-17: qs[16], byte j = u[j] | u[j+16] << 4 (KleidiAI's ``s16s0``).
:func:`quantize` is ggml's ``quantize_row_q4_0_ref`` bit for bit; the field accessors give what the
KleidiAI packers and the runtime read (d as fp16 bits, unsigned codes u in element order).
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.numerics import f16_bits_to_f32, f32_to_f16_bits
from kleidipy.formats.blocks import QK, BlockFormat, c_trunc_code, fp16_field, join_nibbles, scale_nibbles

FORMAT = BlockFormat("Q4_0", 2 + QK // 2)
#: code u -> u - 8 as float32
_CODE_VALUES = np.arange(-8, 8, dtype=np.float32)


def d_bits(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """fp16 bit pattern of every block's scale d: uint16 [rows, k/32]."""
    return FORMAT.fp16_bits(blocks, 0, rows, k)


def codes(blocks: np.ndarray, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """Unsigned 4-bit codes u in element order: uint8 [rows, k] (value = (u - 8) * d)."""
    return FORMAT.nibble_codes(blocks, 2, rows, k)


def from_fields(d: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Q4_0 blocks [rows, k/32, 18] from fp16 bits d [rows, k/32] and codes u [rows, k] (0..15)."""
    out = FORMAT.with_d(d)
    out[..., 2:] = join_nibbles(np.asarray(u).reshape(*d.shape, QK))
    return out


def _quantize_blocks(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q4_0_ref on blocks b [n, 32] float32 -> (fp16 bits of d [n], codes [n, 32])."""
    # max = the signed value of the first element of largest magnitude (strict '<' scan); ggml's scan starts
    # from max = +0.0, so a block of zeros (of either sign) keeps +0.0 and gets d = -0.0.
    first = np.abs(b).argmax(axis=1)
    vmax = b[np.arange(b.shape[0]), first]
    vmax = np.where(vmax == 0, np.float32(0), vmax)
    d = vmax / np.float32(-8)
    # float overflow (tiny d -> 1/d = Inf, huge d -> fp16 Inf) behaves as in C: no warnings
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0))  # f32 id, not the fp16-rounded d
        v = b * inv[:, None] + np.float32(8.5)  # two f32 roundings, as in C
        return f32_to_f16_bits(d), c_trunc_code(v, 15)


def quantize(x: np.ndarray) -> np.ndarray:
    """ggml ``quantize_row_q4_0_ref`` of float32 rows [rows, k] -> uint8 blocks [rows, k/32, 18]."""
    return FORMAT.quantize(x, _quantize_blocks, from_fields)


def _dequantize_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    d = f16_bits_to_f32(fp16_field(blocks, 0))[..., None]
    with np.errstate(invalid="ignore"):  # d = Inf times code 8 gives NaN, as in C
        scale_nibbles(blocks[..., 2:], _CODE_VALUES, d, out)


def dequantize(blocks: np.ndarray, rows: int, k: int) -> np.ndarray:
    """ggml ``dequantize_row_q4_0``: float32 [rows, k] = (u - 8) * d (exact in float32)."""
    return FORMAT.dequantize(blocks, rows, k, _dequantize_blocks)
