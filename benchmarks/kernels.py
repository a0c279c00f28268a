"""Benchmark of the Q4_0 SME2-layout kernels on the host: GEMV weight bandwidth and GEMM int8 throughput.

For n×k in {2048×2048, 5632×2048, 2048×5632, 8192×3072}, m in {1, 16, 128, 512} and 1 and 2 threads it times
the MUL_MAT (the MOPA GEMM for m > 1, the SDOT GEMV for m = 1, SVL 512) through the path the runtime calls (the
compiled plan's MUL_MAT node, ``kleidipy.graph.matmul.mul_mat``, on the persistent workers: each thread packs its
share of the LHS, a barrier, its share of the columns) and the LHS quantize+pack alone, and prints a markdown
table next to this machine's measured memory read bandwidth and vpdpbusd peak (so the % of roofline); the
"compute-only" columns call the AVX-512 VNNI tiles directly on an already packed LHS. Timings are the best of
several runs (other processes on the machine make single runs noisy; ``--cpu-time`` times by process CPU time per
thread, which leaves out the time they hold the cores). ``--quick``: fewer shapes and repetitions.

    python benchmarks/kernels.py [--quick] [--cpu-time]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from kleidipy.core import vnni
from kleidipy.graph import matmul as mm
from kleidipy.graph.matmul import NodeKernel, node_kernel
from kleidipy.graph.workers import SYNC_FIRST_FREE, Workers, share
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni as vk
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni_pack as vk_pack
from kleidipy.tools.limits import (
    COLD_BYTES,
    PEAK_ITERS,
    READ_STREAMS,
    best_time,
    dpbusd_peak,
    on_threads,
    peak_gops,
    read_bandwidth,
    read_reduce,
)

SVL = 512
GEMM = "kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
GEMV = "kai_matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot"
SHAPES = [(2048, 2048), (5632, 2048), (2048, 5632), (8192, 3072)]
ROWS = [1, 16, 128, 512]


# --------------------------------------------------------------------------------------------- machine


@numba.njit(nogil=True, cache=True)
def _read_share(ith: int, nth: int, sync: np.ndarray, a: np.ndarray, streams: int) -> None:
    """Thread ith's share of a read of ``a``'s whole cache lines as ``streams`` streams (a :class:`Workers` run:
    the alternate roofline of a GEMV runs on the threads the node runs on)."""
    lo, hi = share(a.size // 64, ith, nth)
    sync[SYNC_FIRST_FREE + ith] = np.int64(read_reduce(a[lo * 64 : hi * 64], streams))


@numba.njit(nogil=True, cache=True)
def _dpbusd_share(ith: int, nth: int, sync: np.ndarray, isa: object, iters: int) -> None:
    """Thread ith's vpdpbusd chains (a :class:`Workers` run, as :func:`_read_share`)."""
    sync[SYNC_FIRST_FREE + ith] = vnni.dpbusd_loop(isa, iters)


# --------------------------------------------------------------------------------------------- kernels


class Path:
    """How the runtime runs a MUL_MAT: a node of the compiled plan (``kleidipy.graph.matmul.mul_mat``: every thread
    quantizes+packs its share of the activations, a barrier, then computes its share of the columns) on persistent
    workers, as ``kleidipy.graph.execute`` runs it."""

    name = "the compiled plan's MUL_MAT node (the runtime's path)"

    def __init__(self) -> None:
        self.gemm, self.gemv = get_kernel(GEMM, SVL), get_kernel(GEMV, SVL)
        self.nodes: dict[tuple[bool, int, int], NodeKernel] = {}  # by (GEMV, n, k): a node holds no weights
        self.workers = {t: Workers(t) for t in (1, 2)}
        self.status = np.zeros(1, np.int64)
        self.untimed = np.zeros((0, 1, 3), np.int64)

    def pack_rhs(self, n: int, k: int, blocks: np.ndarray) -> np.ndarray:
        return np.asarray(self.gemm.pack_rhs(n, k, blocks))

    def node(self, m: int, n: int, k: int, rhs: np.ndarray) -> NodeKernel:
        key = (m == 1, n, k)  # (never id(rhs): a freed copy's id comes back for a matrix of another shape)
        if key not in self.nodes:
            self.nodes[key] = node_kernel((self.gemv if m == 1 else self.gemm).prepare(n, k, rhs))
        return self.nodes[key]

    def pack_lhs(self, x: np.ndarray, n: int, rhs: np.ndarray) -> np.ndarray:
        """The LHS quantize+pack alone, on the calling thread."""
        node = self.node(x.shape[0], n, x.shape[1], rhs)
        out = np.empty(node.lhs_bytes(x.shape[0]), np.uint8)
        mm.pack_lhs(node.params, x, x.shape[0], out, 0, 1)
        return out

    def run(self, x: np.ndarray, n: int, rhs: np.ndarray, out: np.ndarray, lhs: np.ndarray, threads: int) -> None:
        """The whole node: out[:m] = x @ W^T on ``threads`` workers."""
        m, k = x.shape
        node = self.node(m, n, k, rhs)
        args = (node.params, x, m, lhs, rhs, out, n, self.status, self.untimed, 0)
        self.workers[threads].run(mm.mul_mat, args)


def run_direct(m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, threads: int, pool) -> np.ndarray:  # noqa: ANN001
    """The VNNI compute called directly, columns split in multiples of nr across threads (no library layer)."""
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
    mr, nr = (1 if m == 1 else SVL // 32), 4 * SVL // 32
    fmul = m > 1
    if threads == 1:
        return vk.compute(m, n, k, mr, nr, lhs, rhs, fmul)
    per = -(-n // (nr * threads)) * nr
    out = np.empty((m, n), np.float32)
    stride = nr * k // 32 * 18

    def part(t: int) -> None:
        s, e = t * per, min(n, (t + 1) * per)
        if s < e:
            out[:, s:e] = vk.compute(m, e - s, k, mr, nr, lhs, rhs[s // nr * stride :], fmul)

    on_threads(part, threads, pool)
    return out


def q4_0_weights(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Random GGML Q4_0 blocks [n, k/32, 18]."""
    blocks = rng.integers(0, 256, (n, k // 32, 18), dtype=np.uint8)
    d = rng.uniform(-0.02, 0.02, (n, k // 32)).astype(np.float16).view(np.uint8).reshape(n, k // 32, 2)
    blocks[:, :, :2] = d
    return blocks


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two shapes, fewer repetitions")
    ap.add_argument(
        "--cpu-time", action="store_true", help="time by process CPU time per thread (a busy machine), not wall time"
    )
    args = ap.parse_args(argv)
    shapes = SHAPES[:1] + SHAPES[-1:] if args.quick else SHAPES
    repeat = 3 if args.quick else 7
    pool = ThreadPoolExecutor(2)
    rng = np.random.default_rng(0)
    path = Path()

    bw = {t: read_bandwidth(t, pool, repeat) for t in (1, 2)}
    peak = {t: dpbusd_peak(t, pool, repeat) for t in (1, 2)}
    clock = "process CPU time per thread" if args.cpu_time else "wall time"
    print(f"host ISA: {vnni.HOST_ISA.name}; path: {path.name}; SVL {SVL}; {clock}; load {os.getloadavg()[0]:.1f}")
    print(f"memory read bandwidth: {bw[1]:.1f} GB/s (1 thread), {bw[2]:.1f} GB/s (2 threads)")
    print(f"vpdpbusd peak: {peak[1]:.0f} GOPS (1 thread), {peak[2]:.0f} GOPS (2 threads)")
    print("roofline column: the same measurement made alternately with the matmul on the same worker threads (read")
    print("of the same weights as 1, 2 and 4 streams, the fastest, for the GEMV; vpdpbusd chains for the GEMM), so")
    print("both see the same load from other processes; memory read bandwidth: the fastest of 1, 2 and 4 streams;")
    print("compute-only columns: the VNNI compute called directly on a packed LHS (no LHS pack, clamp, copy,")
    print("thread pool).\n")
    print(
        "| n×k | m | threads | matmul ms | weights GB/s | int8 GOPS | roofline | % of roofline "
        f"| compute-only ms | compute-only % | {PACK_COLUMNS} |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        for row in bench_shape(path, rng, n, k, repeat, pool, args.cpu_time):
            print(row, flush=True)


PACK_COLUMNS = "LHS pack µs (path) | LHS pack µs (vnni)"


def best_interleaved(
    fns: list[Callable[[], object]], repeat: int, min_seconds: float, clock: Callable[[], float]
) -> list[float]:
    """Best time of each function by ``clock``, calling them in turn (``repeat`` rounds, more until min_seconds)."""
    for fn in fns:
        fn()
    best, spent, rounds = [float("inf")] * len(fns), 0.0, 0
    while rounds < repeat or spent < min_seconds:
        for i, fn in enumerate(fns):
            t0 = clock()
            fn()
            dt = clock() - t0
            best[i], spent = min(best[i], dt), spent + dt
        rounds += 1
    return best


def bench_shape(path: Path, rng, n: int, k: int, repeat: int, pool, cpu: bool):  # noqa: ANN001, ANN201
    """Table rows of one n×k: every m, 1 and 2 threads."""
    blocks = q4_0_weights(rng, n, k)
    rhs = path.pack_rhs(n, k, blocks)
    copies = [rhs] + [rhs.copy() for _ in range(COLD_BYTES // rhs.nbytes)]
    turn = iter(range(1 << 62))
    for m in ROWS:
        x = rng.normal(size=(m, k)).astype(np.float32)
        lhs = path.pack_lhs(x, n, rhs)  # the compute-only columns' input; the node packs into its own buffer
        scratch, out = np.empty_like(lhs), np.empty((m, n), np.float32)
        mr = 1 if m == 1 else SVL // 32
        pack_path = best_time(lambda: path.pack_lhs(x, n, rhs), repeat) * 1e6  # noqa: B023
        pack_vnni = best_time(lambda: vk_pack.lhs_quant_pack_qsi8d32p_f32_neon(x, mr), repeat) * 1e6  # noqa: B023
        for threads in (1, 2):
            # CPU time of the process per thread leaves out the time other processes hold the cores
            clock = (lambda t=threads: time.process_time() / t) if cpu else time.perf_counter
            if m == 1:  # GEMV: weight copies larger than the caches (they come from DRAM), vs reading them

                def matmul() -> None:
                    path.run(x, n, copies[next(turn) % len(copies)], out, scratch, threads)  # noqa: B023

                def direct() -> None:
                    run_direct(m, n, k, lhs, copies[next(turn) % len(copies)], threads, pool)  # noqa: B023

                def roof(streams: int) -> None:
                    weights = copies[next(turn) % len(copies)]  # noqa: B023
                    path.workers[threads].run(_read_share, (weights, streams))  # noqa: B023

                roofs = [lambda s=s: roof(s) for s in READ_STREAMS]  # noqa: B023
                seconds, bare, *refs = best_interleaved([matmul, direct, *roofs], 5 * repeat, 0.1, clock)
                ref = min(refs)
                roofline = rhs.nbytes / ref / 1e9
                value, bare_value, unit = rhs.nbytes / seconds / 1e9, rhs.nbytes / bare / 1e9, "GB/s read"
            else:  # GEMM vs vpdpbusd chains

                def matmul() -> None:
                    path.run(x, n, rhs, out, scratch, threads)  # noqa: B023

                def direct() -> None:
                    run_direct(m, n, k, lhs, rhs, threads, pool)  # noqa: B023

                def roof() -> None:
                    path.workers[threads].run(_dpbusd_share, (vnni.HOST_ISA, PEAK_ITERS))  # noqa: B023

                seconds, bare, ref = best_interleaved([matmul, direct, roof], repeat, 0.0, clock)
                roofline = peak_gops(threads, ref)
                value, bare_value, unit = 2 * m * n * k / seconds / 1e9, 2 * m * n * k / bare / 1e9, "GOPS peak"
            gbs, gops = rhs.nbytes / seconds / 1e9, 2 * m * n * k / seconds / 1e9
            yield (
                f"| {n}×{k} | {m} | {threads} | {seconds * 1e3:.3f} | {gbs:.1f} | {gops:.0f} | "
                f"{roofline:.0f} {unit} | {100 * value / roofline:.0f} % | {bare * 1e3:.3f} | "
                f"{100 * bare_value / roofline:.0f} % | {pack_path:.0f} | {pack_vnni:.0f} |"
            )


if __name__ == "__main__":
    main()
