"""Run by path on an aarch64 host (the tests run it under ``scripts/qemu-aarch64 --python``): every NEON kernel of the
Q8_0 family on the native tiles (the jit execution) against the numpy reference, bit for bit, on random shapes with
partial row and column groups and K tails; then the family's tile chain ``ukernels.matmul_tiled`` (the compiled
plan's) on the same layouts with both float epilogues (fma_bias on and off) against the portable jit, and with several
rows for the one-row layouts. Prints the tiles' ISA, one line per kernel and one for the chain; exits 1 on a
difference."""

from __future__ import annotations

import sys

import numpy as np

from kleidipy.kernels.catalogue import all_kernels
from kleidipy.kernels.qai8dxp_qsi8cxp import jit, neon
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam

#: (m, n, k): partial groups of 4 and 16 rows and of 4 columns, k off 32, and one long K (accumulators past 2^24)
SHAPES = [
    (1, 1, 1),
    (1, 7, 33),
    (1, 130, 96),
    (2, 5, 32),
    (3, 9, 100),
    (5, 13, 128),
    (15, 6, 64),
    (16, 4, 32),
    (17, 8, 160),
    (21, 66, 70),
    (37, 11, 257),
    (6, 9, 2048),
]


def operands(kern, m: int, n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Packed LHS and RHS: rows of mixed magnitudes (a zero row sometimes), int8 weights (−128 included; sometimes
    all −128 against a saturated row), scales of mixed magnitudes, a bias or none."""
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 50.0], size=(m, 1))).astype(np.float32)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    if rng.random() < 0.2:
        x[0] = 0.0
    if rng.random() < 0.2:
        x[-1], w[-1] = -1.0, -128
    scale = (rng.random(n) * rng.choice([1e-4, 1e-2, 1.0])).astype(np.float32)
    bias = (rng.standard_normal(n) * 10).astype(np.float32) if rng.random() < 0.7 else None
    lhs = fam.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="reference")
    rhs = kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, w, scale=scale, bias=bias, execution="reference")
    return np.asarray(lhs), np.asarray(rhs)


def graph_call(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, fma_bias: bool) -> np.ndarray:  # noqa: ANN001
    """``ukernels.matmul_tiled`` called as the compiled plan calls it."""
    out = np.empty((m, n), np.float32)
    lhs_i8 = lhs[: kern.lhs_packed_size(m, k)].view(np.int8)
    rhs_u8 = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    k_int, kbl = fam.k_internal(k), kern.kr // kern.sr
    fam.matmul_tiled(m, n, k_int, kern.mr, kern.nr, kbl, kern.kr, lhs_i8, rhs_u8, fma_bias, out)
    return out


def portable_call(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, recipe: int) -> np.ndarray:  # noqa: ANN001
    """The portable jit function on the same layout with ``recipe``."""
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    lhs = lhs[: kern.lhs_packed_size(m, k)]
    rhs = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    out = np.empty((m, n), np.float32)
    args = (lhs.view(np.int8), lhs.view(np.int32), lhs.view(np.float32), rhs, kern.mr, kern.kr // kern.sr, kern.nr)
    jit.matmul_qai8dxp(m, n, fam.k_internal(k), *args, lay.blen, 0, lay.k_lo, lay.k_hi, recipe, out)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def main() -> int:
    if not neon.AVAILABLE:
        print("no native tiles on this host")
        return 1
    print(f"native tiles: {neon.HOST_ISA.name}")
    rng = np.random.default_rng(7)
    failed = 0
    kernels = [kern for kern in all_kernels() if kern.family == fam.FAMILY_NAME and not kern.is_sme]
    for kern in kernels:
        checked = 0
        for m, n, k in SHAPES:
            m = 1 if kern.kind == "gemv" else m
            lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
            k_int, kbl = fam.k_internal(k), kern.kr // kern.sr
            if not neon.is_native_layout(kern.mr, k_int, kbl, kern.nr, lay.blen, 0, lay.k_lo, lay.k_hi):
                print(f"NOT NATIVE {kern.name} k={k}")
                failed += 1
                continue
            lhs, rhs = operands(kern, m, n, k, rng)
            want = kern.run(m, n, k, lhs, rhs, execution="reference")
            got = kern.run(m, n, k, lhs, rhs, execution="jit")
            if not same_bits(want, got):
                print(f"DIFFERENT {kern.name} m={m} n={n} k={k}")
                failed += 1
            checked += 1
        print(f"{kern.name}: {checked} shapes, {neon.instruction(kern.mr, kern.kr, neon.HOST_ISA)}")
    checked = 0
    for kern in kernels:
        for m, n, k in SHAPES[3::2]:  # several rows, for the one-row layouts too
            lhs, rhs = operands(kern, m, n, k, rng)
            for fma_bias, recipe in ((False, jit.RECIPE_FMUL_FADD), (True, jit.RECIPE_FMA_BIAS)):
                got = graph_call(kern, m, n, k, lhs, rhs, fma_bias)
                if not same_bits(got, portable_call(kern, m, n, k, lhs, rhs, recipe)):
                    print(f"DIFFERENT matmul_tiled {kern.name} m={m} n={n} k={k} fma_bias={fma_bias}")
                    failed += 1
                checked += 1
    print(f"matmul_tiled: {checked} calls")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
