"""Run by path on an aarch64 host with SME (the tests run it under ``scripts/qemu-aarch64 --python``): both SME1
kernels of the Q8_0 family, bound to the host's SVL, through the family's tile chain (``ukernels.MATMUL_COMPUTE``, the
jit's, and ``ukernels.matmul_tiled``, the compiled plan's), against the numpy reference and the portable jit, bit for
bit, on random shapes with partial row and column groups and K tails; then a fallback (the kernels bound to another SVL:
no tile call).

On a host with SME but not SME2 the module installs its tiles at import. QEMU has no such CPU (``max`` has SME2,
and no ``sme2=off`` property), so on an SME2 host this script installs the SME1 tiles itself, compiled for
``aarch64-sme`` (``+sme`` only: LLVM can select no SME2 instruction for them), before any jit call. The tiles'
symbols are re-registered to counting wrappers, so that the lines say which tile ran how many times. Prints the
tiles' ISA and SVL and one line per check; exits 1 on a difference or when a tile did not run (or ran) as it
should."""

from __future__ import annotations

import collections
import ctypes
import sys

import llvmlite.binding as llvm
import numpy as np

from kleidipy.core import hwcaps, native
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qai8dxp_qsi8cxp import jit, sme
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam

#: calls of each tile
CALLS: collections.Counter = collections.Counter()
_TILE = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 3, *[ctypes.c_void_p] * 3)
_WRAPPERS = []
#: random shapes (m, n, k) per kernel: partial groups of VL rows and of 4·VL columns, k off 32 (K tails)
SHAPES = 6


def count_calls(symbol: str) -> None:
    """Register ``symbol`` as a wrapper of the tile that counts its calls in :data:`CALLS`."""
    tile = _TILE(llvm.address_of_symbol(symbol))

    def counted(*args: int) -> None:
        CALLS[symbol] += 1
        tile(*args)

    _WRAPPERS.append(_TILE(counted))
    llvm.add_symbol(symbol, ctypes.cast(_WRAPPERS[-1], ctypes.c_void_p).value)


def operands(kern, m: int, n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Packed LHS and RHS: rows of mixed magnitudes, int8 weights (−128 included), scales, a bias or none."""
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 50.0], size=(m, 1))).astype(np.float32)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = (rng.random(n) * rng.choice([1e-4, 1e-2, 1.0])).astype(np.float32)
    bias = (rng.standard_normal(n) * 10).astype(np.float32) if rng.random() < 0.7 else None
    lhs = fam.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="reference")
    rhs = kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, w, scale=scale, bias=bias, execution="reference")
    return np.asarray(lhs), np.asarray(rhs)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def check(kern, m: int, n: int, k: int, rng: np.random.Generator) -> int:  # noqa: ANN001
    """Differences of ``MATMUL_COMPUTE`` and ``matmul_tiled`` from the portable jit and (GEMM, or one row)
    the reference, with the kernel's recipe."""
    lhs, rhs = operands(kern, m, n, k, rng)
    lhs = lhs[: kern.lhs_packed_size(m, k)]
    rhs = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    recipe, k_int = int(kern.recipe), fam.k_internal(k)
    views = (lhs.view(np.int8), lhs.view(np.int32), lhs.view(np.float32), rhs)
    args = (*views, kern.mr, kern.kr // kern.sr, kern.nr, lay.blen, 0, lay.k_lo, lay.k_hi, recipe)
    results = {}
    for name, function in (("portable", jit.matmul_qai8dxp), ("MATMUL_COMPUTE", fam.MATMUL_COMPUTE)):
        results[name] = np.empty((m, n), np.float32)
        function(m, n, k_int, *args, results[name])
    results["matmul_tiled"] = np.empty((m, n), np.float32)
    fma_bias, kbl = recipe == jit.RECIPE_FMA_BIAS, kern.kr // kern.sr
    fam.matmul_tiled(m, n, k_int, kern.mr, kern.nr, kbl, kern.kr, views[0], rhs, fma_bias, results["matmul_tiled"])
    if m == 1 or kern.kind == "gemm":
        results["reference"] = kern.run(m, n, k, lhs, rhs, execution="reference")
    failed = 0
    for name, got in results.items():
        if not same_bits(got, results["portable"]):
            print(f"DIFFERENT {name} {kern.name}{kern._svl_text()} m={m} n={n} k={k}")
            failed += 1
    return failed


def main() -> int:
    svl = hwcaps.arm_features()[1]
    if sme.AVAILABLE:
        print(f"native tiles: {sme.HOST_ISA.name}, SVL {svl}")
    elif native.host_isa("aarch64-sme") is not None:
        for symbol in (*sme.KERNELS, sme.VL):
            native.install(sme.tile_module(symbol), native.ISAS["aarch64-sme"])
        print(f"native tiles: aarch64-sme (installed by the check on an SME2 host), SVL {svl}")
    else:
        print("no SME on this host")
        return 1
    for symbol in sme.KERNELS:
        count_calls(symbol)
    rng = np.random.default_rng(7)
    vl, failed = svl // 32, 0
    for symbol, name in sme.KERNELS.items():
        kern = get_kernel(name, svl)
        shapes = [
            (1 if symbol == sme.DOT and i % 2 else int(rng.integers(1, 3 * vl + 2)), int(rng.integers(1, 9 * vl)), k)
            for i, k in enumerate(int(x) for x in rng.integers(1, 300, SHAPES))
        ]
        before = CALLS[symbol]
        failed += sum(check(kern, m, n, k, rng) for m, n, k in shapes)
        calls = CALLS[symbol] - before
        failed += calls != 2 * len(shapes)
        print(f"{name}: {len(shapes)} shapes at SVL {svl}, mr={kern.mr} nr={kern.nr}, {calls} of {symbol}")
    before, other = sum(CALLS.values()), 256 if svl != 256 else 512
    for name in sme.KERNELS.values():
        failed += check(get_kernel(name, other), 3, 40, 100, rng)
    failed += sum(CALLS.values()) != before
    print(f"fallbacks (SVL {other}): {sum(CALLS.values()) - before} tile calls")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
