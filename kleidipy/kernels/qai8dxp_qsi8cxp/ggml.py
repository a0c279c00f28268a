"""GGML -> packer inputs for the Q8_0 family: llama.cpp's per-channel requantization of the Q8_0 blocks
(:func:`~kleidipy.kernels.qai8dxp_qsi8cxp.ukernels.requantize_q8_0_per_channel`), as it repacks Q8_0 for KleidiAI."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.packers import RhsPacker
from kleidipy.formats import q8_0
from kleidipy.kernels.qai8dxp_qsi8cxp.ukernels import requantize_q8_0_per_channel


def from_ggml(
    ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker, execution: str = "jit"
) -> tuple[np.ndarray, dict]:
    """Q8_0 blocks -> (int8 q [n, k], {scale: f32 [n]})."""
    q, scale = requantize_q8_0_per_channel(raw, n, k, execution=execution)
    return q, {"scale": scale}


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] quantized to GGML Q8_0, then requantized as :func:`from_ggml` does."""
    n, k = weights.shape
    return from_ggml(GGMLType.Q8_0, q8_0.quantize(weights), n, k, packer)
