"""Run by path on an aarch64 host (the tests run it under ``scripts/qemu-aarch64 --python``): every NEON kernel of the
Q4_1 family on the native tiles (the family's chain ``ukernels.NEON_COMPUTE``, which its jit and compiled plan run)
against the numpy reference, bit for bit, on random shapes with partial row and column groups, mixed magnitudes,
signed zeros and subnormal scales; the SME2 kernels through ``ukernels.SME2_COMPUTE`` (the portable loops)
likewise. Prints the tiles' ISA and one line per kernel; exits 1 on a difference."""

from __future__ import annotations

import sys

import numpy as np

from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.catalogue import all_kernels
from kleidipy.kernels.qsi8d32p_qai4c32p import neon, ukernels

SHAPES = [(1, 1, 32), (1, 7, 64), (1, 130, 96), (2, 5, 32), (3, 9, 96), (5, 13, 128), (9, 66, 64), (17, 8, 160)]


def mixed(rng: np.random.Generator, shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
    """Mixed-sign float32 of magnitudes in [lo, hi] (log-uniform), some ±0 and some subnormal."""
    v = (np.exp(rng.uniform(np.log(lo), np.log(hi), shape)) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    v[rng.random(shape) < 0.05] = 0.0
    v[rng.random(shape) < 0.05] = -0.0
    v[rng.random(shape) < 0.03] = np.float32(1e-40)
    return v


def operands(kern: MatmulKernel, m: int, n: int, k: int, rng: np.random.Generator, bias: bool) -> tuple:
    """Packed LHS and RHS (reference packers): rows of mixed magnitudes (an all-zero block in row 0), bias with
    −0.0 entries or none."""
    nb = k // 32
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, 1))).astype(np.float32)
    x[0, :32] = 0.0
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scale, zero = mixed(rng, (n, nb), 1e-4, 0.1), mixed(rng, (n, nb), 1e-3, 1.0)
    b = np.where(rng.random(n) < 0.3, -0.0, rng.standard_normal(n)).astype(np.float32) if bias else None
    lhs = kern.pack_lhs(x, execution="reference")
    rhs = kern.pack_rhs(n, k, codes, scale=scale, zero=zero, bias=b, execution="reference")
    return lhs, rhs


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def main() -> int:
    if not neon.AVAILABLE or ukernels.NEON_COMPUTE is not neon.compute:
        print("no native tiles on this host")
        return 1
    print(f"native tiles: {neon.HOST_ISA.name}")
    rng = np.random.default_rng(7)
    failed = 0
    for kern in all_kernels():
        if kern.family != "qsi8d32p_qai4c32p":
            continue
        checked = 0
        for m, n, k in SHAPES:
            if kern.kind == "gemv" and m > 1:
                continue
            lhs, rhs = operands(kern, m, n, k, rng, checked % 2 == 0)
            lhs_c = np.asarray(lhs)[: kern.lhs_packed_size(m, k)].copy()
            rhs_c = np.asarray(rhs)[: kern.rhs_packed_size(n, k)].copy()
            if kern.rhs_packer.neon:
                got = ukernels.NEON_COMPUTE(m, n, k, kern.mr, kern.nr, kern.kr // kern.sr, lhs_c, rhs_c)
            else:
                fmul = kern.flags.get("first_block_fmul", False)
                got = ukernels.SME2_COMPUTE(m, n, k, kern.mr, kern.nr, lhs_c, rhs_c, fmul)
            same = bits_equal(kern._reference(m, n, k, lhs_c, rhs_c), got)
            if kern.rhs_packer.neon:  # the jit execution, clamped
                want = kern.run(m, n, k, lhs, rhs, execution="reference")
                same = same and bits_equal(want, kern.run(m, n, k, lhs, rhs, execution="jit"))
            if not same:
                print(f"DIFFERENT {kern.name} m={m} n={n} k={k}")
                failed += 1
            checked += 1
        how = neon.instruction(kern.mr, kern.kr, neon.HOST_ISA) if kern.rhs_packer.neon else "portable"
        print(f"{kern.name}: {checked} shapes, {how}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
