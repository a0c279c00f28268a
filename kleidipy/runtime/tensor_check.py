"""``--check-tensors``: every weight of a GGUF file is finite, checked in compiled code at load.

As llama.cpp's ``ggml_validate_row_data``: float tensors (F32, F16, BF16) value by value; quantized ones through
the float16 scales of their blocks (``d``, and ``m`` / ``dmin`` where the type has one), the only floats they
hold. A value is NaN or Inf when all its exponent bits are set, which the check reads from the top 16 bits of
each value (little-endian), so it never converts anything.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy.runtime.gguf_file import GGUFContainer, GGUFTensorError, Tensor

_F16_EXPONENT = 0x7C00
_BF16_EXPONENT = 0x7F80  # also the exponent of a float32's top 16 bits

#: ggml type -> (bytes per value or block, byte offsets of its 16-bit float tops inside it, exponent mask)
_FLOATS: dict[GGMLType, tuple[int, tuple[int, ...], int]] = {
    GGMLType.F32: (4, (2,), _BF16_EXPONENT),
    GGMLType.F16: (2, (0,), _F16_EXPONENT),
    GGMLType.BF16: (2, (0,), _BF16_EXPONENT),
    GGMLType.Q4_0: (18, (0,), _F16_EXPONENT),
    GGMLType.Q4_1: (20, (0, 2), _F16_EXPONENT),
    GGMLType.Q5_0: (22, (0,), _F16_EXPONENT),
    GGMLType.Q5_1: (24, (0, 2), _F16_EXPONENT),
    GGMLType.Q8_0: (34, (0,), _F16_EXPONENT),
    GGMLType.Q2_K: (84, (80, 82), _F16_EXPONENT),
    GGMLType.Q3_K: (110, (108,), _F16_EXPONENT),
    GGMLType.Q4_K: (144, (0, 2), _F16_EXPONENT),
    GGMLType.Q5_K: (176, (0, 2), _F16_EXPONENT),
    GGMLType.Q6_K: (210, (208,), _F16_EXPONENT),
}


class NonFiniteTensorError(GGUFTensorError):
    """A tensor of the model holds a NaN or an Inf."""


@numba.njit(cache=True, nogil=True)
def _first_non_finite(data, stride, offsets, mask):  # pragma: no cover - compiled
    """Byte offset of the first 16-bit float top (at ``offsets`` in each ``stride``-byte unit) whose exponent bits
    ``mask`` are all set, or -1."""
    for start in range(0, data.size - stride + 1, stride):
        for off in offsets:
            p = start + off
            if (data[p] | (np.uint16(data[p + 1]) << 8)) & mask == mask:
                return p
    return -1


def check_tensor(tensor: Tensor) -> int | None:
    """The row of ``tensor`` holding its first NaN/Inf, or None when every value is finite."""
    stride, offsets, mask = _FLOATS[tensor.ggml_type]
    flat = tensor.data.reshape(-1)
    at = _first_non_finite(flat, stride, np.array(offsets, np.int64), np.uint16(mask))
    return None if at < 0 else at // tensor.row_bytes


def check_tensors(model: GGUFContainer) -> None:
    """Raise NonFiniteTensorError naming the first tensor (and row) of ``model`` that is not finite."""
    for tensor in model.tensors.values():
        if tensor.ggml_type not in _FLOATS:
            continue  # not a type a model's weights may have (ModelFile refuses them): nothing to read it by
        row = check_tensor(tensor)
        if row is not None:
            raise NonFiniteTensorError(
                f"{model.path}: tensor '{tensor.name}' ({tensor.ggml_type.name}) has a NaN or Inf in row {row}"
            )
