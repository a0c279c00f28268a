"""Compiled GET_ROWS: float32 rows of a GGUF tensor's bytes for the types a token embedding usually has (F32, F16,
Q4_0, Q4_1, Q5_0, Q8_0), with the arithmetic of gguf's numpy dequantizers (ggml's ``dequantize_row_*``:
``d·(q − 8)``, ``d·q + m`` rounded twice, ``d·(q − 16)``, ``d·q``).

Hand-written because the embedding lookup runs once per decoded token: gguf's dequantizer spends 20–40 µs of
numpy calls on one row, this takes about a microsecond. Types not in :data:`CODES` go to gguf.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType

from kleidipy.core.numerics import F16_BITS_TO_F32

_T = GGMLQuantizationType
#: the types with a compiled row dequantizer, and the code :func:`get_rows` takes for each
CODES = {_T.F32: 0, _T.F16: 1, _T.Q4_0: 2, _T.Q4_1: 3, _T.Q5_0: 4, _T.Q8_0: 5}


@numba.njit(cache=True, nogil=True, inline="always")
def _f16(row, at):  # pragma: no cover - compiled
    return F16_BITS_TO_F32[np.int64(row[at]) | (np.int64(row[at + 1]) << 8)]


@numba.njit(cache=True, nogil=True)
def get_rows(code, raw, ids, out):  # pragma: no cover - compiled
    """out[i] = the values of row ids[i] of the uint8 tensor bytes raw [rows, row_bytes] (type ``code``)."""
    k = out.shape[1]
    for i in range(ids.size):
        row = raw[ids[i]]
        dst = out[i]
        if code == 0:
            src = row.view(np.float32)
            for j in range(k):
                dst[j] = src[j]
        elif code == 1:
            for j in range(k):
                dst[j] = _f16(row, 2 * j)
        elif code == 5:
            q = row.view(np.int8)
            for b in range(k // 32):
                d = _f16(row, 34 * b)
                for j in range(32):
                    dst[32 * b + j] = d * np.float32(q[34 * b + 2 + j])
        elif code == 3:
            for b in range(k // 32):
                d, m = _f16(row, 20 * b), _f16(row, 20 * b + 2)
                for j in range(16):
                    byte = row[20 * b + 4 + j]
                    dst[32 * b + j] = d * np.float32(byte & 15) + m
                    dst[32 * b + 16 + j] = d * np.float32(byte >> 4) + m
        elif code == 2:
            for b in range(k // 32):
                d = _f16(row, 18 * b)
                for j in range(16):
                    byte = np.int32(row[18 * b + 2 + j])
                    dst[32 * b + j] = d * np.float32((byte & 15) - 8)
                    dst[32 * b + 16 + j] = d * np.float32((byte >> 4) - 8)
        else:  # Q5_0: d, 32 high bits, 16 bytes of low nibbles
            for b in range(k // 32):
                d = _f16(row, 22 * b)
                qh = (
                    np.int64(row[22 * b + 2])
                    | (np.int64(row[22 * b + 3]) << 8)
                    | (np.int64(row[22 * b + 4]) << 16)
                    | (np.int64(row[22 * b + 5]) << 24)
                )
                for j in range(16):
                    byte = np.int64(row[22 * b + 6 + j])
                    lo = (byte & 15) | (((qh >> j) & 1) << 4)
                    hi = (byte >> 4) | (((qh >> (j + 16)) & 1) << 4)
                    dst[32 * b + j] = d * np.float32(lo - 16)
                    dst[32 * b + 16 + j] = d * np.float32(hi - 16)
