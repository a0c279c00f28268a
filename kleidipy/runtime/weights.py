"""The matmul protocol the transformer code calls, and its float reference implementation.

A model never multiplies by a weight itself: for every 2-D weight it asks a :class:`LinearFactory` for a
:class:`Linear` (``x float32 [m, k] -> float32 [m, n]``), and it reads token embeddings through an
:class:`Embedding` (``token ids -> float32 [len, n_embd]``). The real backend repacks the GGUF bytes for the
KleidiAI kernels; :class:`FloatLinear` (dequantize once, float32 BLAS) is the test/reference backend.
:class:`RowEmbedding` dequantizes only the requested rows, as llama.cpp's GET_ROWS does, so it serves any backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.errors import DTypeError, InvalidTokenError, KernelShapeError
from kleidipy.formats import rows

#: True while every matmul runs its decode kernel (the GEMV) whatever its rows, so that each row is computed as a
#: single decoded token's (a draft's verification); a backend whose GEMM and GEMV are one kernel ignores it
GEMV_ROWS: ContextVar[bool] = ContextVar("GEMV_ROWS", default=False)


@runtime_checkable
class Linear(Protocol):
    """``y = x @ W.T`` for a weight W of n rows of k values: x float32 [m, k] -> float32 [m, n]."""

    n: int
    k: int

    def __call__(self, x: np.ndarray) -> np.ndarray: ...


class LinearFactory(Protocol):
    """Makes the Linear of one GGUF weight from its name, ggml type, shape in ggml order ``(k, n)`` and raw bytes
    (a uint8 view ``[n, row_bytes]`` into the model file)."""

    def __call__(self, name: str, ggml_type: GGMLType, shape: tuple[int, ...], raw: np.ndarray) -> Linear: ...


@runtime_checkable
class Embedding(Protocol):
    """Token-embedding rows: token ids [len] -> float32 [len, n_embd]."""

    n_embd: int
    n_vocab: int

    def __call__(self, token_ids: np.ndarray) -> np.ndarray: ...


class EmbeddingFactory(Protocol):
    """Makes the Embedding of ``token_embd.weight`` from the same arguments as a LinearFactory."""

    def __call__(self, name: str, ggml_type: GGMLType, shape: tuple[int, ...], raw: np.ndarray) -> Embedding: ...


def dequantize_rows(ggml_type: GGMLType, raw: np.ndarray) -> np.ndarray:
    """float32 values of rows of GGUF bytes (uint8 ``[rows, row_bytes]``), as ggml's ``to_float`` gives them."""
    return np.array(gguf.quants.dequantize(raw, ggml_type), dtype=np.float32)


def check_activations(x: np.ndarray, k: int) -> np.ndarray:
    """Validate a Linear's input: float32, 2-D, k columns; returns it C-contiguous."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise DTypeError(f"activations must be a float32 array, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim != 2 or x.shape[1] != k:
        raise KernelShapeError(f"activations must have shape [m, {k}], got {list(x.shape)}")
    return np.ascontiguousarray(x)


class FloatLinear:
    """Reference backend: the weight dequantized once to float32 [n, k], applied with float32 BLAS."""

    def __init__(self, weight: np.ndarray) -> None:
        if weight.dtype != np.float32 or weight.ndim != 2:
            raise DTypeError(f"FloatLinear needs a float32 [n, k] weight, got {weight.dtype} {list(weight.shape)}")
        self.weight = np.ascontiguousarray(weight)
        self.n, self.k = self.weight.shape

    @classmethod
    def from_gguf(cls, name: str, ggml_type: GGMLType, shape: tuple[int, ...], raw: np.ndarray) -> FloatLinear:
        """A LinearFactory."""
        return cls(dequantize_rows(ggml_type, raw).reshape(shape[1], shape[0]))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return check_activations(x, self.k) @ self.weight.T


class RowEmbedding:
    """Embedding rows dequantized on demand from the raw GGUF bytes (no full copy of the table)."""

    def __init__(self, ggml_type: GGMLType, raw: np.ndarray, n_embd: int) -> None:
        self.ggml_type = ggml_type
        self.raw = raw
        self.n_embd = n_embd
        self.n_vocab = raw.shape[0]
        self._rows_code = rows.CODES.get(ggml_type, -1)  # the compiled GET_ROWS's type, or -1: gguf's dequantizer

    @classmethod
    def from_gguf(cls, name: str, ggml_type: GGMLType, shape: tuple[int, ...], raw: np.ndarray) -> RowEmbedding:
        """An EmbeddingFactory."""
        return cls(ggml_type, raw, shape[0])

    def compiled_rows(self) -> tuple[int, np.ndarray, np.float32] | None:
        """How compiled code gets these rows: (the :func:`kleidipy.formats.rows.get_rows` code, the tensor bytes,
        0 = no scale), or None when the type has no compiled GET_ROWS."""
        return None if self._rows_code < 0 else (self._rows_code, self.raw, np.float32(0.0))

    def __call__(self, token_ids: np.ndarray | Sequence[int]) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise InvalidTokenError(f"token ids must be a 1-D integer array, got {ids.dtype} {list(ids.shape)}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise InvalidTokenError(f"token ids must be in [0, {self.n_vocab}), got {ids.min()}..{ids.max()}")
        if self._rows_code >= 0:
            out = np.empty((ids.size, self.n_embd), np.float32)
            rows.get_rows(self._rows_code, self.raw, ids.astype(np.int64, copy=False), out)
            return out
        return dequantize_rows(self.ggml_type, self.raw[ids]).reshape(len(ids), self.n_embd)
