"""GGML -> packer inputs for the Q4_1 family: codes in the packer's nibble order, f32 scale d and f32 offset
m + 8d per block (:func:`~kleidipy.kernels.qsi8d32p_qai4c32p.ukernels.q4_1_to_qai4c32`, exact).

Q4_K maps onto the same family without loss: each sub-block of 32 is ``(d·sc)·u − dmin·m`` (4-bit codes, an f32
scale and an f32 minimum per 32 values, both exact products), so scale = d·sc and offset = 8·d·sc − dmin·m; the
f32 offset is exact for every block of the catalogue's Q4_K tensors (checked by the tests)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.packers import RhsPacker
from kleidipy.formats import q4_1, q4_k
from kleidipy.kernels.qsi8d32p_qai4c32p.ukernels import codes_in_order, q4_1_to_qai4c32


def from_ggml(
    ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker, execution: str = "jit"
) -> tuple[np.ndarray, dict]:
    """Q4_1 or Q4_K blocks -> (codes, {scale, zero}) in ``packer.code_order``."""
    raw = np.asarray(raw, dtype=np.uint8)
    if ggml_type == GGMLType.Q4_K:
        scale, minimum, u = q4_k.sub_block_fields(raw, n, k)
        zero = np.float32(8) * scale - minimum
        return codes_in_order(u, packer.code_order), {"scale": scale, "zero": zero}
    codes, scale, zero = q4_1_to_qai4c32(raw, n, k, order=packer.code_order)
    return codes, {"scale": scale, "zero": zero}


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] quantized to GGML Q4_1, then mapped as :func:`from_ggml` does."""
    n, k = weights.shape
    return from_ggml(GGMLType.Q4_1, q4_1.quantize(weights), n, k, packer)
