"""``QuantizedLinear``: ``y = x @ Wᵀ + b`` with W in GGML Q4_0, Q8_0 or Q4_1, over numpy.

The weight is repacked once by the runtime's :class:`~kleidipy.runtime.backend.KleidiBackend` for the target's
kernels (SME2 → I8MM → DotProd, as llama.cpp chooses), so a layer computes the same bits as the runtime's
MUL_MAT on the same GGUF bytes; the bias is added in float32 afterwards.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy import formats
from kleidipy.core.buffers import check_threads
from kleidipy.errors import (
    BufferSizeError,
    DTypeError,
    KernelShapeError,
    NonFiniteInputError,
    UnsupportedTensorTypeError,
)
from kleidipy.runtime.backend import KleidiBackend, RepackedLinear
from kleidipy.target import Target, resolve_target

#: the GGML weight types a layer takes (those the kernels run directly)
WEIGHT_TYPES = (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_1)


def check_weight_type(t: GGMLType | int | str) -> GGMLType:
    """A layer weight type from its enum, number or name ("q4_0"); UnsupportedTensorTypeError for the others."""
    gt = formats.ggml_type(t)
    if gt not in WEIGHT_TYPES:
        names = ", ".join(w.name for w in WEIGHT_TYPES)
        raise UnsupportedTensorTypeError(f"QuantizedLinear takes {names} weights, not {gt.name}")
    return gt


def _float32(a: np.ndarray, what: str, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` as a finite float32 array of ``shape`` (any real floating dtype is converted once)."""
    arr = np.asarray(a)
    if not np.issubdtype(arr.dtype, np.floating):
        raise DTypeError(f"QuantizedLinear: {what} must be a floating-point array, got {arr.dtype}")
    if arr.shape != shape:
        raise KernelShapeError(f"QuantizedLinear: {what} must have shape {list(shape)}, got {list(arr.shape)}")
    out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(out).all():
        raise NonFiniteInputError(f"QuantizedLinear: {what} has NaN/Inf (or values beyond float32)")
    return out


class QuantizedLinear:
    """A linear layer with GGML-quantized weights: float32 ``x [..., in_features]`` -> ``[..., out_features]``.

    Build it from GGUF block bytes (uint8, flat or ``[out_features, in_features / 32, block bytes]``, as a GGUF
    file stores the weight), used as they are, or with :meth:`from_float` (quantized by GGML's reference rules).
    ``target`` is a :class:`~kleidipy.target.Target` or a spec (``"sme2:svl=512"``, ``"i8mm"``...; default:
    ``$KLEIDIPY_TARGET`` or the host); ``threads`` splits each matmul over the weight's rows as the runtime does.
    """

    def __init__(
        self,
        blocks: np.ndarray,
        weight_type: GGMLType | int | str,
        out_features: int,
        in_features: int,
        bias: np.ndarray | None = None,
        *,
        target: Target | str | None = None,
        threads: int = 1,
        name: str = "linear",
    ):
        self.weight_type = check_weight_type(weight_type)
        if not all(
            isinstance(f, int | np.integer) and not isinstance(f, bool) and f > 0 for f in (out_features, in_features)
        ):
            raise KernelShapeError(
                f"QuantizedLinear: features must be positive integers, got out={out_features!r}, in={in_features!r}"
            )
        self.out_features, self.in_features = n, k = int(out_features), int(in_features)
        self.threads = check_threads(threads)
        fmt = formats.get_format(self.weight_type)
        raw = np.asarray(blocks)
        if raw.dtype != np.uint8:
            raise DTypeError(f"QuantizedLinear: {fmt.name} blocks must be uint8 bytes, got {raw.dtype}")
        if raw.size != n * fmt.row_bytes(k):
            raise BufferSizeError(
                f"QuantizedLinear: {raw.size} bytes given, a {n}x{k} {fmt.name} weight has {n * fmt.row_bytes(k)}"
            )
        self.bias = None if bias is None else _float32(bias, "bias", (n,))
        self.target = target if isinstance(target, Target) else resolve_target(target)
        backend = KleidiBackend(self.target, threads=self.threads)
        self.linear: RepackedLinear = backend(name, self.weight_type, (k, n), raw.reshape(-1))

    @classmethod
    def from_float(
        cls,
        weight: np.ndarray,
        weight_type: GGMLType | int | str = "q4_0",
        bias: np.ndarray | None = None,
        *,
        target: Target | str | None = None,
        threads: int = 1,
        name: str = "linear",
    ) -> QuantizedLinear:
        """A layer from a float weight ``[out_features, in_features]``, quantized to ``weight_type``."""
        arr = np.asarray(weight)
        if arr.ndim != 2:
            raise KernelShapeError(f"QuantizedLinear: weight must be 2-D [out, in], got shape {list(arr.shape)}")
        gt = check_weight_type(weight_type)
        w = _float32(arr, "weight", arr.shape)
        n, k = w.shape
        return cls(formats.quantize(w, gt), gt, n, k, bias, target=target, threads=threads, name=name)

    @property
    def kernels(self) -> tuple[str, str]:
        """(GEMM, GEMV) kernel names the target selected for this weight type."""
        pair = self.linear.pair
        return pair.gemm.name, pair.gemv.name

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
            raise DTypeError(f"QuantizedLinear: input must be a float32 numpy array, got {got}")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise KernelShapeError(f"QuantizedLinear: input must be [..., {self.in_features}], got {list(x.shape)}")
        lead = x.shape[:-1]
        rows = np.ascontiguousarray(x).reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return np.zeros((*lead, self.out_features), np.float32)
        y = self.linear(rows)
        if self.bias is not None:
            y += self.bias
        return y.reshape(*lead, self.out_features)

    def __repr__(self) -> str:
        return (
            f"QuantizedLinear(in_features={self.in_features}, out_features={self.out_features}, "
            f"weight_type={self.weight_type.name}, bias={self.bias is not None}, target={self.target.name})"
        )
