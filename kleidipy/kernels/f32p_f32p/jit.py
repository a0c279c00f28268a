"""Numba code of the F32 MOPA family: the LHS pack (``f32p2vlx1``) and its inverse, which the matmul reads through
(the kernel's arithmetic is the layout's: :func:`kleidipy.kernels.pack.f32p_jit.matmul_f32_fma`, from +0 + bias)."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def lhs_pack_f32p(lhs, mr):
    """Rows of float32 [m, k] in groups of mr rows: value (g, c, r) — column c of row r of group g — at
    (g·k + c)·mr + r; the last group's rows past m are 0."""
    m, k = lhs.shape
    groups = (m + mr - 1) // mr
    out = np.zeros(groups * mr * k, np.float32)
    for i in range(m):
        base = (i // mr) * mr * k + i % mr
        for c in range(k):
            out[base + c * mr] = lhs[i, c]
    return out.view(np.uint8)


@numba.njit(cache=True, nogil=True)
def lhs_unpack_f32p(packed, m, k, mr):
    """The m rows of k float32 values (flat, row-major) of a packed LHS."""
    values = packed.view(np.float32)
    out = np.empty(m * k, np.float32)
    for i in range(m):
        base = (i // mr) * mr * k + i % mr
        for c in range(k):
            out[i * k + c] = values[base + c * mr]
    return out
