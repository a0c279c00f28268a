"""Benchmark of the attention node (``kleidipy.ops.attention.attention``, the function both executions call) on
one thread, for the head shapes of the benchmark models: a prefill of m rows from an empty F16 cache (causal; the
batch path: KQ, softmax and KQV tiles over ROWS query rows at a time) and a decode step of one row over n cells (the
path reading the cache itself), the decode step also from a cold cache (a 64 MB buffer read before each run, as a
decoded token's weights go through the caches before its attention reads the KV cache). Prints per layer the time
and the useful float throughput (2 flops per multiply-add of KQ and KQV over the unmasked cells), and the prefill on
two threads split as the ATTENTION node splits it (heads, or row groups interleaved when the heads do not go evenly)
with its speed-up. Best of several runs.

    python benchmarks/attention.py [-m 512] [--reps 7]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kleidipy.ops import attention as att
from kleidipy.runtime.kv_cache import KVCache

#: (model, query heads, KV heads, head_dim, sliding window or 0)
SHAPES = [
    ("SmolLM2-135M", 9, 3, 64, 0),
    ("Qwen2.5-0.5B", 14, 2, 64, 0),
    ("TinyLlama-1.1B", 32, 4, 64, 0),
    ("Gemma-3-270m (local layer)", 4, 1, 256, 512),
]


def _best(fn, reps: int, before=None) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _case(
    n_head: int, n_kv: int, d: int, window: int, m: int, start: int, reps: int, cold: bool, threads: int = 1
) -> tuple[float, float]:
    """Seconds of one attention call of m rows at positions start.. over an F16 cache on ``threads`` threads (split
    as the ATTENTION node splits it, ``graph.nodes``), and its useful flops."""
    rng = np.random.default_rng(0)
    n_ctx = start + m
    q = rng.standard_normal((m, n_head, d)).astype(np.float32)
    cache = KVCache(1, n_kv, d, n_ctx)
    cache.store(0, 0, *rng.standard_normal((2, n_ctx, n_kv, d)).astype(np.float32))
    out = np.empty((m, n_head * d), np.float32)
    scratch = [np.empty(att.attention_scratch_size(n_ctx, d), np.float32) for _ in range(threads)]
    args = (q, *cache.layer(0), start, m, n_ctx, d**-0.5, window, True, out)
    even = n_head % threads == 0 or m < threads * att.ROWS

    def share(ith: int) -> None:
        if even:  # a share of the heads, every row
            att.attention(*args, scratch[ith], ith * n_head // threads, (ith + 1) * n_head // threads, 0, 1)
        else:  # every head, every threads-th group of rows
            att.attention(*args, scratch[ith], 0, n_head, ith, threads)

    evict = np.ones(64 << 17) if cold else None
    with ThreadPoolExecutor(threads) as pool:  # (one thread: called directly, no pool's dispatch timed)
        run = (lambda: share(0)) if threads == 1 else lambda: list(pool.map(share, range(threads)))
        seconds = _best(run, reps, None if evict is None else evict.sum)
    cells = sum(min(p + 1, window or p + 1) for p in range(start, start + m))
    return seconds, 4.0 * d * n_head * cells


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", type=int, default=512, help="prefill rows, and the cells a decode step reads (default 512)")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    print("| model | heads / KV heads × dim | case | ms per layer | GFLOP/s | 2 threads: ms | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for name, n_head, n_kv, d, window in SHAPES:
        cases = [(f"prefill {args.m}", args.m, 0, False), (f"decode at {args.m}", 1, args.m - 1, False)]
        for case, m, start, cold in [*cases, (f"decode at {args.m}, cold", 1, args.m - 1, True)]:
            seconds, flops = _case(n_head, n_kv, d, window, m, start, args.reps, cold)
            two = f"{_case(n_head, n_kv, d, window, m, start, args.reps, cold, 2)[0] * 1e3:.3f}" if m > 1 else ""
            ratio = f"{seconds * 1e3 / float(two):.2f}×" if two else ""
            print(
                f"| {name} | {n_head} / {n_kv} × {d} | {case} | {seconds * 1e3:.3f} | {flops / seconds / 1e9:.1f} "
                f"| {two} | {ratio} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
