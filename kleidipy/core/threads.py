"""The thread split of a matmul, as llama.cpp splits it, and the pool that runs the slices; which columns the SME
kernel computes when llama.cpp runs SME on some threads and NEON on the others (:func:`sme_columns`).

numba code releases the GIL (``nogil=True``), so Python threads run the slices of one matmul in parallel.
The thresholds below decide when a split pays for its hand-off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba

#: Smaller matmuls run on one thread: handing work to the pool costs tens of µs, more than they take.
MIN_SPLIT_MACS = 1 << 21
#: A GEMV is memory-bound: a second thread adds little bandwidth, so only very large ones are split
#: (measured: splitting TinyLlama-1.1B's GEMVs made decode slower at 2 threads than at 1).
GEMV_SPLIT_FACTOR = 64

#: llama.cpp's hybrid runs only on matmuls of at least this many rows (``too_small_for_hybrid``: ne11 < 128)
HYBRID_MIN_ROWS = 128

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def parallel_map(fn: Callable[[Any], None], items: list[Any], threads: int) -> None:
    """Run fn over items on up to ``threads`` threads (numba code releases the GIL with nogil=True)."""
    global _POOL
    if threads <= 1 or len(items) <= 1:
        for it in items:
            fn(it)
        return
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < threads:
            _POOL = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kleidipy")
        pool = _POOL
    futures = [pool.submit(fn, it) for it in items[1:]]
    fn(items[0])
    for f in futures:
        f.result()


@numba.njit(cache=True, nogil=True)
def sme_columns(m: int, n: int, nth: int, sme_threads: int, sme_step: int, neon_step: int) -> int:  # pragma: no cover
    """How many leading columns of an m x n MUL_MAT the SME kernel computes on ``nth`` threads, the rest going to the
    NEON fallback, as llama.cpp's ``compute_forward_qx`` decides with ``GGML_KLEIDIAI_SME=sme_threads`` and
    ``GGML_KLEIDIAI_CHUNK_MULTIPLIER=1`` (``sme_step``, ``neon_step``: the two GEMMs' n_step). nth <= sme_threads:
    all n (SME only); fewer than :data:`HYBRID_MIN_ROWS` rows or fewer than 2 columns a thread: 0 (NEON only); else
    hybrid: chunks of ceil(n / nth) columns rounded up to lcm(steps), chunk i taken first by thread i (the chunk
    counter starts at nth, so no thread takes a second), threads [0, sme_threads) the SME ones."""
    if nth <= sme_threads:
        return n
    if m < HYBRID_MIN_ROWS or max(1, n // nth) < 2:
        return 0
    a, b = sme_step, neon_step
    while b:
        a, b = b, a % b
    step = sme_step // a * neon_step
    chunk = (max(1, (n + nth - 1) // nth) + step - 1) // step * step
    return min(n, sme_threads * chunk)
