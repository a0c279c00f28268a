"""Dequantize-only GGML types a GGUF model may carry (Q5_0, Q5_1, K-quants, IQ-quants, BF16, ...), so the
runtime can re-quantize such tensors to a type the KleidiAI path runs (Q4_0, Q8_0) at load.

Decoding is delegated to ``gguf.quants`` (gguf-py, llama.cpp's own Python package), except Q8_K which it
lacks: f32 d, int8 qs[256], int16 bsums[16]; value = d * qs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from kleidipy.errors import BufferSizeError, KernelShapeError

#: Types read here; Q4_0, Q4_1 and Q8_0 have their own exact modules.
SUPPORTED: tuple[GGMLQuantizationType, ...] = (
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q3_K,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.Q8_K,
    GGMLQuantizationType.TQ1_0,
    GGMLQuantizationType.TQ2_0,
    GGMLQuantizationType.MXFP4,
    GGMLQuantizationType.IQ2_XXS,
    GGMLQuantizationType.IQ2_XS,
    GGMLQuantizationType.IQ2_S,
    GGMLQuantizationType.IQ3_XXS,
    GGMLQuantizationType.IQ3_S,
    GGMLQuantizationType.IQ1_S,
    GGMLQuantizationType.IQ1_M,
    GGMLQuantizationType.IQ4_NL,
    GGMLQuantizationType.IQ4_XS,
)


#: rows handed to gguf's dequantizer as one (it loops in Python over groups of 16 of its rows, ~0.1 ms each)
_JOIN = 32


def _raw_rows(data: np.ndarray, t: GGMLQuantizationType, rows: int, k: int) -> np.ndarray:
    """The tensor's bytes as uint8 [rows, row_bytes] (any dtype GGUFReader hands out is viewed as bytes)."""
    block_size, type_size = GGML_QUANT_SIZES[t]
    if k % block_size:
        raise KernelShapeError(f"{t.name}: k={k} is not a multiple of the block size {block_size}")
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    row_bytes = k // block_size * type_size
    if raw.size != rows * row_bytes:
        raise BufferSizeError(f"{t.name}: {raw.size} bytes given, {rows}x{k} needs {rows * row_bytes}")
    return raw.reshape(rows, row_bytes)


def _dequantize_q8_k(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[GGMLQuantizationType.Q8_K][1])
    d = np.ascontiguousarray(blocks[:, :4]).view(np.float32)
    return blocks[:, 4:260].view(np.int8).astype(np.float32) * d


def dequantizer(t: GGMLQuantizationType) -> Callable[[np.ndarray, int, int], np.ndarray]:
    """``dequantize(data, rows, k) -> float32 [rows, k]`` for one of :data:`SUPPORTED`."""

    def dequantize(data: np.ndarray, rows: int, k: int) -> np.ndarray:
        raw = _raw_rows(data, t, rows, k)
        if t == GGMLQuantizationType.Q8_K:
            values = _dequantize_q8_k(raw)
        else:  # (rows joined in 32s: gguf works through a tensor 16 of its rows at a time; 4x faster on a 152k vocab)
            values = quants.dequantize(raw.reshape(rows // math.gcd(rows, _JOIN), -1), t)
        return np.ascontiguousarray(values, dtype=np.float32).reshape(rows, k)

    dequantize.__doc__ = f"{t.name} tensor bytes -> float32 [rows, k]."
    return dequantize
