"""Packed buffers and the argument checks every packer and kernel shares.

:class:`PackedBuffer` is a uint8 array that remembers its :class:`PackedLayout` (the packer and every parameter
that shapes its bytes), so a kernel can refuse a buffer packed for another kernel or SVL; :class:`HugePageArena`
holds the bytes a decode step streams (the packed weights) in transparent huge pages; the executions
(``reference``, ``jit``, ``isa``), SVL values and the small validators live here too.
"""

from __future__ import annotations

import mmap
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import numpy as np

from kleidipy.errors import BufferSizeError, DTypeError, InvalidArgumentError, KernelShapeError, NonFiniteInputError

EXECUTIONS = ("reference", "jit", "isa")
DEFAULT_EXECUTION = "jit"
#: SVL values (bits) an SME/SME2 kernel can be built for.
SVL_CHOICES = (128, 256, 512, 1024, 2048)
#: Most threads a kernel call, a packer or the runtime takes (ggml's GGML_MAX_N_THREADS).
MAX_THREADS = 512


def check_execution(execution: str | None) -> str:
    execution = execution or DEFAULT_EXECUTION
    if execution not in EXECUTIONS:
        raise InvalidArgumentError(f"unknown execution {execution!r}: choose one of {', '.join(EXECUTIONS)}")
    return execution


def check_threads(threads: int) -> int:
    """Validate a thread count: an integer in 1..MAX_THREADS."""
    if isinstance(threads, bool) or not isinstance(threads, int | np.integer) or not 1 <= threads <= MAX_THREADS:
        raise InvalidArgumentError(f"thread count must be an integer in 1..{MAX_THREADS}, got {threads!r}")
    return int(threads)


def check_svl(svl_bits: int) -> int:
    """Validate an SME streaming vector length in bits (a power of two in 128..2048)."""
    if svl_bits not in SVL_CHOICES:
        raise KernelShapeError(f"SVL {svl_bits} is not a power of two in 128..2048 bits")
    return svl_bits


def roundup(a: int, b: int) -> int:
    return (a + b - 1) // b * b


# --------------------------------------------------------------------------------------------- buffers


@dataclass(frozen=True)
class PackedLayout:
    """Where a packed buffer came from: the packer and every parameter that shapes its bytes."""

    packer: str
    rows: int  # m for LHS, n for RHS
    k: int
    mr_or_nr: int
    kr: int
    sr: int
    bl: int | None = None


class PackedBuffer(np.ndarray):
    """A uint8 buffer written by a packer, remembering its :class:`PackedLayout`.

    It is an ordinary numpy array (compare it, save it, slice it); kernels use ``layout`` to refuse a
    buffer packed for another kernel or SVL. Plain uint8 arrays are accepted too (size checks only).
    """

    layout: PackedLayout | None

    def __new__(cls, data: np.ndarray, layout: PackedLayout) -> PackedBuffer:
        obj = np.asarray(data, dtype=np.uint8).view(cls)
        obj.layout = layout
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.layout = getattr(obj, "layout", None)


#: bytes of a transparent huge page (x86-64, and aarch64 with 4 KiB base pages)
HUGE_PAGE = 2 << 20


def huge_page_bytes(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of ``nbytes`` in private anonymous memory, 2 MiB aligned, that Linux is asked to back
    with transparent huge pages (``madvise(MADV_HUGEPAGE)``: the default "madvise" mode gives them to no other
    allocation); where that advice does not exist, ``np.zeros``."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return np.zeros(nbytes, np.uint8)
    try:
        region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as exc:
        raise MemoryError(f"cannot map {nbytes} bytes: {exc.strerror}") from None
    with suppress(OSError):  # (a kernel built without transparent huge pages: plain pages)
        region.madvise(advice)
    data = np.frombuffer(region, np.uint8)  # (holds the mapping until the last view goes)
    start = -data.ctypes.data % HUGE_PAGE
    return data[start : start + nbytes]


class HugePageArena:
    """64-byte aligned slices of :func:`huge_page_bytes` chunks, for the bytes every decoded token streams (the
    packed weights). With 4 KiB pages a 2048 x 2048 Q4_0 GEMV on one thread of the AMD EPYC VM read 30-31 GB/s, in
    huge pages 35 GB/s (the TLB misses of 4 KiB pages, one each 4 KiB of the stream; two threads read ~40 GB/s
    either way). A chunk holds CHUNK bytes, or one slice larger than that; what a chunk leaves when the next slice
    does not fit is never touched (address space, not memory)."""

    CHUNK = 64 << 20

    def __init__(self) -> None:
        self._free = np.empty(0, np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        """A zeroed uint8 array of ``nbytes`` from the arena."""
        need = roundup(nbytes, 64)
        if need > self._free.size:
            self._free = huge_page_bytes(max(need, self.CHUNK))
        out, self._free = self._free[:nbytes], self._free[need:]
        return out

    def keep(self, packed: PackedBuffer) -> PackedBuffer:
        """A copy of ``packed`` (same shape and layout) in the arena."""
        out = self.take(packed.nbytes).reshape(packed.shape)
        out[...] = packed
        return PackedBuffer(out, packed.layout)


def as_u8(buf: np.ndarray, what: str) -> np.ndarray:
    """A flat, contiguous uint8 view of a packed buffer (raises DTypeError for other dtypes)."""
    arr = np.asarray(buf)
    if arr.dtype != np.uint8:
        raise DTypeError(f"{what} must be a uint8 buffer, got {arr.dtype}")
    return np.ascontiguousarray(arr).reshape(-1).view(np.ndarray)


def check_finite(x: np.ndarray, who: str, what: str = "LHS") -> None:
    """NonFiniteInputError naming the first NaN/Inf of ``x`` (float arrays only; others are left to dtype checks)."""
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise NonFiniteInputError(f"{who}: {what} has NaN/Inf (first at index {tuple(int(i) for i in bad)})")


def as_f32_rows(x: np.ndarray, m: int, k: int, who: str, lhs_stride: int | None = None) -> np.ndarray:
    """View of m rows of k float32 values; lhs_stride is in bytes (KleidiAI's convention)."""
    if m < 0 or k <= 0:
        raise KernelShapeError(f"{who}: m={m}, k={k} must be m >= 0, k > 0")
    arr = np.asarray(x)
    if arr.dtype != np.float32:
        raise DTypeError(f"{who}: LHS must be float32, got {arr.dtype}")
    flat = np.ascontiguousarray(arr).reshape(-1)
    stride = k if lhs_stride is None else lhs_stride // 4
    if lhs_stride is not None and (lhs_stride % 4 or stride < k):
        raise KernelShapeError(f"{who}: lhs_stride {lhs_stride} bytes is not a multiple of 4 >= 4*k")
    need = (m - 1) * stride + k if m else 0
    if flat.size < need:
        raise BufferSizeError(f"{who}: LHS holds {flat.size} floats, {m}x{k} with stride {stride} needs {need}")
    rows = np.lib.stride_tricks.as_strided(flat, shape=(m, k), strides=(stride * 4, 4))
    return rows
