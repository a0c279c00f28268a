"""Run by path on an aarch64 host with SME2 (the tests run it under ``scripts/qemu-aarch64 --python`` at SVL 128,
256 and 512): both SME2 kernels of the Q4_1 family, bound to the host's SVL, on the native tiles through
``sme2.compute`` (the family's chain ``ukernels.SME2_COMPUTE`` on this host, its jit's and its compiled plan's),
against the numpy reference (``kern.run(...,
execution="reference")`` and the unclamped ``kern._reference``), bit for bit, on random shapes with partial row and
column groups, mixed magnitudes, ±0 and subnormal scales and zeros, −0 biases and all-zero LHS blocks (the sign of
zero of the MOPA kernel's first-block FMUL). Then the same kernels bound to another SVL and the NEON kernels
through ``ukernels.NEON_COMPUTE`` (not these tiles). The tiles' symbols are re-registered to counting wrappers
before any jit call, so that the lines say which tile ran how many times. Prints the tiles' ISA and SVL and one line
per check; exits 1 on a difference or when the wrong code ran."""

from __future__ import annotations

import collections
import ctypes
import sys

import llvmlite.binding as llvm
import numpy as np

from kleidipy.core import hwcaps
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.numerics import FLT_MAX, clamp_f32
from kleidipy.kernels.catalogue import all_kernels
from kleidipy.kernels.qsi8d32p_qai4c32p import sme2, ukernels

#: calls of each tile by the jit
CALLS: collections.Counter = collections.Counter()
_TILE = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 3, *[ctypes.c_void_p] * 3)
_WRAPPERS = []


def count_calls(symbol: str) -> None:
    """Register ``symbol`` as a wrapper of the tile that counts its calls in :data:`CALLS`."""
    tile = _TILE(llvm.address_of_symbol(symbol))

    def counted(*args: int) -> None:
        CALLS[symbol] += 1
        tile(*args)

    _WRAPPERS.append(_TILE(counted))
    llvm.add_symbol(symbol, ctypes.cast(_WRAPPERS[-1], ctypes.c_void_p).value)


SHAPES = [(1, 1, 32), (1, 70, 96), (2, 33, 64), (3, 17, 96), (5, 130, 160), (16, 64, 32), (17, 64, 64), (33, 200, 128)]


def mixed(rng: np.random.Generator, shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
    """Mixed-sign float32 of magnitudes in [lo, hi] (log-uniform), some ±0 and some subnormal."""
    v = (np.exp(rng.uniform(np.log(lo), np.log(hi), shape)) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    v[rng.random(shape) < 0.05] = 0.0
    v[rng.random(shape) < 0.05] = -0.0
    v[rng.random(shape) < 0.03] = np.float32(1e-40)
    return v


def operands(kern: MatmulKernel, m: int, n: int, k: int, rng: np.random.Generator, bias: bool) -> tuple:
    """Packed LHS and RHS (reference packers, C-contiguous copies of the kernel's share): rows of mixed magnitudes
    (an all-zero block in row 0), bias with −0.0 entries or none."""
    nb = k // 32
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 1e3], (m, 1))).astype(np.float32)
    x[0, :32] = 0.0
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scale, zero = mixed(rng, (n, nb), 1e-4, 0.1), mixed(rng, (n, nb), 1e-3, 1.0)
    b = np.where(rng.random(n) < 0.3, -0.0, rng.standard_normal(n)).astype(np.float32) if bias else None
    lhs = kern.pack_lhs(x, execution="reference")
    rhs = kern.pack_rhs(n, k, codes, scale=scale, zero=zero, bias=b, execution="reference")
    return np.asarray(lhs)[: kern.lhs_packed_size(m, k)].copy(), np.asarray(rhs)[: kern.rhs_packed_size(n, k)].copy()


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def check(kern: MatmulKernel, shapes: list, rng: np.random.Generator) -> tuple[int, int]:
    """(shapes checked, differences) of a kernel: the reference vs the family's chain (``ukernels.SME2_COMPUTE``,
    ``ukernels.NEON_COMPUTE``)."""
    checked = failed = 0
    for m, n, k in shapes:
        lhs, rhs = operands(kern, m, n, k, rng, checked % 2 == 0)
        unclamped = kern._reference(m, n, k, lhs, rhs)
        if kern.kind == "gemm" or m == 1:
            want = kern.run(m, n, k, lhs, rhs, execution="reference")
        else:  # a GEMV kernel over several rows (as the graph executor may run it): kai_run takes m == 1
            want = clamp_f32(unclamped, -FLT_MAX, FLT_MAX)
        if kern.rhs_packer.neon:
            got = ukernels.NEON_COMPUTE(m, n, k, kern.mr, kern.nr, kern.kr // kern.sr, lhs, rhs)
        else:
            fmul = kern.flags.get("first_block_fmul", False)
            got = ukernels.SME2_COMPUTE(m, n, k, kern.mr, kern.nr, lhs, rhs, fmul)
        if not (same(unclamped, got) and same(want, clamp_f32(got, -FLT_MAX, FLT_MAX))):
            print(f"DIFFERENT {kern.name} SVL {kern.svl_bits} m={m} n={n} k={k}")
            failed += 1
        checked += 1
    return checked, failed


def main() -> int:
    if not sme2.AVAILABLE or ukernels.SME2_COMPUTE is not sme2.compute:
        print("no SME2 tiles on this host")
        return 1
    svl = hwcaps.arm_features()[1]
    print(f"native tiles: {sme2.HOST_ISA.name}, SVL {svl}")
    for symbol in sme2.KERNELS:
        count_calls(symbol)
    rng = np.random.default_rng(13)
    failed = 0
    family = [k for k in all_kernels() if k.family == "qsi8d32p_qai4c32p"]
    for symbol, name in sme2.KERNELS.items():
        kern = next(k for k in family if k.name == name).bind(svl)
        checked, bad = check(kern, [s for s in SHAPES if kern.kind == "gemm" or s[0] <= 3], rng)
        failed += bad + (CALLS[symbol] != checked)
        print(f"{name}: {checked} shapes at SVL {svl}, mr={kern.mr} nr={kern.nr}, {CALLS[symbol]} calls of {symbol}")
    other = 256 if svl != 256 else 512
    before = sum(CALLS.values())
    checked = 0
    for name in sme2.KERNELS.values():
        kern = next(k for k in family if k.name == name).bind(other)
        done, bad = check(kern, SHAPES[2:5], rng)
        checked, failed = checked + done, failed + bad
    failed += sum(CALLS.values()) != before
    print(f"SME2 kernels: {checked} shapes at SVL {other}, {sum(CALLS.values()) - before} tile calls")
    checked = 0
    for kern in (k for k in family if k.rhs_packer.neon):
        done, bad = check(kern, [s for s in SHAPES[:5] if kern.kind == "gemm" or s[0] == 1], rng)
        checked, failed = checked + done, failed + bad
    failed += sum(CALLS.values()) != before
    print(f"NEON kernels through NEON_COMPUTE: {checked} shapes, {sum(CALLS.values()) - before} tile calls")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
