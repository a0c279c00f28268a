"""GGML tensor formats: a registry keyed by GGML type (elements per block, bytes per block, quantize,
dequantize); the block helpers the format modules share are in ``blocks``.

Q4_0, Q4_1 and Q8_0 (``q4_0``, ``q4_1``, ``q8_0``) follow ggml's reference quantizers bit for bit; F16 and
F32 are in ``f16``; the other types a GGUF model may carry are dequantize-only (``other``), so the runtime
can re-quantize them at load. Block arrays are uint8 ``[rows, k // block_size, type_size]`` (a flat array
of the same bytes is accepted wherever ``rows`` and ``k`` are given).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kleidipy.errors import KernelShapeError, UnsupportedTensorTypeError
from kleidipy.formats import f16, other, q4_0, q4_1, q8_0

# --------------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class TensorFormat:
    """One GGML tensor type: ``quantize(x f32 [rows, k]) -> bytes`` (None: dequantize-only) and
    ``dequantize(data, rows, k) -> f32 [rows, k]``."""

    ggml_type: GGMLQuantizationType
    block_size: int
    type_size: int
    dequantize: Callable[[np.ndarray, int, int], np.ndarray]
    quantize: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def name(self) -> str:
        return self.ggml_type.name

    def row_bytes(self, k: int) -> int:
        if k % self.block_size:
            raise KernelShapeError(f"{self.name}: k={k} is not a multiple of the block size {self.block_size}")
        return k // self.block_size * self.type_size


@cache
def _registry() -> dict[GGMLQuantizationType, TensorFormat]:
    def fmt(t: GGMLQuantizationType, dequantize: Callable, quantize: Callable | None = None) -> TensorFormat:
        block_size, type_size = GGML_QUANT_SIZES[t]
        return TensorFormat(t, block_size, type_size, dequantize, quantize)

    T = GGMLQuantizationType
    reg = {
        T.F32: fmt(T.F32, f16.dequantize_f32, f16.quantize_f32),
        T.F16: fmt(T.F16, f16.dequantize, f16.quantize),
        T.Q4_0: fmt(T.Q4_0, q4_0.dequantize, q4_0.quantize),
        T.Q4_1: fmt(T.Q4_1, q4_1.dequantize, q4_1.quantize),
        T.Q8_0: fmt(T.Q8_0, q8_0.dequantize, q8_0.quantize),
    }
    for t in other.SUPPORTED:
        reg[t] = fmt(t, other.dequantizer(t))
    return reg


def ggml_type(t: GGMLQuantizationType | int | str) -> GGMLQuantizationType:
    """A GGML type from its enum, number or name ("Q4_0")."""
    try:
        if isinstance(t, str):
            return GGMLQuantizationType[t.upper()]
        return GGMLQuantizationType(t)
    except (KeyError, ValueError):
        raise UnsupportedTensorTypeError(f"unknown GGML tensor type {t!r}") from None


def get_format(t: GGMLQuantizationType | int | str) -> TensorFormat:
    """The :class:`TensorFormat` of a GGML type; UnsupportedTensorTypeError if kleidipy cannot read it."""
    gt = ggml_type(t)
    reg = _registry()
    if gt not in reg:
        names = ", ".join(f.name for f in reg.values())
        raise UnsupportedTensorTypeError(f"GGML tensor type {gt.name} is not supported (supported: {names})")
    return reg[gt]


def supported_types() -> list[GGMLQuantizationType]:
    return list(_registry())


def quantize(x: np.ndarray, t: GGMLQuantizationType | int | str) -> np.ndarray:
    """Quantize float32 rows [rows, k] to GGML type ``t`` (Q4_0, Q4_1, Q8_0, F16, F32)."""
    f = get_format(t)
    if f.quantize is None:
        quantizable = ", ".join(g.name for g in _registry().values() if g.quantize is not None)
        raise UnsupportedTensorTypeError(f"kleidipy cannot quantize to {f.name} (only to {quantizable})")
    return f.quantize(x)


def dequantize(data: np.ndarray, t: GGMLQuantizationType | int | str, rows: int, k: int) -> np.ndarray:
    """float32 [rows, k] values of a GGML tensor of type ``t`` (raw bytes or its natural dtype)."""
    return get_format(t).dequantize(data, rows, k)
