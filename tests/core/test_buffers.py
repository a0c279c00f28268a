"""The packed weights' arena (kleidipy.core.buffers.HugePageArena): zeroed, writable, 64-byte aligned slices that do
not overlap, a slice larger than a chunk, a copy that keeps a packed buffer's bytes and layout; on Linux, chunks
are 2 MiB aligned private anonymous mappings (asked for transparent huge pages)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from kleidipy.core.buffers import HUGE_PAGE, HugePageArena, PackedBuffer, PackedLayout, huge_page_bytes


def _mapping(a: np.ndarray) -> object:
    """The object that owns an array's memory (a view's base, a buffer's exporter)."""
    owner = a
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner.obj if isinstance(owner, memoryview) else owner


def test_arena_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HugePageArena, "CHUNK", 1 << 20)
    arena = HugePageArena()
    sizes = [1, 63, 64, 100_000, (1 << 20) + 5, 7, 900_000]
    got = [arena.take(n) for n in sizes]
    for a, n in zip(got, sizes, strict=True):
        assert a.size == n and a.dtype == np.uint8 and a.ctypes.data % 64 == 0 and not a.any()
        a[:] = 0xAB
    spans = sorted((a.ctypes.data, a.ctypes.data + a.size) for a in got)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    assert all((a == 0xAB).all() for a in got)  # (no slice wrote over another)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert got[0].ctypes.data % HUGE_PAGE == 0 and got[4].ctypes.data % HUGE_PAGE == 0  # (a new chunk each)
        assert isinstance(_mapping(got[0]), mmap.mmap)


def test_huge_page_bytes_is_zeroed_and_aligned() -> None:
    a = huge_page_bytes(3 * HUGE_PAGE + 1)
    assert a.size == 3 * HUGE_PAGE + 1 and not a.any() and a.flags.writeable
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert a.ctypes.data % HUGE_PAGE == 0


def test_keep_copies_bytes_and_layout() -> None:
    layout = PackedLayout("kai_run_rhs_pack_test", rows=3, k=100, mr_or_nr=1, kr=1, sr=1, bl=32)
    packed = PackedBuffer(np.arange(300, dtype=np.uint8).reshape(3, 100), layout)
    kept = HugePageArena().keep(packed)
    assert isinstance(kept, PackedBuffer) and kept.layout == layout and kept.shape == packed.shape
    assert np.array_equal(kept, packed) and not np.shares_memory(kept, packed)
