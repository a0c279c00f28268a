"""GGML Q4_K (``block_q4_K``) fields: 256 elements in 144 bytes, eight sub-blocks of 32.

Bytes 0-1: fp16 d, bytes 2-3: fp16 dmin, bytes 4-15: twelve bytes packing eight 6-bit scales sc and eight 6-bit
mins m (ggml's ``get_scale_min_k4``), bytes 16-143: qs[128], where each 32 bytes hold sub-block 2j in the low
nibbles and sub-block 2j+1 in the high ones. Sub-block j of a super-block is ``(d·sc_j)·u − dmin·m_j``
(``dequantize_row_q4_K``, f32). Both products are exact in f32: an fp16 significand (11 bits) times a 6-bit
integer needs at most 17 bits.
"""

from __future__ import annotations

import numpy as np

from kleidipy.core.numerics import f16_bits_to_f32
from kleidipy.formats.blocks import BlockFormat, fp16_field

FORMAT = BlockFormat("Q4_K", 144, 256)
SUB = 32  #: elements per sub-block


def sub_block_fields(
    blocks: np.ndarray, rows: int | None = None, k: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale d·sc, min dmin·m, codes): f32 [rows, k/32] twice (exact) and uint8 [rows, k] codes u (0..15), so that
    value = scale·u − min per sub-block of 32."""
    view = FORMAT.view(blocks, rows, k)
    n, nb = view.shape[:2]
    d = f16_bits_to_f32(fp16_field(view, 0))[..., None]
    dmin = f16_bits_to_f32(fp16_field(view, 2))[..., None]
    q = view[..., 4:16].astype(np.uint8)
    sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    qs = view[..., 16:].reshape(n, nb, 4, 1, SUB)
    u = np.concatenate([qs & 0xF, qs >> 4], axis=3)  # [n, nb, 4 chunks, low/high, 32]: sub-blocks 2j, 2j+1
    scale = (d * sc.astype(np.float32)).reshape(n, -1)
    minimum = (dmin * m.astype(np.float32)).reshape(n, -1)
    return scale.astype(np.float32), minimum.astype(np.float32), u.reshape(n, -1).astype(np.uint8)
