"""Run by path on an aarch64 host (the tests run it under ``scripts/qemu-aarch64 --python``): both kernels of the
exact-weight family on the native tiles (the family's chain ``ukernels.COMPUTE``, which its jit and compiled plan
run) against the numpy reference, bit for bit, unclamped and through the jit execution clamped at 1 and 2 threads,
on random shapes with partial row and column groups, ±0 and other offsets (or only ±0: the blocks the tiles skip
the offset steps of), mixed magnitudes and no bias or one with −0 entries. Prints the tiles' ISA and one line per
kernel; exits 1 on a difference."""

from __future__ import annotations

import sys

import numpy as np

from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.qsi8d32p_qai8c16p import neon, ukernels

#: (m, n, k, share of ±0 offsets, with a bias)
CASES = [(1, 1, 32, 0.3, True), (1, 17, 64, 1.0, False), (1, 70, 96, 0.3, True), (2, 5, 32, 1.0, False),
         (3, 33, 96, 0.3, True), (5, 16, 128, 1.0, True), (9, 40, 64, 0.3, False)]  # fmt: skip


def agrees(kern: MatmulKernel, m: int, n: int, k: int, zeros: float, bias: bool, rng: np.random.Generator) -> bool:
    """One case on random operands (reference packers; row 0 starts with an all-zero block; offsets −0 for a share
    ``zeros`` of the blocks, +0 for some): the tiles == the reference unclamped, the jit == the reference clamped."""
    nb = k // 16
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, 1))).astype(np.float32)
    x[0, :32] = 0.0
    offset = (rng.standard_normal((n, nb)) * 0.1).astype(np.float32)
    offset[rng.random((n, nb)) < zeros] = -0.0
    offset[rng.random((n, nb)) < 0.05] = 0.0
    weights = {
        "scale": (rng.standard_normal((n, nb)) * 10.0 ** rng.integers(-4, 1, (n, nb))).astype(np.float32),
        "zero": offset,
        "bias": np.where(rng.random(n) < 0.3, -0.0, rng.standard_normal(n)).astype(np.float32) if bias else None,
    }
    lhs = kern.pack_lhs(x, execution="reference")
    rhs = kern.pack_rhs(n, k, rng.integers(-128, 128, (n, k), dtype=np.int8), execution="reference", **weights)
    lhs_c = np.asarray(lhs)[: kern.lhs_packed_size(m, k)].copy()
    rhs_c = np.asarray(rhs)[: kern.rhs_packed_size(n, k)].copy()
    tiles = ukernels.COMPUTE(m, n, k, kern.mr, kern.nr, kern.kr // kern.sr, lhs_c, rhs_c)
    outs = [tiles, kern._reference(m, n, k, lhs_c, rhs_c)]
    outs.append(kern.run(m, n, k, lhs, rhs, None, None, -0.5, 0.5, execution="reference"))
    jit = (
        kern.run(m, n, k, lhs, rhs, None, None, -0.5, 0.5, execution="jit", threads=t, min_split_macs=0) for t in (1, 2)
    )
    outs += list(jit)
    bits = [o.view(np.uint32) for o in outs]
    return np.array_equal(bits[0], bits[1]) and all(np.array_equal(bits[2], b) for b in bits[3:])


def main() -> int:
    if not (neon.AVAILABLE and ukernels.COMPUTE is neon.compute):
        print("no native tiles on this host")
        return 1
    print(f"native tiles: {neon.HOST_ISA.name}")
    rng = np.random.default_rng(7)
    differ = []
    for kern in ukernels.KERNELS:
        runs = [case for case in CASES if kern.kind == "gemm" or case[0] == 1]
        differ += [f"DIFFERENT {kern.name} {case}" for case in runs if not agrees(kern, *case, rng)]
        print(f"{kern.name}: {len(runs)} shapes, sdot")
    print("\n".join(differ), end="\n" if differ else "")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
