"""Run by path on an aarch64 host (the tests run it under ``scripts/qemu-aarch64 --python``: SME2 at SVL 256, and
BF16 NEON without SME): every kernel of the ``bf16p_bf16p`` family through ``native.matmul_bf16_native`` against
the numpy reference, bit for bit, on random shapes with partial row and column groups and K tails, with special
values in LHS, RHS and bias (±0, denormals, ±inf, NaN, products that overflow or underflow). The SME kernels are
bound to the host's SVL (and the SME2 one to another SVL too: not the tile). The tiles' symbols are re-registered
to counting wrappers before any call, so that the lines say which tile ran how many times. Prints the tiles'
ISAs and one line per kernel; exits 1 on a difference or when a kernel did not run the tile it should."""

from __future__ import annotations

import collections
import ctypes
import sys

import llvmlite.binding as llvm
import numpy as np

from kleidipy.core import hwcaps
from kleidipy.kernels.bf16p_bf16p import native, ukernels
from kleidipy.kernels.catalogue import all_kernels

#: calls of each tile
CALLS: collections.Counter = collections.Counter()
_TILE = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 3, *[ctypes.c_void_p] * 3)
_WRAPPERS = []

SHAPES = [(1, 1, 1), (1, 37, 9), (1, 80, 64), (3, 13, 6), (9, 25, 17), (17, 40, 33), (33, 70, 64)]


def count_calls(symbol: str) -> None:
    """Register ``symbol`` as a wrapper of the tile that counts its calls in :data:`CALLS`."""
    tile = _TILE(llvm.address_of_symbol(symbol))

    def counted(*args: int) -> None:
        CALLS[symbol] += 1
        tile(*args)

    _WRAPPERS.append(_TILE(counted))
    llvm.add_symbol(symbol, ctypes.cast(_WRAPPERS[-1], ctypes.c_void_p).value)


def special(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 of mixed magnitudes (1e-3 .. 1e3, and 1e±25 whose products leave the float32 range), with ±0,
    denormals, ±inf and NaN."""
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(np.float32)
    kind = rng.random(shape)
    x[kind < 0.04] = np.float32(1e25) * np.sign(x[kind < 0.04])
    x[(kind >= 0.04) & (kind < 0.08)] = np.float32(3e-25)
    x[(kind >= 0.08) & (kind < 0.1)] = -0.0
    x[(kind >= 0.1) & (kind < 0.12)] = np.float32(2e-39)  # denormal (bf16 too)
    x[(kind >= 0.12) & (kind < 0.125)] = np.inf
    x[(kind >= 0.125) & (kind < 0.13)] = np.nan
    return x


def check(kern, shapes: list, rng: np.random.Generator) -> tuple[int, int]:  # noqa: ANN001
    """(shapes checked, differences) of a kernel: reference vs ``matmul_bf16_native`` bits."""
    checked = failed = 0
    for m, n, k in shapes:
        # the packers' numpy references (the packers' entry points refuse NaN/Inf)
        lhs = ukernels.pack_lhs_reference(special(rng, (m, k)), kern.mr, kern.kr, kern.lhs_packer.pad_first_row)
        rhs = ukernels.pack_rhs_reference(special(rng, (k, n)), special(rng, (n,)), kern.nr, kern.kr)
        want = kern._reference(m, n, k, lhs, rhs)  # the unclamped numpy reference
        two = kern.flags.get("two_accumulators", False)
        got = native.matmul_bf16_native(m, n, k, lhs, rhs, kern.mr, kern.nr, kern.kr, two)
        if not np.array_equal(want.view(np.uint32), got.view(np.uint32)):
            print(f"DIFFERENT {kern.name} m={m} n={n} k={k}")
            failed += 1
        checked += 1
    return checked, failed


def main() -> int:
    svl = hwcaps.arm_features()[1] or 512
    sme = native.SME_ISA.name if native.SME_ISA else "none"
    print(f"native tiles: SME {sme}, NEON {native.NEON_ISA.name if native.NEON_ISA else 'none'}, SVL {svl}")
    counted = [native.MOPA] * bool(native.SME_ISA) + [native.MMLA, native.DOT] * bool(native.NEON_ISA)
    for symbol in counted:
        count_calls(symbol)
    rng = np.random.default_rng(3)
    failed = 0
    kernels = [k for k in all_kernels() if k.family == "bf16p_bf16p"]
    runs = [(k.bind(svl) if k.is_sme else k) for k in kernels]
    runs.append(next(k for k in kernels if k.tier == "sme2").bind(256 if svl != 256 else 512))
    for kern in runs:
        symbol = next(s for s, names in native.KERNELS.items() if kern.name in names)
        before = CALLS[symbol]
        checked, bad = check(kern, [s for s in SHAPES if kern.kind == "gemm" or s[0] == 1], rng)
        calls = CALLS[symbol] - before
        expect = checked if symbol in counted and (not kern.is_sme or kern.svl_bits == svl) else 0
        failed += bad + (calls != expect)
        where = f" at SVL {kern.svl_bits}" if kern.is_sme else ""
        print(f"{kern.name}{where}: {checked} shapes, {calls} calls of {symbol}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
