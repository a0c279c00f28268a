"""The K x N float weights the F16 route's packers take (KleidiAI's ``rhs_pack_kxn_*`` inputs), shared by the
``bf16p_bf16p`` and ``f32_f32p`` families: llama.cpp's F16 route turns a GGML F16 (or F32) tensor [n][k] into the
exact float32 values transposed to K x N with zero biases (:func:`f16_nxk_to_f32_kxn`, the adaptor
:func:`from_ggml`), and the packers check their K x N inputs the same way (:func:`kxn_inputs`)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.numerics import f16_bits_to_f32
from kleidipy.core.packers import RhsPacker
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError


def f16_nxk_to_f32_kxn(rhs_f16: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's F16 route: GGML F16 weights [n][k] (float16, or their uint16 bit patterns) -> the kxn packers'
    inputs ``(rhs, bias)``: rhs = the exact float32 values transposed to K x N (``transpose_f32kxn_f16nxk``),
    bias = zeros[n]."""
    arr = np.asarray(rhs_f16)
    if arr.dtype == np.float16:
        values = arr.astype(np.float32)
    elif arr.dtype == np.uint16:
        values = f16_bits_to_f32(arr)
    else:
        raise DTypeError(f"F16 weights must be float16 (or uint16 bit patterns), got {arr.dtype}")
    if values.ndim != 2:
        raise KernelShapeError(f"F16 weights must be a 2-D [n][k] tensor, got shape {values.shape}")
    return np.ascontiguousarray(values.T), np.zeros(values.shape[0], dtype=np.float32)


def float_rhs(rhs: np.ndarray, rows: int, cols: int, who: str, order: str = "K x N") -> np.ndarray:
    """The float32 weights [rows, cols] of a packer taking them in ``order`` ("K x N", or "N x K" for an nxk
    packer): a [>=rows, >=cols] array (row stride = its width) or >= rows·cols values."""
    arr = np.asarray(rhs)
    if arr.dtype != np.float32:
        raise DTypeError(f"{who}: rhs must be float32 ({order}), got {arr.dtype}")
    if arr.ndim == 2:
        if arr.shape[0] < rows or arr.shape[1] < cols:
            raise BufferSizeError(f"{who}: rhs is {arr.shape[0]}x{arr.shape[1]}, {order} = {rows}x{cols} needed")
        return arr[:rows, :cols]
    flat = arr.reshape(-1)
    if flat.size < rows * cols:
        raise BufferSizeError(f"{who}: rhs holds {flat.size} floats, {order} = {rows}x{cols} needs {rows * cols}")
    return flat[: rows * cols].reshape(rows, cols)


def kxn_bias(bias: np.ndarray | None, n: int, who: str) -> np.ndarray:
    """n float32 biases; None means zeros (KleidiAI's NULL bias)."""
    if bias is None:
        return np.zeros(n, dtype=np.float32)
    arr = np.asarray(bias)
    if arr.dtype != np.float32:
        raise DTypeError(f"{who}: bias must be float32, got {arr.dtype}")
    flat = arr.reshape(-1)
    if flat.size < n:
        raise BufferSizeError(f"{who}: bias holds {flat.size} floats, n={n} needed")
    return np.ascontiguousarray(flat[:n])


def kxn_inputs(
    who: str,
    n: int,
    k: int,
    rhs: np.ndarray,
    scale: np.ndarray | None,
    zero: np.ndarray | None,
    bias: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(K x N weights, n biases) of a kxn packer call; these packers take no scale or zero (KleidiAI asserts
    scale == NULL)."""
    if scale is not None or zero is not None:
        raise KernelShapeError(f"{who}: takes no scale or zero input, only rhs and bias")
    return float_rhs(rhs, k, n, who), kxn_bias(bias, n, who)


def check_no_bl(who: str, bl: int | None) -> None:
    if bl is not None:
        raise KernelShapeError(f"{who}: is not block-quantized and takes no block length, got bl={bl}")


def from_ggml(
    ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, packer: RhsPacker, execution: str = "jit"
) -> tuple[np.ndarray, dict]:
    """F16 (or F32) weights [n, k] -> (f32 K x N, {bias: zeros[n]}); an nxk packer (the SME2 GEMV's, in the
    ``f32_f32p`` family) takes the f32 values as they are, N x K."""
    if ggml_type == GGMLType.F32:
        values = np.asarray(raw).view(np.float32).reshape(n, k)
        rhs, bias = np.ascontiguousarray(values.T), np.zeros(n, np.float32)
    else:
        rhs, bias = f16_nxk_to_f32_kxn(np.asarray(raw).view(np.float16).reshape(n, k))
    return (np.ascontiguousarray(rhs.T) if packer.rhs_order == "nxk" else rhs), {"bias": bias}


def from_float(weights: np.ndarray, packer: RhsPacker) -> tuple[np.ndarray, dict]:
    """Float weights [n, k] rounded to F16, then as :func:`from_ggml` hands them over."""
    n, k = weights.shape
    return from_ggml(GGMLType.F16, weights.astype(np.float16), n, k, packer)
