"""Run by path on an aarch64 host (the tests run it under ``scripts/qemu-aarch64 --python``): both kernels of the
exact-weight family on the native tiles (the family's chain ``ukernels.COMPUTE``, which its jit and compiled plan
run) against the numpy reference, bit for bit, unclamped and through the jit execution clamped at 1 and 2 threads,
on random shapes with partial row and column groups, ±0 and other offsets, mixed magnitudes and no bias or one with
−0 entries. Prints the tiles' ISA and one line per kernel; exits 1 on a difference."""

from __future__ import annotations

import sys

import numpy as np

from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.qsi8d32p_qai8c16p import neon, ukernels

SHAPES = [(1, 1, 32), (1, 17, 64), (1, 70, 96), (2, 5, 32), (3, 33, 96), (5, 16, 128), (9, 40, 64)]


def operands(kern: MatmulKernel, m: int, n: int, k: int, rng: np.random.Generator, bias: bool, zeros: float) -> tuple:
    """Packed LHS and RHS (reference packers): rows of mixed magnitudes (an all-zero block in row 0); offsets −0 for
    a share ``zeros`` of the blocks (the symmetric types' pattern; 1: all, which the tiles skip) and +0 for some."""
    nb = k // 16
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, 1))).astype(np.float32)
    x[0, :32] = 0.0
    codes = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = (rng.standard_normal((n, nb)) * 10.0 ** rng.integers(-4, 1, (n, nb))).astype(np.float32)
    offset = (rng.standard_normal((n, nb)) * 0.1).astype(np.float32)
    offset[rng.random((n, nb)) < zeros] = -0.0
    offset[rng.random((n, nb)) < 0.05] = 0.0
    b = np.where(rng.random(n) < 0.3, -0.0, rng.standard_normal(n)).astype(np.float32) if bias else None
    lhs = kern.pack_lhs(x, execution="reference")
    rhs = kern.pack_rhs(n, k, codes, scale=scale, zero=offset, bias=b, execution="reference")
    return lhs, rhs


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def main() -> int:
    if not neon.AVAILABLE or ukernels.COMPUTE is not neon.compute:
        print("no native tiles on this host")
        return 1
    print(f"native tiles: {neon.HOST_ISA.name}")
    rng = np.random.default_rng(7)
    failed = 0
    for kern in ukernels.KERNELS:
        checked = 0
        for m, n, k in SHAPES:
            if kern.kind == "gemv" and m > 1:
                continue
            lhs, rhs = operands(kern, m, n, k, rng, checked % 2 == 0, (0.3, 1.0)[checked % 2])
            lhs_c = np.asarray(lhs)[: kern.lhs_packed_size(m, k)].copy()
            rhs_c = np.asarray(rhs)[: kern.rhs_packed_size(n, k)].copy()
            got = ukernels.COMPUTE(m, n, k, kern.mr, kern.nr, kern.kr // kern.sr, lhs_c, rhs_c)
            same = bits_equal(kern._reference(m, n, k, lhs_c, rhs_c), got)
            clamp = (None, None, -0.5, 0.5)
            want = kern.run(m, n, k, lhs, rhs, *clamp, execution="reference")
            for threads in (1, 2):
                jit = kern.run(m, n, k, lhs, rhs, *clamp, execution="jit", threads=threads, min_split_macs=0)
                same = same and bits_equal(want, jit)
            if not same:
                print(f"DIFFERENT {kern.name} m={m} n={n} k={k}")
                failed += 1
            checked += 1
        print(f"{kern.name}: {checked} shapes, sdot")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
