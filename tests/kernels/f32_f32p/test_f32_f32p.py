"""f32_f32p family: golden runs, jit == reference, an exact rational model of the FMLA chain, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal, exact_fma, make_problem, verify_family

from kleidipy.core.numerics import FLT_MAX
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError, NonFiniteInputError
from kleidipy.kernels.catalogue import get_kernel, get_packer
from kleidipy.kernels.f32_f32p import ukernels as fam
from kleidipy.kernels.pack.kxn import f16_nxk_to_f32_kxn

EXECUTIONS = ("reference", "jit")  # the isa execution is tested in test_emulator.py

MLA = "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla"


def run_both(m, n, k, lhs, rhs, bias, lo=-FLT_MAX, hi=FLT_MAX) -> dict:
    kern = get_kernel(MLA)
    packed = {ex: kern.pack_rhs(n, k, rhs, bias=bias, execution=ex) for ex in EXECUTIONS}
    assert np.array_equal(packed["reference"], packed["jit"])
    return {ex: kern.run(m, n, k, lhs, packed[ex], None, None, lo, hi, execution=ex) for ex in EXECUTIONS}


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_golden_runs_bit_exact(golden_dir, execution):
    count, failures = verify_family(golden_dir, "f32_f32p", execution)
    assert count == 10
    assert not failures, "\n".join(failures)


@given(st.integers(0, 2**32 - 1), st.integers(1, 14), st.integers(1, 40), st.integers(1, 40), st.booleans())
@settings(max_examples=30, deadline=None)
def test_jit_equals_reference(seed, m, n, k, clamp):
    lhs, rhs, bias = make_problem(seed, m, n, k)
    lo, hi = (-0.5, 1.0) if clamp else (-FLT_MAX, FLT_MAX)
    out = run_both(m, n, k, lhs, rhs, bias, lo, hi)
    assert bits_equal(out["reference"], out["jit"])


@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 18), st.integers(1, 10))
@settings(max_examples=15, deadline=None)
def test_reference_equals_exact_rational_model(seed, m, n, k):
    """acc = bias; acc = fma(lhs, rhs, acc) per k in order: exact rationals, rounded once per step."""
    lhs, rhs, bias = make_problem(seed, m, n, k)
    out = run_both(m, n, k, lhs, rhs, bias)["reference"]
    want = np.empty((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            acc = bias[j]
            for kk in range(k):
                acc = exact_fma(lhs[i, kk], rhs[kk, j], acc)
            want[i, j] = acc
    assert bits_equal(out, want)


def test_packed_layout_and_null_bias():
    rhs = np.arange(3 * 20, dtype=np.float32).reshape(3, 20)
    for ex in EXECUTIONS:
        packed = np.asarray(fam.RHS_X32.run(20, 3, 16, 1, 1, rhs, execution=ex)).view(np.float32).reshape(2, 4, 16)
        assert bits_equal(packed[:, 0], np.zeros((2, 16), np.float32))  # NULL bias packs +0.0
        assert bits_equal(packed[0, 1:], rhs[:, :16]) and bits_equal(packed[1, 1:, :4], rhs[:, 16:])
        assert bits_equal(packed[1, 1:, 4:], np.zeros((3, 12), np.float32))


def test_f16_weights_route_and_threads():
    rng = np.random.default_rng(5)
    weights = (rng.standard_normal((50, 24)) * 0.5).astype(np.float16)  # GGML [n][k]
    rhs, bias = f16_nxk_to_f32_kxn(weights)
    lhs = rng.standard_normal((13, 24)).astype(np.float32)
    kern = get_kernel("kai_run_" + MLA)
    packed = kern.pack_rhs(50, 24, rhs, bias=bias)
    one = kern.run(13, 50, 24, lhs, packed)
    assert bits_equal(kern.run(13, 50, 24, lhs, packed, threads=2, min_split_macs=0), one)
    # A tolerance on purpose: the route check compares the f32 FMA chain with the float64 product of the f16 weights.
    exact = lhs.astype(np.float64) @ weights.astype(np.float64).T
    assert np.allclose(one, exact, rtol=0, atol=1e-5)
    assert (kern.tier, kern.kind, kern.lhs_packer, kern.m_step, kern.n_step, kern.nr, kern.kr, kern.sr) == (
        "neon", "gemm", None, 6, 16, 16, 1, 1,
    )  # fmt: skip
    assert get_packer(fam.RHS_X32.name) is fam.RHS_X32 and fam.RHS_X32.rhs_order == "kxn"


def test_bad_inputs():
    lhs, rhs, bias = make_problem(1, 4, 20, 8)
    kern = get_kernel(MLA)
    packed = kern.pack_rhs(20, 8, rhs, bias=bias)
    with pytest.raises(KernelShapeError):
        fam.RHS_X32.run(20, 8, 12, 1, 1, rhs)  # nr must be 16
    with pytest.raises(KernelShapeError):
        fam.RHS_X32.run(20, 8, 16, 1, 1, rhs, bl=32)
    with pytest.raises(KernelShapeError):
        kern.run(4, 20, 8, lhs, packed, bl=32)
    with pytest.raises(BufferSizeError):
        kern.run(4, 20, 8, lhs, np.asarray(packed)[:-4])
    with pytest.raises(BufferSizeError):
        kern.run(5, 20, 8, lhs, packed)  # LHS holds 4 rows
    with pytest.raises(DTypeError):
        kern.run(4, 20, 8, lhs.astype(np.float64), packed)
    with pytest.raises(DTypeError):
        kern.pack_rhs(20, 8, rhs.astype(np.float16), bias=bias)
    for bad in (np.nan, -np.inf):
        poisoned = lhs.copy()
        poisoned[2, 5] = bad
        for ex in EXECUTIONS:
            with pytest.raises(NonFiniteInputError):
                kern.run(4, 20, 8, poisoned, packed, execution=ex)
