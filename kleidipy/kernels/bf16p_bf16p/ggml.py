"""GGML -> packer inputs for the F16 families (BF16 and F32 routes): llama.cpp's F16 route, the exact float32
values transposed to K x N (:func:`~kleidipy.kernels.bf16p_bf16p.ukernels.f16_nxk_to_f32_kxn`) with zero
biases; F32 weights take the same path without the conversion."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.packers import RhsPacker
from kleidipy.kernels.bf16p_bf16p.ukernels import f16_nxk_to_f32_kxn


def from_ggml(
    ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker, execution: str = "jit"
) -> tuple[np.ndarray, dict]:
    """F16 (or F32) weights [n, k] -> (f32 K x N, {bias: zeros[n]})."""
    if ggml_type == GGMLType.F32:
        values = np.asarray(raw).view(np.float32).reshape(n, k)
        return np.ascontiguousarray(values.T), {"bias": np.zeros(n, np.float32)}
    rhs, bias = f16_nxk_to_f32_kxn(np.asarray(raw).view(np.float16).reshape(n, k))
    return rhs, {"bias": bias}


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] rounded to F16, then as :func:`from_ggml` hands them over."""
    n, k = weights.shape
    return from_ggml(GGMLType.F16, weights.astype(np.float16), n, k, packer)
