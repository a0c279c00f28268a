"""bf16p_bf16p family: golden runs, jit == reference, an exact rational model of BFDotAdd (EBF = 0), bad inputs."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal, exact_round, make_problem, verify_family

from kleidipy.core import numerics
from kleidipy.core.numerics import FLT_MAX, bf16_bits_to_f32, f32_to_bf16_bits
from kleidipy.errors import (
    BufferSizeError,
    DTypeError,
    KernelShapeError,
    NonFiniteInputError,
    PackedLayoutMismatchError,
)
from kleidipy.kernels.bf16p_bf16p import jit
from kleidipy.kernels.bf16p_bf16p import ukernels as fam
from kleidipy.kernels.catalogue import get_kernel, get_packer
from kleidipy.kernels.pack import kxn
from kleidipy.tools.golden import GoldenSet

EXECUTIONS = ("reference", "jit")  # the isa execution is tested in test_emulator.py

SME2 = "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa"
SME1 = "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme_mopa"
MMLA = "matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla"
DOT = "matmul_clamp_f32_bf16p1x4_bf16p12x4b_1x36_neon_dot"
SVLS = (128, 256, 512, 1024)
PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def exact_model(a: np.ndarray, b: np.ndarray, bias: np.ndarray, two_accumulators: bool) -> np.ndarray:
    """The module docstring's recipe in exact rationals: a [m, kp], b [kp, n] bf16 values, bias [n]."""

    def ro(q: Fraction) -> Fraction:
        return Fraction(exact_round(q, to_odd=True))

    def flushed(x: float) -> Fraction:
        return Fraction(0) if abs(x) < 2.0**-126 else Fraction(float(x))

    m, kp = a.shape
    out = np.empty((m, b.shape[1]), dtype=np.float32)
    for i in range(m):
        for j in range(b.shape[1]):
            acc = [flushed(bias[j]), Fraction(0)]
            for p in range(kp // 2):
                p0 = ro(flushed(a[i, 2 * p]) * flushed(b[2 * p, j]))
                p1 = ro(flushed(a[i, 2 * p + 1]) * flushed(b[2 * p + 1, j]))
                slot = p % 2 if two_accumulators else 0
                acc[slot] = ro(acc[slot] + ro(p0 + p1))
            total = acc[0] + acc[1] if two_accumulators else acc[0]
            out[i, j] = exact_round(total, to_odd=False)
    return out


def run_both(kern, m, n, k, lhs, rhs, bias, lo=-FLT_MAX, hi=FLT_MAX) -> dict:
    """Pack and run in both executions; packed bytes must agree. Returns {execution: dst}."""
    out, packed = {}, {}
    for ex in EXECUTIONS:
        lp = kern.pack_lhs(lhs, m, k, execution=ex)
        rp = kern.pack_rhs(n, k, rhs, bias=bias, execution=ex)
        packed[ex] = (np.asarray(lp), np.asarray(rp))
        out[ex] = kern.run(m, n, k, lp, rp, None, None, lo, hi, execution=ex)
    for ours, theirs in zip(packed["reference"], packed["jit"], strict=True):
        assert np.array_equal(ours, theirs)
    return out


# --------------------------------------------------------------------------------------------- golden


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_golden_runs_bit_exact(golden_dir, execution):
    count, failures = verify_family(golden_dir, "bf16p_bf16p", execution)
    assert count == 74
    assert not failures, "\n".join(failures)


def test_f16_helper_matches_golden_transpose(golden_dir):
    golden = GoldenSet(golden_dir)
    for case in golden.manifest["cases"]:
        rhs, bias = kxn.f16_nxk_to_f32_kxn(golden.array(case["inputs"]["rhs_f16"]))
        want = golden.array(case["inputs"]["rhs_f16_as_f32_kxn"])
        assert rhs.flags.c_contiguous and bits_equal(rhs, want)
        assert bias.dtype == np.float32 and bias.shape == (case["n"],) and not bias.any()
        rhs_bits, _ = kxn.f16_nxk_to_f32_kxn(golden.array(case["inputs"]["rhs_f16"]).view(np.uint16))
        assert bits_equal(rhs_bits, want)


def test_golden_model_evidence(golden_dir):
    """The dot kernel really needs two accumulators: one accumulator gives other bits on the golden GEMV."""
    golden = GoldenSet(golden_dir)
    case = next(c for c in golden.manifest["cases"] if (c["m"], c["n"], c["k"]) == (1, 256, 512))
    run = next(r for r in case["runs"] if r["variant"].endswith("1x36_neon_dot") and not r["clamped"])
    lhs, rhs = golden.array(run["files"]["lhs_packed"]), golden.array(run["files"]["rhs_packed"])
    bias, b = fam.rhs_values(rhs, 256, 512, 12, 4)
    a = fam.lhs_values(lhs, 1, 512, 1, 4)
    dst = golden.array(run["files"]["dst"]).reshape(1, 256)
    assert bits_equal(fam.bf16_matmul_reference(a, b, bias, True), dst)
    one_accumulator = fam.bf16_matmul_reference(a, b, bias, False)
    assert (one_accumulator.view(np.uint32) != dst.view(np.uint32)).sum() > 100


# --------------------------------------------------------------------------------------------- numerics


@pytest.mark.parametrize(
    ("x", "y", "want"),
    [
        (1.0, 2.0**-25, 1.0 + 2.0**-23),  # inexact: truncate, then force the last bit to 1
        (1.0, -(2.0**-25), 1.0 - 2.0**-24),  # truncation toward zero lands on an odd value already
        (1.0 + 2.0**-23, 2.0**-24, 1.0 + 2.0**-23),  # 1+3·2^-24 truncates to 1+2^-23 (odd)
        (1.0, 2.0**-60, 1.0 + 2.0**-23),  # far below float64 precision of the sum: still sticky
        (1.5 * 2.0**-126, -(2.0**-126), 0.0),  # denormal result flushed
        (2.0**-126, -(2.0**-127), 2.0**-126),  # denormal input flushed
        (3.0e-39, 1.0, 1.0),  # denormal input flushed (exactly 1.0, not 1+2^-23)
        (3.0e38, 3.0e38, math.inf),  # overflow: inf (round_to_odd_inf)
        (2.5, -2.5, 0.0),
    ],
)
def test_round_to_odd_add(x, y, want):
    for ro_add in (fam.ro_add, numerics.ro_add):
        got = float(ro_add(np.float64(np.float32(x)), np.float64(np.float32(y))))
        assert got == want and math.copysign(1, got) == math.copysign(1, want)


def test_products_flush_and_default_nan():
    tiny, big = np.float64(2.0**-70), np.float64(2.0**70)
    assert fam.ro_mul(tiny, tiny) == 0.0 and numerics.bfdotadd(0.0, tiny, tiny, 0.0, 0.0) == 0.0
    assert fam.ro_mul(big, big) == math.inf
    nan = fam.bfdotadd(np.float64(1.0), np.float64(math.inf), np.float64(0.0), np.float64(1.0), np.float64(1.0))
    jnan = numerics.bfdotadd(1.0, math.inf, 0.0, 1.0, 1.0)
    assert np.float32(nan).view(np.uint32) == np.float32(jnan).view(np.uint32) == numerics.DEFAULT_NAN_BITS


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_bf16_round_matches_numerics(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(64) * 2.0 ** rng.integers(-140, 120, 64)).astype(np.float32)
    packed = jit.pack_lhs_bf16(x.reshape(1, -1), 1, 4, False).view(np.uint16)[:64]
    assert np.array_equal(packed, f32_to_bf16_bits(x))


# --------------------------------------------------------------------------------------------- properties


@st.composite
def problems(draw, max_m=20):
    return (
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(1, max_m)),
        draw(st.integers(1, 40)),
        draw(st.integers(1, 37)),
    )


@given(problems(), st.sampled_from(SVLS), st.sampled_from([SME2, SME1]), st.booleans())
@PROPERTY
def test_sme_jit_equals_reference(problem, svl, name, clamp):
    seed, m, n, k = problem
    kern = get_kernel(name, svl)
    assert (kern.mr, kern.nr, kern.kr, kern.m_step) == (svl // 16, svl // 16, 2, svl // 16)
    lhs, rhs, bias = make_problem(seed, m, n, k)
    lo, hi = (-0.5, 0.75) if clamp else (-FLT_MAX, FLT_MAX)
    out = run_both(kern, m, n, k, lhs, rhs, bias, lo, hi)
    assert bits_equal(out["reference"], out["jit"])
    if clamp:
        assert out["jit"].min() >= lo and out["jit"].max() <= hi


@given(problems(), st.booleans())
@PROPERTY
def test_neon_jit_equals_reference(problem, clamp):
    seed, m, n, k = problem
    lhs, rhs, bias = make_problem(seed, m, n, k)
    lo, hi = (-0.25, 0.5) if clamp else (-FLT_MAX, FLT_MAX)
    gemm = run_both(get_kernel(MMLA), m, n, k, lhs, rhs, bias, lo, hi)
    assert bits_equal(gemm["reference"], gemm["jit"])
    gemv = run_both(get_kernel(DOT), 1, n, k, lhs[:1], rhs, bias, lo, hi)
    assert bits_equal(gemv["reference"], gemv["jit"])


@given(problems(max_m=9), st.sampled_from([-140, -70, -30, 30, 70, 120]))
@PROPERTY
def test_extreme_scales_jit_equals_reference(problem, scale_exp):
    """Denormal, underflowing and overflowing products (FTZ, inf, default NaN) agree in both executions."""
    seed, m, n, k = problem
    lhs, rhs, bias = make_problem(seed, m, n, k, scale_exp)
    rhs[0, 0] = np.float32(3.0e38)
    for name in (SME2, MMLA):
        out = run_both(get_kernel(name, 256), m, n, k, lhs, rhs, bias)
        assert bits_equal(out["reference"], out["jit"])


@given(problems(max_m=3), st.sampled_from([SME2, MMLA, DOT]))
@settings(max_examples=15, deadline=None)
def test_reference_equals_exact_rational_model(problem, name):
    seed, m, n, k = problem
    n, k = min(n, 6), min(k, 12)
    kern = get_kernel(name, 128)
    m = 1 if kern.kind == "gemv" else m
    lhs, rhs, bias = make_problem(seed, m, n, k)
    dst = kern.run(m, n, k, kern.pack_lhs(lhs), kern.pack_rhs(n, k, rhs, bias=bias), execution="reference")
    kp = -(-k // kern.kr) * kern.kr
    av, bv = np.zeros((m, kp)), np.zeros((kp, n))
    av[:, :k] = bf16_bits_to_f32(f32_to_bf16_bits(lhs))
    bv[:k] = bf16_bits_to_f32(f32_to_bf16_bits(rhs))
    want = exact_model(av, bv, bias, kern.flags.get("two_accumulators", False))
    assert bits_equal(dst, want)
    # A bound, not an exactness claim: the model itself stays near the float64 product (bf16 steps round to odd).
    exact = av @ bv + bias
    assert np.all(np.abs(dst - exact) <= 2.0**-20 * (np.abs(av) @ np.abs(bv) + np.abs(bias)) + 1e-30)


def test_padding_layouts():
    """On the packed bf16 bits: zero padding is +0.0 (a value check would let −0.0 through)."""
    lhs = np.arange(1, 1 + 3 * 5, dtype=np.float32).reshape(3, 5)
    want = f32_to_bf16_bits(lhs)  # small integers: exact in bf16
    for ex in EXECUTIONS:
        neon = get_packer("lhs_quant_pack_bf16p8x4_f32_neon").run(3, 5, 8, 4, 1, lhs, execution=ex)
        rows = np.asarray(neon).view(np.uint16).reshape(2, 8, 4).transpose(1, 0, 2).reshape(8, 8)
        assert np.array_equal(rows[:3, :5], want) and not rows[:, 5:].any()
        assert all(np.array_equal(rows[r], rows[0]) for r in range(3, 8))  # padding rows copy the first row
        sme = get_packer("lhs_pack_bf16p2vlx2_f32_sme").run(3, 5, 8, 2, 1, lhs, execution=ex)
        rows = np.asarray(sme).view(np.uint16).reshape(3, 8, 2).transpose(1, 0, 2).reshape(8, 6)
        assert np.array_equal(rows[:3, :5], want) and not rows[3:].any() and not rows[:, 5].any()


def test_threads_give_the_same_bits():
    lhs, rhs, bias = make_problem(7, 20, 70, 33)
    for name in (SME2, MMLA):
        kern = get_kernel(name, 128)
        lp = kern.pack_lhs(lhs, threads=2)
        assert np.array_equal(lp, kern.pack_lhs(lhs))
        rp = kern.pack_rhs(70, 33, rhs, bias=bias)
        one = kern.run(20, 70, 33, lp, rp)
        assert bits_equal(kern.run(20, 70, 33, lp, rp, threads=2, min_split_macs=0), one)


def test_catalogue_entries():
    tiers = {get_kernel("kai_run_" + name).tier: name for name in (SME2, SME1, MMLA)}
    assert set(tiers) == {"sme2", "sme", "bf16"}
    dot = get_kernel(DOT)
    assert (dot.kind, dot.tier, dot.m_step, dot.n_step, dot.mr, dot.nr, dot.kr) == ("gemv", "bf16", 1, 36, 1, 12, 4)
    mmla = get_kernel(MMLA)
    assert (mmla.m_step, mmla.n_step, mmla.mr, mmla.nr, mmla.kr, mmla.sr, mmla.bl) == (8, 12, 8, 12, 4, 1, None)
    assert all(get_packer(p.name) is p for p in fam.PACKERS)
    assert fam.RHS_SME.rhs_order == "kxn" and fam.RHS_SME.inputs == ("bias",) and not fam.RHS_SME.blocked


# --------------------------------------------------------------------------------------------- bad inputs


def test_bad_inputs():
    lhs, rhs, bias = make_problem(3, 4, 10, 8)
    sme = get_kernel(SME2, 256)
    lp, rp = sme.pack_lhs(lhs), sme.pack_rhs(10, 8, rhs, bias=bias)
    with pytest.raises(KernelShapeError):
        get_kernel(DOT).run(2, 10, 8, lp, rp)  # m > 1 on the GEMV kernel
    with pytest.raises(KernelShapeError):
        get_kernel(DOT).pack_lhs(lhs)  # the 1x4 packer packs one row
    with pytest.raises(KernelShapeError):
        sme.run(4, 10, 8, lp, rp, bl=32)  # not block-quantized
    with pytest.raises(KernelShapeError):
        fam.LHS_SME.run(4, 8, 16, 2, 1, lhs, bl=32)
    with pytest.raises(KernelShapeError):
        sme.run(4, 10, 0, lp, rp)
    with pytest.raises(KernelShapeError):
        fam.LHS_SME.run(4, 8, 12, 2, 1, lhs)  # mr is not 2·VL
    with pytest.raises(KernelShapeError):
        fam.LHS_NEON_8X4.run(3, 8, 8, 4, 1, lhs, m_idx_start=2)
    with pytest.raises(KernelShapeError):
        sme.pack_rhs(10, 8, rhs)  # the SME packer needs the bias
    with pytest.raises(KernelShapeError):
        sme.pack_rhs(10, 8, rhs, bias=bias, scale=bias)
    with pytest.raises(BufferSizeError):
        sme.run(4, 10, 8, lp, np.asarray(rp)[:-1])
    with pytest.raises(BufferSizeError):
        sme.run(4, 10, 8, np.asarray(lp)[:-2], rp)
    with pytest.raises(BufferSizeError):
        sme.pack_rhs(10, 9, rhs, bias=bias)
    with pytest.raises(DTypeError):
        sme.pack_rhs(10, 8, rhs.astype(np.float64), bias=bias)
    with pytest.raises(DTypeError):
        sme.pack_rhs(10, 8, rhs, bias=bias.astype(np.float16))
    with pytest.raises(DTypeError):
        sme.pack_lhs(lhs.astype(np.float64))
    with pytest.raises(DTypeError):
        sme.run(4, 10, 8, np.asarray(lp).view(np.int8), rp)
    with pytest.raises(DTypeError):
        kxn.f16_nxk_to_f32_kxn(rhs)
    with pytest.raises(KernelShapeError):
        kxn.f16_nxk_to_f32_kxn(np.zeros(8, dtype=np.float16))
    for bad in (np.nan, np.inf):
        poisoned = lhs.copy()
        poisoned[1, 3] = bad
        for packer_kernel in (sme, get_kernel(MMLA)):
            with pytest.raises(NonFiniteInputError):
                packer_kernel.pack_lhs(poisoned)
    with pytest.raises(PackedLayoutMismatchError):
        get_kernel(SME2, 512).run(4, 10, 8, lp, rp)  # packed for SVL 256
    neon = get_kernel(MMLA)
    with pytest.raises(PackedLayoutMismatchError):
        sme.run(4, 10, 8, lp, neon.pack_rhs(10, 8, rhs, bias=bias))  # packed for the NEON kernel
