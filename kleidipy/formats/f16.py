"""GGML F16 and F32 tensors: plain IEEE binary16 / binary32 rows [rows, k].

F16 -> float32 is exact; float32 -> F16 rounds to nearest even (ggml's ``GGML_FP32_TO_FP16``, F16C's
``vcvtps2ph``), overflowing to +-Inf. F32 is the identity.
"""

from __future__ import annotations

import numpy as np

from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError


def _rows(data: np.ndarray, dtype: type, rows: int, k: int, who: str) -> np.ndarray:
    """``data`` (raw uint8 bytes or already of ``dtype``) as [rows, k] of ``dtype``."""
    arr = np.ascontiguousarray(data)
    if arr.dtype == np.uint8:
        arr = arr.reshape(-1).view(dtype)
    elif arr.dtype != dtype:
        raise DTypeError(f"{who}: data must be {np.dtype(dtype).name} or raw uint8 bytes, got {arr.dtype}")
    if arr.size != rows * k:
        raise BufferSizeError(f"{who}: {arr.size} values given, {rows}x{k} needs {rows * k}")
    return arr.reshape(rows, k)


def _f32_rows(x: np.ndarray, who: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype != np.float32:
        raise DTypeError(f"{who}: input must be float32, got {arr.dtype}")
    if arr.ndim != 2:
        raise KernelShapeError(f"{who}: input must be 2-D [rows, k], got shape {arr.shape}")
    return arr


def quantize(x: np.ndarray) -> np.ndarray:
    """float32 [rows, k] -> float16 [rows, k], round to nearest even (beyond the fp16 range: +-Inf, as ggml)."""
    with np.errstate(over="ignore"):
        return _f32_rows(x, "F16 quantize").astype(np.float16)


def dequantize(data: np.ndarray, rows: int, k: int) -> np.ndarray:
    """F16 tensor (float16 or its raw bytes) -> float32 [rows, k], exact."""
    return _rows(data, np.float16, rows, k, "F16").astype(np.float32)


def quantize_f32(x: np.ndarray) -> np.ndarray:
    """float32 [rows, k] -> an F32 tensor (a contiguous copy)."""
    return np.array(_f32_rows(x, "F32 quantize"), dtype=np.float32, order="C")


def dequantize_f32(data: np.ndarray, rows: int, k: int) -> np.ndarray:
    """F32 tensor (float32 or its raw bytes) -> float32 [rows, k] (a copy)."""
    return _rows(data, np.float32, rows, k, "F32").copy()
