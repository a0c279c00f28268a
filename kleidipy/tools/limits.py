"""This machine's limits, measured: the memory read bandwidth a memory-bound kernel (the GEMV) can reach and the int8
multiply-add peak a compute-bound one (the GEMM) can reach, per thread count. ``benchmarks/kernels.py`` sets its
roofline by them and the server's Inside view (:mod:`kleidipy.server.inside`) sets the kernels' GB/s and GOPS
against them; :func:`host_limits` keeps a measurement in the cache folder, per CPU and thread count."""

from __future__ import annotations

import glob
import json
import platform
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numba
import numpy as np

from kleidipy.core import vnni
from kleidipy.runtime.pull import cache_dir


def last_level_cache() -> int:
    """Bytes of this host's largest CPU cache (Linux sysfs; 0 where it cannot be read)."""
    sizes = [0]
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes)


#: bytes a read must span to come from DRAM: twice the last-level cache, at least 512 MiB (an Intel Xeon VM here reports
#: a 480 MiB L3: a 160 MB cycle of GEMV weights or a 512 MiB read partly hit it). GEMV weights are cycled through
#: copies of this size; the read bandwidth reads this many bytes.
COLD_BYTES = max(512 << 20, 2 * last_level_cache())


def best_time(fn: Callable[[], object], repeat: int, min_seconds: float = 0.0) -> float:
    """Smallest wall time of ``repeat`` calls (more calls until ``min_seconds`` of measuring)."""
    fn()
    best, spent, calls = float("inf"), 0.0, 0
    while calls < repeat or spent < min_seconds:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, calls = min(best, dt), spent + dt, calls + 1
    return best


def on_threads(fn: Callable[[int], object], threads: int, pool: ThreadPoolExecutor) -> None:
    """fn(0) here and fn(1..threads-1) on the pool, concurrently."""
    futures = [pool.submit(fn, t) for t in range(1, threads)]
    fn(0)
    for f in futures:
        f.result()


#: memory streams a read takes at once, up to as many as the Q4_0 GEMV reads (far-apart panels): on some hosts (an
#: Intel Xeon VM here) a thread reads faster from two streams than from one, which the hardware prefetcher follows
#: only so far ahead (one thread: ~18 GB/s from one stream, ~22 from two, in one measurement)
READ_STREAMS = (1, 2, 4)
#: uint64 words a stream gives per turn: 512 bytes, 8 cache lines (a turn of one line each measured ~half as fast)
_TURN_WORDS = 64


@numba.njit(nogil=True, fastmath=True, cache=True)
def read_reduce(a: np.ndarray, streams: int = 1) -> int:
    """XOR of the 8-byte words of ``a`` (its bytes past a multiple of 8 left out), read as ``streams`` equal parts
    side by side, 512 bytes of each in turn (the words past ``streams`` whole parts of turns at the end). Each turn
    is a loop over a slice of its own, which LLVM vectorizes: indexing the words from the outer loops' counters kept
    it scalar, at 5-7 GB/s on an AMD EPYC VM where a numpy sum of the same array reads 27-35."""
    words = a[: a.size // 8 * 8].view(np.uint64)
    per = words.size // streams // _TURN_WORDS * _TURN_WORDS
    acc = np.uint64(0)
    for i in range(0, per, _TURN_WORDS):
        for s in range(streams):
            turn = words[s * per + i : s * per + i + _TURN_WORDS]
            for j in range(_TURN_WORDS):
                acc ^= turn[j]
    for i in range(streams * per, words.size):
        acc ^= words[i]
    return acc


def read_bandwidth(threads: int, pool: ThreadPoolExecutor, repeat: int) -> float:
    """GB/s of a streaming read of COLD_BYTES split across ``threads`` threads, each reading its part as each count
    of streams of READ_STREAMS (the fastest: the limit a memory-bound kernel can reach)."""
    buf = np.ones(COLD_BYTES, np.uint8)
    parts = np.array_split(buf, threads)
    seconds = min(
        best_time(lambda s=s: on_threads(lambda t: read_reduce(parts[t], s), threads, pool), repeat)
        for s in READ_STREAMS
    )
    return buf.nbytes / seconds / 1e9


#: vpdpbusd per chain of a peak measurement (12 chains): ~3 ms at two a cycle — a much shorter run (50,000 took
#: ~0.1 ms) measures the hand-off to the threads more than the instruction
PEAK_ITERS = 2_000_000


def peak_gops(threads: int, seconds: float) -> float:
    """int8 GOPS of a peak measurement on ``threads`` threads that took ``seconds`` (2 ops per multiply-add)."""
    return threads * 12 * PEAK_ITERS * 64 * 2 / seconds / 1e9


def dpbusd_peak(threads: int, pool: ThreadPoolExecutor, repeat: int) -> float:
    """int8 GOPS of independent vpdpbusd chains on ``threads`` threads."""
    fn = lambda: on_threads(lambda t: vnni.dpbusd_loop(vnni.HOST_ISA, PEAK_ITERS), threads, pool)  # noqa: E731
    return peak_gops(threads, best_time(fn, repeat))


@dataclass(frozen=True)
class HostLimits:
    """This machine's measured limits at ``threads`` threads."""

    cpu: str
    threads: int
    read_gbps: float  #: GB/s of a streaming read of COLD_BYTES (:func:`read_bandwidth`)
    int8_gops: float  #: int8 GOPS of vpdpbusd chains (:func:`dpbusd_peak`; 2 ops a multiply-add)
    isa: str  #: the instructions of the peak (``vnni.HOST_ISA``)


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_lock = threading.Lock()


def host_limits(threads: int, repeat: int = 3) -> HostLimits:
    """The limits at ``threads`` threads: read from ``limits.json`` in the cache folder when this CPU's were measured
    before, else measured now (a few seconds on every thread, 512 MiB read) and kept there."""
    path = cache_dir().parent / "limits.json"
    cpu = cpu_name()
    key = f"{cpu}|{threads}|{vnni.HOST_ISA.name}"
    with _lock:
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        if isinstance(known, dict) and isinstance(known.get(key), dict):
            try:
                return HostLimits(**known[key])
            except TypeError:
                pass  # (an older record: measured again)
        with ThreadPoolExecutor(max(threads - 1, 1)) as pool:
            limits = HostLimits(
                cpu, threads, read_bandwidth(threads, pool, repeat), dpbusd_peak(threads, pool, repeat),
                vnni.HOST_ISA.name,
            )  # fmt: skip
        known = known if isinstance(known, dict) else {}
        known[key] = asdict(limits)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(known, indent=1))
        except OSError:
            pass  # (measured again next time)
        return limits
