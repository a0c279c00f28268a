"""Run by path on an aarch64 host (the tests run it under ``scripts/qemu-aarch64 --python``): every NEON kernel of the
int4 per-channel family on the native tiles against the numpy reference, bit for bit, on random shapes with partial row
and column groups and K tails, through the family's tile chain ``ukernels.MATMUL_COMPUTE`` (the jit's signature, called
as the kernels' ``_jit`` calls it) and through ``neon.matmul`` on the kernel's own tile, and ``neon.matmul`` with
several rows (the GEMV tile too) against the portable jit; then the Q8_0 family's NEON kernels through that chain (not
this family's layouts: its portable loop). Prints the tiles' ISA, one line per kernel and one for the fallback; exits 1
on a difference."""

from __future__ import annotations

import sys

import numpy as np

from kleidipy.kernels.qai8dxp_qsi4cxp import neon
from kleidipy.kernels.qai8dxp_qsi4cxp import ukernels as fam
from kleidipy.kernels.qai8dxp_qsi8cxp import jit
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as core

#: (m, n, k): partial groups of 4 and 8 rows and of 4 columns, k off 32, and one long K (accumulators past 2^24)
SHAPES = [
    (1, 1, 1),
    (1, 7, 33),
    (1, 130, 96),
    (2, 5, 32),
    (3, 9, 100),
    (5, 13, 128),
    (8, 4, 32),
    (12, 6, 64),
    (15, 8, 160),
    (21, 66, 70),
    (37, 11, 257),
    (6, 9, 2048),
]


def operands(kern, m: int, n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Packed LHS and RHS: rows of mixed magnitudes (a zero row sometimes), weights of the kernel's RHS packer (int4
    codes 0 … 15 or int8), scales of mixed magnitudes, a bias or none."""
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 50.0], size=(m, 1))).astype(np.float32)
    if rng.random() < 0.2:
        x[0] = 0.0
    if kern.rhs_packer.rhs_dtype == np.uint8:
        w = rng.integers(0, 256, (n, -(-k // 2)), dtype=np.uint8)
        if rng.random() < 0.2:
            x[-1], w[-1] = -1.0, 0  # all weights −8 against a saturated row
    else:
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = (rng.random(n) * rng.choice([1e-4, 1e-2, 1.0])).astype(np.float32)
    bias = (rng.standard_normal(n) * 10).astype(np.float32) if rng.random() < 0.7 else None
    lhs = core.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="reference")
    rhs = kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, w, scale=scale, bias=bias, execution="reference")
    return np.asarray(lhs), np.asarray(rhs)


def jit_call(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """The family's tile chain (``ukernels.MATMUL_COMPUTE``) called as ``Qai8dxpMatmulKernel._jit`` calls it."""
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    lhs = lhs[: kern.lhs_packed_size(m, k)]
    rhs = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    out = np.empty((m, n), np.float32)
    args = (lhs.view(np.int8), lhs.view(np.int32), lhs.view(np.float32), rhs, kern.mr, kern.kr // kern.sr, kern.nr)
    fam.MATMUL_COMPUTE(
        m, n, core.k_internal(k), *args, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi, int(kern.recipe), out
    )
    return out


def portable_call(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """The portable jit function on the same layout (FMUL_FADD), any number of rows."""
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    lhs = lhs[: kern.lhs_packed_size(m, k)]
    rhs = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    out = np.empty((m, n), np.float32)
    args = (lhs.view(np.int8), lhs.view(np.int32), lhs.view(np.float32), rhs, kern.mr, kern.kr // kern.sr, kern.nr)
    jit.matmul_qai8dxp(
        m, n, core.k_internal(k), *args, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi, jit.RECIPE_FMUL_FADD, out
    )
    return out


def tile_call(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """``neon.matmul`` on the kernel's own tile."""
    out = np.empty((m, n), np.float32)
    lhs_i8 = lhs[: kern.lhs_packed_size(m, k)].view(np.int8)
    rhs_u8 = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    neon.matmul(m, n, core.k_internal(k), kern.mr, kern.m_step, lhs_i8, rhs_u8, out)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def main() -> int:
    if not neon.AVAILABLE:
        print("no native tiles on this host")
        return 1
    print(f"native tiles: {neon.HOST_ISA.name}")
    rng = np.random.default_rng(11)
    failed = 0
    for kern in (kern for kern in fam.KERNELS if not kern.is_sme):
        checked = 0
        for m, n, k in SHAPES:
            m = 1 if kern.kind == "gemv" else m
            lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
            args = (kern.mr, core.k_internal(k), kern.kr // kern.sr, kern.nr, lay.blen, lay.nibble_factor)
            if not neon.is_native_layout(*args, lay.k_lo, lay.k_hi):
                print(f"NOT NATIVE {kern.name} k={k}")
                failed += 1
                continue
            lhs, rhs = operands(kern, m, n, k, rng)
            want = kern.run(m, n, k, lhs, rhs, execution="reference")
            for how, call in (("MATMUL_COMPUTE", jit_call), ("matmul", tile_call)):
                if not same_bits(want, call(kern, m, n, k, lhs, rhs)):
                    print(f"DIFFERENT {how} {kern.name} m={m} n={n} k={k}")
                    failed += 1
            checked += 1
        for m, n, k in SHAPES[3::2]:  # several rows on every tile (the GEMV one too) against the portable jit
            lhs, rhs = operands(kern, m, n, k, rng)
            if not same_bits(portable_call(kern, m, n, k, lhs, rhs), tile_call(kern, m, n, k, lhs, rhs)):
                print(f"DIFFERENT matmul {kern.name} m={m} n={n} k={k}")
                failed += 1
            checked += 1
        print(f"{kern.name}: {checked} shapes, {neon.instruction(kern.mr, neon.HOST_ISA)}")
    checked = 0
    for kern in (kern for kern in core.KERNELS if not kern.is_sme):
        for m, n, k in SHAPES[3::3]:
            m = 1 if kern.kind == "gemv" else m
            lhs, rhs = operands(kern, m, n, k, rng)
            if not same_bits(kern.run(m, n, k, lhs, rhs, execution="reference"), jit_call(kern, m, n, k, lhs, rhs)):
                print(f"DIFFERENT fallback {kern.name} m={m} n={n} k={k}")
                failed += 1
            checked += 1
    print(f"fallback: {checked} calls")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
