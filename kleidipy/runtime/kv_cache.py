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

import numpy as np

from kleidipy.errors import DTypeError, KleidipyError
from kleidipy.ops import attention

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


def check_cache_dtype(dtype: type) -> np.dtype:
    """The KV cache storage type: float16 (llama.cpp's default) or float32; DTypeError otherwise."""
    if np.dtype(dtype) not in CACHE_DTYPES:
        raise DTypeError(f"KV cache dtype must be float16 or float32, got {np.dtype(dtype)}")
    return np.dtype(dtype)


class KVCache:
    """K and V for ``n_layer`` layers of ``dtype``, in the layout attention reads (:mod:`kleidipy.ops.attention`:
    blocks of 16 cells): K ``[n_layer, n_head_kv, nb, head_dim·16]``, V ``[n_layer, n_head_kv, 16, nb·head_dim]``,
    nb = n_ctx / 16 rounded up (cells n_ctx.. of the last block are padding, never written nor read).

    ``n_past`` is the number of positions filled (0..n_past-1). A batch may start at any position <= n_past: starting
    before n_past overwrites (rewinds) the cache from there.
    """

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int, dtype: type = np.float16) -> None:
        check_cache_dtype(dtype)
        check_context_size(n_ctx, n_layer, n_head_kv, head_dim, dtype)
        self.dtype = np.dtype(dtype)
        self.n_ctx = n_ctx
        nb = attention.cache_blocks(n_ctx)
        self.k = np.zeros((n_layer, n_head_kv, nb, head_dim * attention.LANES), self.dtype)
        self.v = np.zeros((n_layer, n_head_kv, attention.LANES, nb * head_dim), self.dtype)
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
        m, n_head_kv = k.shape[0], k.shape[1]
        kc, vc = self.layer(layer)
        k2 = np.ascontiguousarray(k, np.float32).reshape(m, -1)
        v2 = np.ascontiguousarray(v, np.float32).reshape(m, -1)
        attention.store_kv(k2, v2, kc, vc, start, m, 0, n_head_kv)

    def layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """K ``[n_head_kv, nb, head_dim·16]`` and V ``[n_head_kv, 16, nb·head_dim]`` of one layer as the compiled ops
        take them: F16 bit patterns (uint16 views) or float32."""
        return attention.cells(self.k[layer]), attention.cells(self.v[layer])

    def read(self, layer: int, n_kv: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions 0..n_kv-1 of one layer as stored, ``[n_head_kv, n_kv, head_dim]`` each, of ``dtype``
        (copies, position by position)."""
        h, nb = self.k.shape[1], self.k.shape[2]
        d = self.k.shape[3] // attention.LANES
        k = self.k[layer].reshape(h, nb, d, attention.LANES).transpose(0, 1, 3, 2).reshape(h, nb * attention.LANES, d)
        v = self.v[layer].reshape(h, attention.LANES, nb, d).transpose(0, 2, 1, 3).reshape(h, nb * attention.LANES, d)
        return k[:, :n_kv].copy(), v[:, :n_kv].copy()

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
