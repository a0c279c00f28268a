"""Run by path on an aarch64 host (the tests run it under ``scripts/qemu-aarch64 --python``): every NEON kernel of the
Q4_0 family on the native tiles (the jit execution) against the numpy reference, bit for bit, on random shapes
with partial row and column groups. Prints the tiles' ISA and one line per kernel; exits 1 on a difference."""

from __future__ import annotations

import sys

import numpy as np

from kleidipy.kernels.catalogue import all_kernels
from kleidipy.kernels.qsi8d32p_qsi4c32p import neon

SHAPES = [(1, 1, 32), (1, 7, 64), (1, 130, 96), (2, 5, 32), (3, 9, 96), (5, 13, 128), (9, 66, 64), (17, 8, 160)]


def main() -> int:
    if not neon.AVAILABLE:
        print("no native tiles on this host")
        return 1
    print(f"native tiles: {neon.HOST_ISA.name}")
    rng = np.random.default_rng(7)
    failed = 0
    for kern in all_kernels():
        if kern.family != "qsi8d32p_qsi4c32p" or kern.is_sme:
            continue
        checked = 0
        for m, n, k in SHAPES:
            if kern.kind == "gemv" and m > 1:
                continue
            x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
            blocks = rng.integers(0, 256, (n, k // 32, 18), dtype=np.uint8)
            blocks[:, :, 1] &= 0x3B  # finite fp16 scales
            lhs = kern.pack_lhs(x, execution="reference")
            rhs = kern.pack_rhs(n, k, blocks.reshape(-1), execution="reference")
            want = kern.run(m, n, k, lhs, rhs, execution="reference")
            got = kern.run(m, n, k, lhs, rhs, execution="jit")
            if not np.array_equal(want.view(np.uint32), got.view(np.uint32)):
                print(f"DIFFERENT {kern.name} m={m} n={n} k={k}")
                failed += 1
            checked += 1
        print(f"{kern.name}: {checked} shapes, {neon.instruction(kern.mr, kern.kr, neon.HOST_ISA)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
