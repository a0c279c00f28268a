"""GGML -> packer inputs for the exact-weight family: int8 codes [n, k] with the f32 scale and offset ggml computes
per 16 values (:func:`kleidipy.formats.codes16.codes16`, exact for every type it takes)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.packers import RhsPacker
from kleidipy.formats import codes16, q8_0


def from_ggml(
    ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker, execution: str = "jit"
) -> tuple[np.ndarray, dict]:
    """Blocks of one of :data:`kleidipy.formats.codes16.TYPES` -> (codes, {scale, zero}); ``zero`` is the offset."""
    codes, scale, offset = codes16.codes16(raw, ggml_type, n, k)
    return codes, {"scale": scale, "zero": offset}


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] quantized to GGML Q8_0, then mapped as :func:`from_ggml` does."""
    n, k = weights.shape
    return from_ggml(GGMLType.Q8_0, q8_0.quantize(weights), n, k, packer)
