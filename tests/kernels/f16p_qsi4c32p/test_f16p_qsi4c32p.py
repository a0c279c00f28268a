"""f16p_qsi4c32p family: its golden set (real KleidiAI v1.24.0) in every execution, an exact rational model of the
widening FMOPA, the LHS packer, random shapes with tails against the reference, the x86 tiles against the portable
jit, and the thread split."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal, exact_round, mixed_f32, verify_family
from paths import F16P_GOLDEN

from kleidipy.errors import KernelShapeError
from kleidipy.formats import q4_0
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.f16p_qsi4c32p import avx512, jit
from kleidipy.kernels.f16p_qsi4c32p import ukernels as fam
from kleidipy.kernels.pack.qsi4c32p import RHS_QSI4C32PS1S0SCALEF16_NEON

KERNEL = "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa"
SVLS = (128, 256, 512)
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("execution", ["reference", "jit", "isa"])
def test_golden_runs_bit_exact(execution: str) -> None:
    """All 30 runs (5 shapes with tails in m, n and k × SVL 128/256/512 × unclamped/clamped), none skipped."""
    count, failures = verify_family(F16P_GOLDEN, "f16p_qsi4c32p", execution)
    assert count == 30
    assert not failures, "\n".join(failures)


def exact_model(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The widening FMOPA on exact rationals: per K pair, acc = RN32(acc + RN32(a0·w0 + a1·w1)) from +0."""
    out = np.empty((a.shape[0], w.shape[0]), np.float32)
    for i in range(a.shape[0]):
        for j in range(w.shape[0]):
            acc = 0.0
            for p in range(0, a.shape[1], 2):
                pair = Fraction(float(a[i, p])) * Fraction(float(w[j, p]))
                pair += Fraction(float(a[i, p + 1])) * Fraction(float(w[j, p + 1]))
                acc = exact_round(Fraction(acc) + Fraction(exact_round(pair)))
            out[i, j] = acc
    return out


def test_widening_mopa_is_the_exact_model() -> None:
    """F16 values of wildly different magnitudes (subnormals to 2^15: pairs whose float64 sum is inexact) give the
    exact model's bits; the model differs from one rounding per product (a sign the pairing is seen)."""
    rng = np.random.default_rng(5)
    a = mixed_f32(rng, (3, 64), 2.0**-24, 2.0**15, subnormals=False).astype(np.float16).astype(np.float32)
    w = mixed_f32(rng, (5, 64), 2.0**-24, 2.0**15, subnormals=False).astype(np.float16).astype(np.float32)
    want = exact_model(a, w)
    assert bits_equal(fam.widening_mopa(a, w), want)
    separate = np.zeros((3, 5), np.float32)
    for p in range(64):
        separate = (separate + np.multiply.outer(a[:, p], w[:, p])).astype(np.float32)
    assert not bits_equal(separate, want)


def q4_0_weights(rng: np.random.Generator, n: int, k: int, wide: bool) -> np.ndarray:
    """GGML Q4_0 blocks of normal weights, or (``wide``) of rows spanning 2^-20 .. 2^4 (F16 products round, some
    weights F16 subnormal)."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    if wide:
        w *= np.exp2(rng.integers(-20, 5, size=(n, 1))).astype(np.float32)
    return q4_0.quantize(w)


@given(
    shape=st.tuples(st.integers(1, 40), st.integers(1, 140), st.integers(1, 5)),
    svl=st.sampled_from(SVLS),
    wide_seed=st.tuples(st.booleans(), st.integers(0, 2**31)),
)
@PROPERTY
def test_jit_equals_reference_on_random_shapes(shape: tuple, svl: int, wide_seed: tuple) -> None:
    """m, n with partial row and column groups, k of 1 .. 5 blocks; normal or wide-range values (F16 rounding of the
    products and of the scaled weights, subnormals)."""
    (m, n, blocks), (wide, seed) = shape, wide_seed
    kern = get_kernel(KERNEL, svl)
    k = 32 * blocks
    rng = np.random.default_rng(seed)
    lhs = mixed_f32(rng, (m, k), 2.0**-20, 2.0**6, subnormals=False) if wide else rng.standard_normal((m, k))
    lhs = np.asarray(lhs, np.float32)
    rhs = kern.pack_rhs(n, k, q4_0_weights(rng, n, k, wide), execution="reference")
    packed = {ex: kern.pack_lhs(lhs, execution=ex) for ex in ("reference", "jit")}
    assert bits_equal(packed["jit"].view(np.float32), packed["reference"].view(np.float32))
    want = kern.run(m, n, k, packed["reference"], rhs, execution="reference")
    assert bits_equal(kern.run(m, n, k, packed["jit"], rhs, execution="jit"), want)


@pytest.mark.skipif(not avx512.AVAILABLE, reason="the AVX-512 tiles run on x86 with AVX-512 only")
@pytest.mark.parametrize("svl", [128, 256, 512, 1024])
def test_avx512_tiles_are_the_portable_jit(svl: int) -> None:
    """The x86 tiles (what the jit execution runs here) against the portable jit (what it runs elsewhere): rows
    past a tile, columns past a panel, every SVL's nr, LHS values past F16's range (inf) and F16 subnormals."""
    kern = get_kernel(KERNEL, svl)
    mr, nr = kern.mr, kern.nr
    rng = np.random.default_rng(svl)
    for m, n, k in [(1, 16, 32), (7, 70, 96), (33, 200, 160)]:
        x = mixed_f32(rng, (m, k), 2.0**-26, 2.0**6, subnormals=False)
        x[0, :3] = [7e4, -7e4, 1e-7]
        lhs = kern.pack_lhs(np.asarray(x, np.float32))
        rhs = kern.pack_rhs(n, k, q4_0_weights(rng, n, k, True))
        want = jit.matmul(m, n, k, mr, nr, lhs, rhs)
        assert bits_equal(avx512.compute(m, n, k, mr, nr, lhs, rhs), want)


@pytest.mark.parametrize(("m", "n", "k", "svl"), [(5, 33, 64, 128), (17, 70, 96, 256)])
def test_isa_equals_reference_on_tails(m: int, n: int, k: int, svl: int) -> None:
    kern = get_kernel(KERNEL, svl)
    rng = np.random.default_rng(m * n)
    lhs = kern.pack_lhs(rng.standard_normal((m, k)).astype(np.float32))
    rhs = kern.pack_rhs(n, k, q4_0_weights(rng, n, k, True))
    want = kern.run(m, n, k, lhs, rhs, execution="reference")
    assert bits_equal(kern.run(m, n, k, lhs, rhs, execution="isa"), want)


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_split_keeps_the_bits(threads: int) -> None:
    """llama.cpp's split over n (multiples of n_step) at 1 and 2 threads: the reference's bits."""
    kern = get_kernel(KERNEL, 128)
    m, n, k = 9, 100, 128
    rng = np.random.default_rng(threads)
    x = rng.standard_normal((m, k)).astype(np.float32)
    rhs = kern.pack_rhs(n, k, q4_0_weights(rng, n, k, False))
    want = kern.run(m, n, k, kern.pack_lhs(x), rhs, execution="reference")
    got = kern.prepare(n, k, rhs, execution="jit", min_split_macs=0)(x, threads=threads)
    assert bits_equal(got, want)


def test_lhs_packer_layout_and_rounding() -> None:
    """Row r's K pair p at halves 2(p·mr + r), +1 of its group; F16 nearest even (overflow to inf, subnormals kept,
    1.5·2^-24 to 2^-23); the last group's missing rows are 0; sr must be 2."""
    packer = fam.LHS_F16PMRX2_F32_NEON
    x = np.array([[1.0, 2.0**-25 * 3, 70000.0, -0.0], [1 + 2.0**-11, 1 + 3 * 2.0**-11, -5.0, 6.0]], np.float32)
    x = np.tile(x, (1, 8))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view("<u2").reshape(2, 16, 2).transpose(1, 0, 2)  # [pair, row, element]
    for execution in ("reference", "jit"):
        buf = np.asarray(packer.run(2, 32, 4, 4, 2, x, bl=32, execution=execution))
        halves = buf.view("<u2").reshape(16, 4, 2)  # one group of mr = 4 rows
        assert np.array_equal(halves[:, :2], want) and not halves[:, 2:].any()
        assert packer.unpack(buf, 2, 32, 4)[0, 2] == np.inf
    with pytest.raises(KernelShapeError):
        packer.run(2, 32, 4, 4, 1, x, bl=32)


def test_rhs_is_the_shared_sme2_q4_0_packer() -> None:
    """The kernel's RHS packer is the int8 SME2 Q4_0 kernels' (one packing serves the F16 GEMM and the SDOT GEMV)."""
    kern = get_kernel(KERNEL, 512)
    sdot = get_kernel("matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot", 512)
    assert kern.rhs_packer is RHS_QSI4C32PS1S0SCALEF16_NEON is sdot.rhs_packer
    assert (kern.nr, kern.kr, kern.sr) == (sdot.nr, sdot.kr, sdot.sr)
