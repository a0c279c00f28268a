"""Run by path on an aarch64 host with SME2 (the tests run it under ``scripts/qemu-aarch64 --python`` at SVL 128,
256 and 512): both SME2 kernels of the Q8_0 family, bound to the host's SVL, through the family's tile chain
(``ukernels.MATMUL_COMPUTE``, the jit's, and ``ukernels.matmul_tiled``, the compiled plan's), against the numpy
reference and the portable jit, bit for bit, on random shapes with partial row and column groups, K tails and one long
K; then the fallbacks: the kernels bound to another SVL, the SME layouts with the other float epilogue, a NEON layout
(no tile call, same bits as the portable jit). The tiles' symbols are re-registered to counting wrappers before any jit
call, so that the lines say which tile ran how many times. Prints the tiles' ISA and SVL and one line per check; exits 1
on a difference or when a tile did not run (or ran) as it should."""

from __future__ import annotations

import collections
import ctypes
import sys

import llvmlite.binding as llvm
import numpy as np

from kleidipy.core import hwcaps
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qai8dxp_qsi8cxp import jit, sme2
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam

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


#: (m, n, k): partial groups of rows (VL = 4, 8, 16) and of 4·VL columns, k off 32, one long K (past 2^24)
SHAPES = [(1, 1, 1), (3, 17, 33), (5, 70, 96), (16, 64, 32), (17, 130, 100), (33, 200, 257), (6, 9, 2048)]


def operands(kern, m: int, n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Packed LHS and RHS: rows of mixed magnitudes (a zero row sometimes), int8 weights (−128 included; sometimes
    all −128 against a saturated row), scales of mixed magnitudes, a bias or none."""
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 50.0], size=(m, 1))).astype(np.float32)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    if rng.random() < 0.3:
        x[0] = 0.0
    if rng.random() < 0.3:
        x[-1], w[-1] = -1.0, -128
    scale = (rng.random(n) * rng.choice([1e-4, 1e-2, 1.0])).astype(np.float32)
    bias = (rng.standard_normal(n) * 10).astype(np.float32) if rng.random() < 0.7 else None
    lhs = fam.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="reference")
    rhs = kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, w, scale=scale, bias=bias, execution="reference")
    return np.asarray(lhs), np.asarray(rhs)


def buffers(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> tuple:  # noqa: ANN001
    """The kernel's packed buffers as its jit passes them: LHS (int8, int32, float32 views) and RHS."""
    lhs = lhs[: kern.lhs_packed_size(m, k)]
    rhs = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    return lhs.view(np.int8), lhs.view(np.int32), lhs.view(np.float32), rhs


def jit_call(function, kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, recipe: int) -> np.ndarray:  # noqa: ANN001
    """``function`` (``ukernels.MATMUL_COMPUTE`` or the portable ``jit.matmul_qai8dxp``) on the kernel's layout."""
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    out = np.empty((m, n), np.float32)
    args = (*buffers(kern, m, n, k, lhs, rhs), kern.mr, kern.kr // kern.sr, kern.nr, lay.blen, 0, lay.k_lo, lay.k_hi)
    function(m, n, fam.k_internal(k), *args, recipe, out)
    return out


def graph_call(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, fma_bias: bool) -> np.ndarray:  # noqa: ANN001
    """``ukernels.matmul_tiled`` called as the compiled plan calls it."""
    lhs_i8, _, _, rhs_u8 = buffers(kern, m, n, k, lhs, rhs)
    out = np.empty((m, n), np.float32)
    fam.matmul_tiled(
        m, n, fam.k_internal(k), kern.mr, kern.nr, kern.kr // kern.sr, kern.kr, lhs_i8, rhs_u8, fma_bias, out
    )
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def native(kern, k: int) -> bool:  # noqa: ANN001
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    args = (kern.mr, fam.k_internal(k), kern.kr // kern.sr, kern.nr, lay.blen, 0, lay.k_lo, lay.k_hi)
    return bool(sme2.is_native_layout(*args))


def check(kern, shapes: list, rng: np.random.Generator, fma_bias: bool | None = None) -> tuple[int, int]:  # noqa: ANN001
    """(calls, differences): ``MATMUL_COMPUTE`` and ``matmul_tiled`` with the float epilogue ``fma_bias``
    (default: the kernel's recipe) against the portable jit, and against the reference with the kernel's recipe."""
    calls = failed = 0
    own = int(kern.recipe)
    fma_bias = own == jit.RECIPE_FMA_BIAS if fma_bias is None else fma_bias
    recipe = jit.RECIPE_FMA_BIAS if fma_bias else jit.RECIPE_FMUL_FADD
    for m, n, k in shapes:
        lhs, rhs = operands(kern, m, n, k, rng)
        portable = jit_call(jit.matmul_qai8dxp, kern, m, n, k, lhs, rhs, recipe)
        reference = recipe == own and (m == 1 or kern.kind == "gemm")
        if reference and not same_bits(kern.run(m, n, k, lhs, rhs, execution="reference"), portable):
            print(f"DIFFERENT reference {kern.name}{kern._svl_text()} m={m} n={n} k={k}")
            failed += 1
        got = jit_call(fam.MATMUL_COMPUTE, kern, m, n, k, lhs, rhs, recipe)  # several rows for the GEMV layout too
        if not same_bits(got, portable):
            print(f"DIFFERENT MATMUL_COMPUTE {kern.name}{kern._svl_text()} m={m} n={n} k={k} recipe={recipe}")
            failed += 1
        got = graph_call(kern, m, n, k, lhs, rhs, fma_bias)
        if not same_bits(got, portable):
            print(f"DIFFERENT matmul_tiled {kern.name}{kern._svl_text()} m={m} n={n} k={k} fma_bias={fma_bias}")
            failed += 1
        calls += 2
    return calls, failed


def main() -> int:
    if not sme2.AVAILABLE:
        print("no SME2 tiles on this host")
        return 1
    svl = hwcaps.arm_features()[1]
    print(f"native tiles: {sme2.HOST_ISA.name}, SVL {svl}")
    for symbol in sme2.KERNELS:
        count_calls(symbol)
    rng = np.random.default_rng(13)
    failed = 0
    for symbol, name in sme2.KERNELS.items():
        kern = get_kernel(name, svl)
        before = CALLS[symbol]
        layouts = all(native(kern, k) for _, _, k in SHAPES)
        calls, bad = check(kern, SHAPES, rng)
        failed += bad + (not layouts) + (CALLS[symbol] - before != calls)
        print(f"{name}: {calls} calls at SVL {svl}, mr={kern.mr} nr={kern.nr}, {CALLS[symbol] - before} of {symbol}")
    fallbacks = []  # (kernel, fma_bias): bound to another SVL; the other recipe; a NEON layout
    other = 256 if svl != 256 else 512
    fallbacks += [(get_kernel(name, other), None) for name in sme2.KERNELS.values()]
    fallbacks += [(get_kernel(name, svl), name == sme2.KERNELS[sme2.MOPA]) for name in sme2.KERNELS.values()]
    fallbacks += [(get_kernel("matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm"), False)]
    before, checked = sum(CALLS.values()), 0
    for kern, fma_bias in fallbacks:
        calls, bad = check(kern, SHAPES[1:4], rng, fma_bias)
        failed += bad
        checked += calls
    failed += sum(CALLS.values()) != before
    print(f"fallbacks: {checked} calls, {sum(CALLS.values()) - before} tile calls")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
