"""GGML -> packer inputs for the families of Q4_0 weights (``qsi8d32p_qsi4c32p``, ``f16p_qsi4c32p``): the ``block_q4_0``
bytes go to the RHS packers (:mod:`.qsi4c32p`) verbatim."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.packers import RhsPacker
from kleidipy.formats import q4_0


def from_ggml(
    ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker, execution: str = "jit"
) -> tuple[np.ndarray, dict]:
    """Q4_0 blocks [n, k/32, 18] as stored in the GGUF file, no conversion."""
    return np.asarray(raw, dtype=np.uint8).reshape(n, -1), {}


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] quantized to GGML Q4_0 (ggml's reference rules)."""
    n, k = weights.shape
    return from_ggml(GGMLType.Q4_0, q4_0.quantize(weights), n, k, packer)
