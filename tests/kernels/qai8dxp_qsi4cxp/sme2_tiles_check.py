"""Run by path on an aarch64 host with SME2 (the tests run it under ``scripts/qemu-aarch64 --python`` at SVL 128,
256 and 512): both SME2 kernels of the per-channel int4 family, bound to the host's SVL, through the family's tile
chain ``ukernels.MATMUL_COMPUTE`` (the jit's) against the numpy reference (``kernel.run(..., execution="reference")``)
and the portable jit, bit for bit, on random shapes with partial row and column groups, K tails and one long K; then
the fallbacks: the kernels bound to another SVL, the SME2 layouts with the other float epilogue, a NEON layout (no
tile call, same bits as the portable jit). The tiles' symbols are re-registered to counting wrappers before any jit
call, so that the lines say which tile ran how many times. Prints the tiles' ISA and SVL and one line per check;
exits 1 on a difference or when a tile did not run (or ran) as it should."""

from __future__ import annotations

import collections
import ctypes
import sys

import llvmlite.binding as llvm
import numpy as np

from kleidipy.core import hwcaps
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qai8dxp_qsi4cxp import sme2
from kleidipy.kernels.qai8dxp_qsi4cxp import ukernels as fam
from kleidipy.kernels.qai8dxp_qsi8cxp import jit
from kleidipy.kernels.qai8dxp_qsi8cxp.ukernels import LHS_PACKER, k_internal

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


#: (m, n, k): partial groups of rows (VL = 4, 8, 16) and of 4·VL columns, k off 32 (odd: a half-filled last
#: byte of codes), one long K
SHAPES = [(1, 1, 1), (3, 17, 33), (5, 70, 96), (16, 64, 32), (17, 130, 101), (33, 200, 257), (6, 9, 2048)]


def operands(kern, m: int, n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Packed LHS and RHS: rows of mixed magnitudes (a zero row sometimes), random 4-bit codes (sometimes a row of
    code 0, weight −8, against a saturated row), scales of mixed magnitudes, a bias or none."""
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 50.0], size=(m, 1))).astype(np.float32)
    codes = rng.integers(0, 256, (n, -(-k // 2)), dtype=np.uint8)
    if rng.random() < 0.3:
        x[0] = 0.0
    if rng.random() < 0.3:
        x[-1], codes[-1] = -1.0, 0
    scale = (rng.random(n) * rng.choice([1e-4, 1e-2, 1.0])).astype(np.float32)
    bias = (rng.standard_normal(n) * 10).astype(np.float32) if rng.random() < 0.7 else None
    lhs = LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="reference")
    rhs = kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, codes, scale=scale, bias=bias, execution="reference")
    return np.asarray(lhs), np.asarray(rhs)


def jit_call(function, kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, recipe: int) -> np.ndarray:  # noqa: ANN001
    """``function`` (``ukernels.MATMUL_COMPUTE`` or the portable ``jit.matmul_qai8dxp``) on the kernel's buffers, as the
    kernel's jit passes them."""
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    lhs = lhs[: kern.lhs_packed_size(m, k)]
    rhs = np.ascontiguousarray(rhs[: kern.rhs_packed_size(n, k)])
    out = np.empty((m, n), np.float32)
    views = (lhs.view(np.int8), lhs.view(np.int32), lhs.view(np.float32), rhs)
    layout = (kern.mr, kern.kr // kern.sr, kern.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi)
    function(m, n, k_internal(k), *views, *layout, recipe, out)
    return out


def reference(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """``kernel.run(..., execution="reference")``; a GEMV kernel (m = 1) row after row of its packed LHS."""
    if kern.kind == "gemm":
        return kern.run(m, n, k, lhs, rhs, execution="reference")
    row = kern.lhs_packed_size(1, k)
    return np.vstack([kern.run(1, n, k, lhs[i * row : (i + 1) * row], rhs, execution="reference") for i in range(m)])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def native(kern, k: int) -> bool:  # noqa: ANN001
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    layout = (kern.mr, k_internal(k), kern.kr // kern.sr, kern.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi)
    return bool(sme2.is_native_layout(*layout, int(kern.recipe)))


def check(kern, shapes: list, rng: np.random.Generator, fma_bias: bool | None = None) -> tuple[int, int]:  # noqa: ANN001
    """(calls, differences): ``ukernels.MATMUL_COMPUTE`` with the float epilogue ``fma_bias`` (default: the kernel's
    recipe) against the portable jit, and against the reference with the kernel's recipe."""
    calls = failed = 0
    own = int(kern.recipe)
    fma_bias = own == jit.RECIPE_FMA_BIAS if fma_bias is None else fma_bias
    recipe = jit.RECIPE_FMA_BIAS if fma_bias else jit.RECIPE_FMUL_FADD
    for m, n, k in shapes:
        lhs, rhs = operands(kern, m, n, k, rng)
        portable = jit_call(jit.matmul_qai8dxp, kern, m, n, k, lhs, rhs, recipe)
        if recipe == own and not same_bits(reference(kern, m, n, k, lhs, rhs), portable):
            print(f"DIFFERENT reference {kern.name}{kern._svl_text()} m={m} n={n} k={k}")
            failed += 1
        got = jit_call(fam.MATMUL_COMPUTE, kern, m, n, k, lhs, rhs, recipe)  # several rows for the GEMV layout too
        if not same_bits(got, portable):
            print(f"DIFFERENT MATMUL_COMPUTE {kern.name}{kern._svl_text()} m={m} n={n} k={k} recipe={recipe}")
            failed += 1
        calls += 1
    return calls, failed


def main() -> int:
    if not sme2.AVAILABLE:
        print("no SME2 tiles on this host")
        return 1
    svl = hwcaps.arm_features()[1]
    print(f"native tiles: {sme2.HOST_ISA.name}, SVL {svl}")
    for symbol in sme2.KERNELS:
        count_calls(symbol)
    rng = np.random.default_rng(17)
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
    fallbacks += [(get_kernel("matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_8x4x32_neon_i8mm"), False)]
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
