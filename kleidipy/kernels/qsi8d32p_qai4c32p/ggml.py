"""GGML -> packer inputs for the Q4_1 family: codes in the packer's nibble order, f32 scale d and f32 offset
m + 8d per block (:func:`~kleidipy.kernels.qsi8d32p_qai4c32p.ukernels.q4_1_to_qai4c32`, exact)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.packers import RhsPacker
from kleidipy.formats import q4_1
from kleidipy.kernels.qsi8d32p_qai4c32p.ukernels import q4_1_to_qai4c32


def from_ggml(
    ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker, execution: str = "jit"
) -> tuple[np.ndarray, dict]:
    """Q4_1 blocks -> (codes, {scale, zero}) in ``packer.code_order``."""
    codes, scale, zero = q4_1_to_qai4c32(np.asarray(raw, dtype=np.uint8), n, k, order=packer.code_order)
    return codes, {"scale": scale, "zero": zero}


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] quantized to GGML Q4_1, then mapped as :func:`from_ggml` does."""
    n, k = weights.shape
    return from_ggml(GGMLType.Q4_1, q4_1.quantize(weights), n, k, packer)
