"""The KV cache of one sequence: K and V of every layer at every position, preallocated for n_ctx positions.

Cells are addressed by position (cell p holds the token at position p), as llama.cpp's unified cache is for a
single sequence. The storage type is selectable: float16 (llama.cpp's default ``type_k = type_v = F16``: values are
rounded to nearest even on store, and attention then also rounds Q and the softmax weights to F16) or float32.
:func:`check_context_size` refuses a context whose cache could not fit in the machine's memory, before anything
is allocated.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numba
import numpy as np

from kleidipy.core.numerics import F16_BITS_TO_F32
from kleidipy.errors import DTypeError, KleidipyError

CACHE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))


class ContextOverflowError(KleidipyError, ValueError):
    """Positions beyond the context size (n_ctx) the cache was made for."""


class PositionError(KleidipyError, ValueError):
    """Positions that are not consecutive or that leave a gap after the cached ones."""


class ContextSizeError(KleidipyError, ValueError):
    """A context size that is not a positive integer, or whose KV cache cannot fit in the machine's memory."""


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no limit known
        return None


def check_context_size(n_ctx: int, n_layer: int, n_head_kv: int, head_dim: int, dtype: type = np.float16) -> int:
    """``n_ctx`` if it is a positive integer whose K and V caches fit in physical memory (ContextSizeError if not)."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int | np.integer) or n_ctx <= 0:
        raise ContextSizeError(f"the context size must be a positive integer, got {n_ctx!r}")
    need = 2 * n_layer * n_head_kv * int(n_ctx) * head_dim * np.dtype(dtype).itemsize
    have = _physical_memory()
    if have is not None and need > have:
        raise ContextSizeError(
            f"a context of {n_ctx} tokens needs {need / 2**30:.1f} GiB of KV cache, more than the "
            f"{have / 2**30:.1f} GiB of memory of this machine: use a smaller context size"
        )
    return int(n_ctx)


@numba.njit(cache=True, nogil=True)
def _f16_to_f32(bits, table, out):  # pragma: no cover - compiled
    """out[...] = float32 value of the F16 bit patterns ``bits`` (numpy's float16 astype is several times slower)."""
    for h in range(bits.shape[0]):
        for p in range(bits.shape[1]):
            for c in range(bits.shape[2]):
                out[h, p, c] = table[bits[h, p, c]]


def check_cache_dtype(dtype: type) -> np.dtype:
    """The KV cache storage type: float16 (llama.cpp's default) or float32; DTypeError otherwise."""
    if np.dtype(dtype) not in CACHE_DTYPES:
        raise DTypeError(f"KV cache dtype must be float16 or float32, got {np.dtype(dtype)}")
    return np.dtype(dtype)


class KVCache:
    """K and V for ``n_layer`` layers, each ``[n_head_kv, n_ctx, head_dim]`` of ``dtype``.

    ``n_past`` is the number of positions filled (0..n_past-1). A batch may start at any position <= n_past: starting
    before n_past overwrites (rewinds) the cache from there.
    """

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int, dtype: type = np.float16) -> None:
        check_cache_dtype(dtype)
        check_context_size(n_ctx, n_layer, n_head_kv, head_dim, dtype)
        self.dtype = np.dtype(dtype)
        self.n_ctx = n_ctx
        shape = (n_layer, n_head_kv, n_ctx, head_dim)
        self.k = np.zeros(shape, self.dtype)
        self.v = np.zeros(shape, self.dtype)
        if self.dtype == np.float16:  # float32 copies of one layer's K and V, reused by every read
            self._k32 = np.empty(shape[1:], np.float32)
            self._v32 = np.empty(shape[1:], np.float32)
        #: K/V are F16, so attention rounds Q and the softmax weights to F16 too (ggml's vec_dot_f16)
        self.f16 = self.dtype == np.float16
        self.n_past = 0
        #: the token id at each filled cell (what a later prompt can reuse)
        self.tokens = np.zeros(n_ctx, np.int64)

    def check(self, start: int, m: int) -> None:
        """Raise unless positions start..start+m-1 can be written next."""
        if start < 0 or start > self.n_past:
            raise PositionError(f"batch starts at position {start} but the cache holds positions 0..{self.n_past - 1}")
        if start + m > self.n_ctx:
            raise ContextOverflowError(f"positions {start}..{start + m - 1} exceed the context size n_ctx={self.n_ctx}")

    def store(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write K and V ``[m, n_head_kv, head_dim]`` (float32) of positions start..start+m-1 (rounded to dtype)."""
        m = k.shape[0]
        self.k[layer, :, start : start + m] = k.transpose(1, 0, 2)
        self.v[layer, :, start : start + m] = v.transpose(1, 0, 2)

    def read(self, layer: int, n_kv: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions 0..n_kv-1 as float32 ``[n_head_kv, n_kv, head_dim]`` (F16 values are exact in F32).
        The arrays are valid until the next read."""
        k, v = self.k[layer, :, :n_kv], self.v[layer, :, :n_kv]
        if not self.f16:
            return k, v
        k32, v32 = self._k32[:, :n_kv], self._v32[:, :n_kv]
        _f16_to_f32(k.view(np.uint16), F16_BITS_TO_F32, k32)
        _f16_to_f32(v.view(np.uint16), F16_BITS_TO_F32, v32)
        return k32, v32

    def advance(self, start: int, ids: np.ndarray) -> None:
        """Mark positions start..start+len(ids)-1 as filled with tokens ``ids`` (after every layer stored them)."""
        self.tokens[start : start + len(ids)] = ids
        self.n_past = start + len(ids)

    def shared_prefix(self, ids: Sequence[int]) -> int:
        """How many of the first tokens of ``ids`` the cache holds (at most all but the last, whose logits the
        caller needs)."""
        n = min(self.n_past, len(ids) - 1)
        if n <= 0:
            return 0
        differ = np.flatnonzero(self.tokens[:n] != np.asarray(ids[:n]))
        return int(differ[0]) if differ.size else n

    def reuse(self, ids: Sequence[int]) -> int:
        """Keep the cached positions that hold the first tokens of ``ids`` (:meth:`shared_prefix`), forget the
        rest, and return how many were kept."""
        self.n_past = self.shared_prefix(ids)
        return self.n_past

    def clear(self) -> None:
        """Forget every position (the stored bytes are simply overwritten later)."""
        self.n_past = 0
