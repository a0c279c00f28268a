"""Arrays reached through a table of addresses inside compiled code: :func:`address_table` and the ``@njit``
accessors :func:`f32_1d`, :func:`f32_2d`, :func:`u8_1d` and :func:`like_4d`. The caller keeps the arrays alive for as
long as it passes their table.

Hand-written because numba's typed List, the maintained way to hand a list of arrays to nopython code, costs ~7 µs
per List argument at every call, which the plan paid seven times per decoded token on every thread; a table is one
array argument (~0.1 µs).

Details: docs/compiled-plan-execution.md."""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from kleidipy.core.pointers import f32_at, like_at, u8_at


def address_table(arrays: Sequence[np.ndarray], dtype: type | None) -> np.ndarray:
    """int64 [len(arrays), 5]: each array's data address and its shape (padded with 0s); every array must be a
    C-contiguous array of ``dtype`` (None: of any dtype, as compiled code expects it) with 1 to 4 dimensions."""
    table = np.zeros((len(arrays), 5), np.int64)
    for i, a in enumerate(arrays):
        if (dtype is not None and a.dtype != dtype) or not 1 <= a.ndim <= 4 or not a.flags.c_contiguous:
            raise ValueError(f"address_table: array {i} is {a.dtype} {a.shape}, not a C-contiguous {dtype}")
        table[i, 0] = a.ctypes.data
        table[i, 1 : 1 + a.ndim] = a.shape
    return table


@numba.njit(cache=True, nogil=True, inline="always")
def f32_2d(table, i):  # pragma: no cover - compiled
    """Row ``i`` of an :func:`address_table` of 2-D float32 arrays, as the array."""
    return f32_at(table[i, 0], (table[i, 1], table[i, 2]))


@numba.njit(cache=True, nogil=True, inline="always")
def f32_1d(table, i):  # pragma: no cover - compiled
    """Row ``i`` of an :func:`address_table` of 1-D float32 arrays, as the array."""
    return f32_at(table[i, 0], table[i, 1])


@numba.njit(cache=True, nogil=True, inline="always")
def u8_1d(table, i):  # pragma: no cover - compiled
    """Row ``i`` of an :func:`address_table` of 1-D uint8 arrays, as the array."""
    return u8_at(table[i, 0], table[i, 1])


@numba.njit(cache=True, nogil=True, inline="always")
def like_4d(table, i, like):  # pragma: no cover - compiled
    """Row ``i`` of an :func:`address_table` of 4-D arrays of the type of the scalar ``like``, as the array (a scalar
    argument: unboxed at a call for nothing, where a 0-size array costs microseconds cold)."""
    return like_at(like, table[i, 0], (table[i, 1], table[i, 2], table[i, 3], table[i, 4]))
