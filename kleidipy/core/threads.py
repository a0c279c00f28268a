"""The thread split of a matmul, as llama.cpp splits it, and the pool that runs the slices.

numba code releases the GIL (``nogil=True``), so Python threads run the slices of one matmul in parallel.
The thresholds below decide when a split pays for its hand-off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: Smaller matmuls run on one thread: handing work to the pool costs tens of µs, more than they take.
MIN_SPLIT_MACS = 1 << 21
#: A GEMV is memory-bound: a second thread adds little bandwidth, so only very large ones are split
#: (measured: splitting TinyLlama-1.1B's GEMVs made decode slower at 2 threads than at 1).
GEMV_SPLIT_FACTOR = 64

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
