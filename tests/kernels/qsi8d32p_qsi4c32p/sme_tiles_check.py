"""Run by path on an aarch64 host with SME (the tests run it under ``scripts/qemu-aarch64 --python`` at two SVLs):
both SME1 kernels of the Q4_0 family, bound to the host's SVL, on the native tiles (``sme.compute_s4s0``) against
the numpy reference, bit for bit, on random shapes with partial row and column groups, blocks with ±0 scales and
all-zero LHS blocks (the sign of zero of the MOPA kernel's first-block FMUL). Also one kernel bound to another
SVL (the portable jit). The tiles' symbols are re-registered to counting wrappers before any call, so that the
lines say which tile ran how many times. Prints the tiles' ISA and SVL and one line per kernel; exits 1 on a
difference or when a kernel did not run its own tile."""

from __future__ import annotations

import collections
import ctypes
import sys

import llvmlite.binding as llvm
import numpy as np

from kleidipy.core import hwcaps
from kleidipy.kernels.catalogue import all_kernels
from kleidipy.kernels.qsi8d32p_qsi4c32p import sme

#: calls of each tile
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


SHAPES = [(1, 1, 32), (1, 70, 64), (3, 17, 96), (5, 130, 160), (16, 64, 32), (17, 64, 64), (33, 200, 128)]


def operands(rng: np.random.Generator, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 LHS [m, k] (a zero block in row 0) and Q4_0 blocks [n, k/32, 18] (some scales ±0)."""
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
    x[0, :32] = 0.0
    blocks = rng.integers(0, 256, (n, k // 32, 18), dtype=np.uint8)
    blocks[:, :, 1] &= 0x3B  # finite fp16 scales
    blocks[:, :, 1] |= rng.integers(0, 2, (n, k // 32), dtype=np.uint8) << 7  # negative ones too
    zero = rng.random((n, k // 32)) < 0.1
    blocks[:, :, 0][zero] = 0
    blocks[:, :, 1][zero] &= 0x80  # ±0
    return x, blocks


def check(kern, shapes: list, rng: np.random.Generator) -> tuple[int, int]:  # noqa: ANN001
    """(shapes checked, differences) of a kernel: the reference vs ``sme.compute_s4s0`` bits."""
    checked = failed = 0
    fmul = kern.flags.get("first_block_fmul", False)
    for m, n, k in shapes:
        x, blocks = operands(rng, m, n, k)
        lhs = kern.pack_lhs(x, execution="reference")
        rhs = kern.pack_rhs(n, k, blocks.reshape(-1), execution="reference")
        want = kern.run(m, n, k, lhs, rhs, execution="reference")
        got = sme.compute_s4s0(m, n, k, kern.mr, kern.nr, np.asarray(lhs), np.asarray(rhs), fmul)
        if not np.array_equal(want.view(np.uint32), got.view(np.uint32)):
            print(f"DIFFERENT {kern.name} SVL {kern.svl_bits} m={m} n={n} k={k}")
            failed += 1
        checked += 1
    return checked, failed


def main() -> int:
    if not sme.AVAILABLE:
        print("no SME tiles on this host")
        return 1
    svl = hwcaps.arm_features()[1]
    print(f"native tiles: {sme.HOST_ISA.name}, SVL {svl}")
    for symbol in sme.KERNELS:
        count_calls(symbol)
    rng = np.random.default_rng(13)
    failed = 0
    for symbol, name in sme.KERNELS.items():
        kern = next(k for k in all_kernels() if k.name == name).bind(svl)
        checked, bad = check(kern, [s for s in SHAPES if kern.kind == "gemm" or s[0] == 1], rng)
        failed += bad + (CALLS[symbol] != checked)
        print(f"{name}: {checked} shapes at SVL {svl}, mr={kern.mr} nr={kern.nr}, {CALLS[symbol]} calls of {symbol}")
    other = 256 if svl != 256 else 512
    kern = next(k for k in all_kernels() if k.name == sme.KERNELS[sme.MOPA]).bind(other)
    before = sum(CALLS.values())
    checked, bad = check(kern, SHAPES[2:4], rng)
    failed += bad + (sum(CALLS.values()) != before)
    print(f"{kern.name}: {checked} shapes at SVL {other}, {sum(CALLS.values()) - before} tile calls")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
