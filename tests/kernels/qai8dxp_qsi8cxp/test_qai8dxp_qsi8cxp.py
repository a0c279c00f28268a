"""Q8_0 family (qai8dxp × qsi8cxp): golden runs, llama.cpp's Q8_0 re-quantization, jit == reference,
reference == independent scalar models of the README layouts and of each kernel's float recipe (exact
rational fma), SCVTF rounding of large accumulators, threads, and bad inputs.

The scalar models here (LHS quantization, the kernels' float recipe) are also used by test_qai8dxp_qsi4cxp.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import (
    assert_sme_geometry,
    assert_threads_keep_bits,
    bits_equal,
    family_runs,
    verify_family,
)
from qai8dxp_models import model_dst, model_lhs_packed, model_quant_row, model_rhs_qsi8cxp

from kleidipy.core.numerics import FLT_MAX
from kleidipy.errors import (
    BufferSizeError,
    DTypeError,
    KernelShapeError,
    NonFiniteInputError,
    PackedLayoutMismatchError,
)
from kleidipy.kernels.catalogue import get_kernel, get_packer
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam
from kleidipy.tools.golden import GoldenSet

F32 = np.float32
KERNEL_NAMES = [k.name for k in fam.KERNELS]
SME_MOPA = "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa"
SME_DOT = "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot"
NEON_I8MM = "matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm"
NEON_GEMV = "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod"
SVLS = (128, 256, 512, 1024)
EXECUTIONS = ("reference", "jit")
HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_case(seed: int, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lhs = (rng.standard_normal((m, k)) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
    q = rng.integers(-127, 128, (n, k), dtype=np.int8)
    scale = (rng.random(n) * 0.05).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return lhs, q, scale, bias


# --------------------------------------------------------------------------------------------- golden


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_golden_runs_bit_exact(golden_dir, execution):
    count, failures = verify_family(golden_dir, fam.FAMILY_NAME, execution)
    assert count == 112
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_requantize_q8_0_reproduces_golden_inputs(golden_dir, execution):
    golden = GoldenSet(golden_dir)
    for case in golden.manifest["cases"]:
        n, k, inputs = case["n"], case["k"], case["inputs"]
        q, scale = fam.requantize_q8_0_per_channel(golden.array(inputs["rhs_q8_0"]), n, k, execution=execution)
        assert np.array_equal(q, golden.array(inputs["rhs_q8_0_requant_qsi8cx"]).reshape(n, k))
        assert bits_equal(scale, golden.array(inputs["rhs_q8_0_requant_scale_f32"]))


def test_golden_lhs_and_rhs_match_the_readme_models(golden_dir):
    golden, runs = family_runs(golden_dir, fam.FAMILY_NAME)
    seen = set()
    for case, run in runs:
        p = run["params"]
        key = (id(case), p["mr"], p["nr"], p["kr"])
        if key in seen or case["m"] > 16:
            continue
        seen.add(key)
        lhs = golden.array(case["inputs"]["lhs_f32"]).reshape(case["m"], case["k"])
        assert model_lhs_packed(lhs, p["mr"], p["kr"], p["sr"]) == golden.read(run["files"]["lhs_packed"])
        q = golden.array(case["inputs"]["rhs_q8_0_requant_qsi8cx"]).reshape(case["n"], case["k"])
        scale = golden.array(case["inputs"]["rhs_q8_0_requant_scale_f32"])
        assert model_rhs_qsi8cxp(q, scale, None, p["nr"], p["kr"]) == golden.read(run["files"]["rhs_packed"])


# --------------------------------------------------------------------------------------------- Q8_0


def _q8_0_blocks(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    blocks = np.zeros((n, k // 32, 34), dtype=np.uint8)
    d = (rng.random((n, k // 32)) * 0.01).astype(np.float16)
    d[0, 0] = 0  # an all-zero block
    blocks[:, :, :2] = d.view(np.uint8).reshape(n, k // 32, 2)
    blocks[:, :, 2:] = rng.integers(-127, 128, (n, k // 32, 32), dtype=np.int8).view(np.uint8)
    blocks[-1] = 0  # an all-zero row: scale 0, q 0
    return blocks


def _model_requant(blocks: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    q = np.zeros((n, k), dtype=np.int8)
    scale = np.zeros(n, dtype=np.float32)
    for row in range(n):
        v = [
            F32(F32(blocks[row, b, :2].view(np.float16)[0]) * F32(int(blocks[row, b, 2 + j].view(np.int8))))
            for b in range(k // 32)
            for j in range(32)
        ]
        amax = max(abs(x) for x in v)
        scale[row] = F32(amax / F32(127)) if amax > 0 else F32(0)
        inv = F32(F32(1) / scale[row]) if scale[row] > 0 else F32(0)
        for j, x in enumerate(v):
            y = float(F32(x * inv))
            q[row, j] = min(max(int(math.copysign(math.floor(abs(y) + 0.5), y)), -127), 127)
    return q, scale


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_requantize_q8_0_matches_scalar_model(execution):
    rng = np.random.default_rng(7)
    n, k = 9, 96
    blocks = _q8_0_blocks(rng, n, k)
    q, scale = fam.requantize_q8_0_per_channel(blocks, n, k, execution=execution)
    q_model, scale_model = _model_requant(blocks, n, k)
    assert np.array_equal(q, q_model)
    assert bits_equal(scale, scale_model)
    assert scale[-1] == 0 and not q[-1].any()


def _model_quantize(v):
    """quantize_per_channel in Python scalars (float32 via numpy scalars), the model both executions meet."""
    n, k = v.shape
    q, scale = np.zeros((n, k), np.int8), np.zeros(n, np.float32)
    for row in range(n):
        amax = max(abs(F32(x)) for x in v[row])
        scale[row] = F32(amax / F32(127)) if amax > 0 else F32(0)
        inv = F32(F32(1) / scale[row]) if scale[row] > 0 else F32(0)
        for j, x in enumerate(v[row]):
            y = float(F32(F32(x) * inv))
            q[row, j] = min(max(int(math.copysign(math.floor(abs(y) + 0.5), y)), -127), 127)
    return q, scale


@given(st.integers(1, 9), st.integers(1, 70), st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_quantize_per_channel_executions_match_scalar_model(n, k, seed):
    """Float weights (the dequantized Q5_0/Q6_K/… the backend requantizes) → per-channel int8: both executions
    give the scalar model's bits, ties and a zero row included."""
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
    v[0] = np.clip(v[0], -100, 100)
    v[0, : min(k, 5)] = np.array([127, 0.5, -0.5, 2.5, -2.5], np.float32)[: min(k, 5)]  # scale 1: ties stay ties
    if n > 2:
        v[-1] = 0
    want = _model_quantize(v)
    for execution in EXECUTIONS:
        q, scale = fam.quantize_per_channel(v, execution=execution)
        assert np.array_equal(q, want[0]), execution
        assert bits_equal(scale, want[1]), execution


def test_requantize_q8_0_bad_inputs():
    blocks = _q8_0_blocks(np.random.default_rng(1), 2, 64)
    with pytest.raises(KernelShapeError):
        fam.requantize_q8_0_per_channel(blocks, 2, 48)
    with pytest.raises(BufferSizeError):
        fam.requantize_q8_0_per_channel(blocks, 3, 64)
    with pytest.raises(DTypeError):
        fam.requantize_q8_0_per_channel(blocks.view(np.int8), 2, 64)
    blocks[0, 1, :2] = np.array([np.inf], dtype=np.float16).view(np.uint8)
    with pytest.raises(NonFiniteInputError):
        fam.requantize_q8_0_per_channel(blocks, 2, 64)


# --------------------------------------------------------------------------------------------- packers


def test_lhs_quantization_rounds_ties_away_from_zero():
    # rmin = 0, rmax = 255: scale = 1, zero point −128; 2.5 → 3 (ties to even would give 2)
    row = np.array([[255.0, 2.5, 0.5, 1.5, 0.0]], dtype=np.float32)
    for execution in EXECUTIONS:
        packed = get_packer("lhs_quant_pack_qai8dxp_f32").run(1, 5, 1, 4, 1, row, execution=execution)
        q = np.asarray(packed[:32]).view(np.int8)
        assert q[:5].tolist() == [127, 3 - 128, 1 - 128, 2 - 128, -128]
        assert q[5:].tolist() == [-128] * 27  # K padding copies the last value
        assert np.asarray(packed[32:36]).view(np.int32)[0] == 128


@HYP
@given(
    m=st.integers(1, 13),
    k=st.integers(1, 100),
    geo=st.sampled_from([(4, 8, 1), (4, 4, 1), (1, 4, 1), (1, 8, 1), (16, 4, 1), (4, 16, 2)]),
    row_offset=st.integers(0, 3),
    seed=st.integers(0, 2**31),
)
def test_lhs_packer_jit_reference_and_model_agree(m, k, geo, row_offset, seed):
    mr, kr, sr = geo
    row_offset %= mr
    lhs = random_case(seed, m, 1, k)[0]
    lhs[0, 0] = 0.0
    packer = get_packer("lhs_quant_pack_qai8dxp_f32")
    ref = packer.run(m, k, mr, kr, sr, lhs, m_idx_start=row_offset, execution="reference")
    jit = packer.run(m, k, mr, kr, sr, lhs, m_idx_start=row_offset, execution="jit")
    assert np.array_equal(ref, jit)
    assert bytes(ref) == model_lhs_packed(lhs, mr, kr, sr, row_offset)


def test_lhs_packer_constant_rows_strides_and_threads():
    packer = get_packer("lhs_quant_pack_qai8dxp_f32")
    lhs = np.zeros((9, 40), dtype=np.float32)
    lhs[1] = 3.0
    lhs[2] = -2.0
    lhs[3, 7] = 1e-30
    wide = np.zeros((9, 48), dtype=np.float32)
    wide[:, :40] = lhs
    expect = model_lhs_packed(lhs, 4, 8, 1)
    for execution in EXECUTIONS:
        assert bytes(packer.run(9, 40, 4, 8, 1, lhs, execution=execution)) == expect
        assert bytes(packer.run(9, 40, 4, 8, 1, wide, lhs_stride=48 * 4, execution=execution)) == expect
        assert bytes(packer.run(9, 40, 4, 8, 1, lhs, threads=2, execution=execution)) == expect


@HYP
@given(
    n=st.integers(1, 40),
    k=st.integers(1, 100),
    nr=st.sampled_from([4, 16, 64]),
    kr=st.sampled_from([4, 8]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_rhs_packer_jit_reference_and_model_agree(n, k, nr, kr, with_bias, seed):
    _, q, scale, bias = random_case(seed, 1, n, k)
    bias = bias if with_bias else None
    packer = get_packer("rhs_pack_nxk_qsi8cxp_qsi8cx_neon")
    ref = packer.run(n, k, nr, kr, 1, q, scale=scale, bias=bias, execution="reference")
    jit = packer.run(n, k, nr, kr, 1, q, scale=scale, bias=bias, execution="jit")
    assert np.array_equal(ref, jit)
    assert bytes(ref) == model_rhs_qsi8cxp(q, scale, bias, nr, kr)


# --------------------------------------------------------------------------------------------- kernels


@HYP
@given(
    name=st.sampled_from(KERNEL_NAMES),
    svl=st.sampled_from(SVLS),
    m=st.integers(1, 24),
    n=st.integers(1, 70),
    k=st.integers(1, 130),
    clamp=st.sampled_from([None, (-0.5, 0.5), (0.0, FLT_MAX), (-FLT_MAX, -0.1)]),
    seed=st.integers(0, 2**31),
)
def test_kernels_jit_equals_reference_equals_model(name, svl, m, n, k, clamp, seed):
    kernel = get_kernel(name, svl)
    m = 1 if kernel.kind == "gemv" else m
    lhs, q, scale, bias = random_case(seed, m, n, k)
    lo, hi = clamp or (-FLT_MAX, FLT_MAX)
    outs = []
    for execution in EXECUTIONS:
        rhs_packed = kernel.pack_rhs(n, k, q, scale=scale, bias=bias, execution=execution)
        lhs_packed = kernel.pack_lhs(lhs, execution=execution)
        outs.append(kernel.run(m, n, k, lhs_packed, rhs_packed, clamp_min=lo, clamp_max=hi, execution=execution))
    assert bits_equal(outs[0], outs[1])
    model = np.minimum(np.maximum(model_dst(lhs, q, scale, bias, kernel.recipe), F32(lo)), F32(hi))
    assert bits_equal(outs[0], model)


@pytest.mark.parametrize("name", [NEON_I8MM, SME_DOT])
def test_large_accumulators_round_in_scvtf(name):
    """|acc| > 2^24: f32(acc) rounds to nearest even; every execution must reproduce that rounding."""
    kernel = get_kernel(name, 512)
    m, n, k = 1, 8, 1100
    rng = np.random.default_rng(3)
    lhs = (rng.random((m, k)) * 10 + 5).astype(np.float32)  # all positive: q − zp up to 255
    q = rng.integers(100, 128, (n, k), dtype=np.int8)
    scale = np.full(n, 1.0, dtype=np.float32)
    bias = np.zeros(n, dtype=np.float32)
    model = model_dst(lhs, q, scale, bias, kernel.recipe)
    qrow, nzp, _ = model_quant_row(lhs[0], k)
    accs = [sum((qrow[kk] - nzp) * int(q[j, kk]) for kk in range(k)) for j in range(n)]
    assert any(abs(a) > 2**24 and float(F32(float(a))) != a for a in accs)
    for execution in EXECUTIONS:
        out = kernel.run(
            m, n, k, kernel.pack_lhs(lhs), kernel.pack_rhs(n, k, q, scale=scale, bias=bias), execution=execution
        )
        assert bits_equal(out, model)


@pytest.mark.parametrize("name", [NEON_I8MM, SME_MOPA])
def test_threads_split_columns_without_changing_bits(name):
    kernel = get_kernel(name, 256)
    lhs, q, scale, bias = random_case(5, 21, 75, 70)
    lp, rp = kernel.pack_lhs(lhs), kernel.pack_rhs(75, 70, q, scale=scale, bias=bias)
    assert_threads_keep_bits(kernel, 21, 75, 70, lp, rp, EXECUTIONS)


def test_kernel_geometry_and_identity():
    assert_sme_geometry(SME_MOPA, SME_DOT, SVLS, 4, 1)
    i8mm = get_kernel(NEON_I8MM)
    assert (i8mm.m_step, i8mm.n_step, i8mm.mr, i8mm.nr, i8mm.kr, i8mm.sr) == (16, 4, 4, 4, 8, 1)
    tiers = {k.name: (k.tier, k.kind) for k in fam.KERNELS}
    assert tiers[SME_MOPA] == ("sme2", "gemm") and tiers[SME_DOT] == ("sme2", "gemv")
    assert tiers[NEON_I8MM] == ("i8mm", "gemm") and tiers[NEON_GEMV] == ("dotprod", "gemv")
    assert {k.bl for k in fam.KERNELS} == {None}
    assert not fam.LHS_PACKER.blocked and not fam.RHS_PACKER.blocked


# --------------------------------------------------------------------------------------------- bad inputs


def test_bad_inputs_raise_typed_errors():
    kernel = get_kernel(NEON_I8MM)
    lhs, q, scale, bias = random_case(2, 5, 9, 40)
    lp, rp = kernel.pack_lhs(lhs), kernel.pack_rhs(9, 40, q, scale=scale)
    with pytest.raises(KernelShapeError):  # block length on a per-channel kernel
        kernel.run(5, 9, 40, lp, rp, bl=32)
    with pytest.raises(KernelShapeError):
        fam.LHS_PACKER.run(5, 40, 4, 8, 1, lhs, bl=32)
    with pytest.raises(KernelShapeError):  # kr/sr not dividing 32
        fam.LHS_PACKER.run(5, 40, 4, 12, 1, lhs)
    with pytest.raises(KernelShapeError):
        fam.RHS_PACKER.run(9, 40, 4, 8, 2, q, scale=scale)
    with pytest.raises(KernelShapeError):  # m > 1 on a GEMV kernel
        get_kernel(NEON_GEMV).run(2, 9, 40, lp, rp)
    with pytest.raises(BufferSizeError):
        kernel.run(5, 9, 40, np.asarray(lp)[:-1], np.asarray(rp))
    with pytest.raises(BufferSizeError):
        kernel.run(5, 9, 40, np.asarray(lp), np.asarray(rp)[:-4])
    with pytest.raises(BufferSizeError):
        kernel.pack_rhs(9, 40, q[:8], scale=scale)
    with pytest.raises(BufferSizeError):
        kernel.pack_rhs(9, 40, q, scale=scale[:8])
    with pytest.raises(DTypeError):
        kernel.pack_rhs(9, 40, q.astype(np.int16), scale=scale)
    with pytest.raises(DTypeError):
        kernel.pack_rhs(9, 40, q, scale=scale.astype(np.float64))
    with pytest.raises(DTypeError):
        kernel.pack_lhs(lhs.astype(np.float64))
    with pytest.raises(DTypeError):
        kernel.run(5, 9, 40, np.asarray(lp).view(np.int8), rp)
    with pytest.raises(KernelShapeError):  # the scale input is required
        kernel.pack_rhs(9, 40, q)
    bad = lhs.copy()
    bad[3, 4] = np.nan
    with pytest.raises(NonFiniteInputError):
        kernel.pack_lhs(bad)
    bad[3, 4] = -np.inf
    with pytest.raises(NonFiniteInputError):
        kernel.pack_lhs(bad)


def test_buffers_packed_for_another_kernel_or_svl_are_refused():
    lhs, q, scale, _ = random_case(4, 4, 70, 64)
    mopa = get_kernel(SME_MOPA, 512)
    lp, rp = mopa.pack_lhs(lhs), mopa.pack_rhs(70, 64, q, scale=scale)
    with pytest.raises(PackedLayoutMismatchError):
        get_kernel(SME_MOPA, 256).run(4, 70, 64, lp, rp)
    with pytest.raises(PackedLayoutMismatchError):
        get_kernel(NEON_I8MM).run(4, 70, 64, lp, rp)
    with pytest.raises(PackedLayoutMismatchError):  # same packer, other kr
        neon_dot = get_kernel("matmul_clamp_f32_qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod")
        neon_dot.run(4, 70, 64, get_kernel(NEON_I8MM).pack_lhs(lhs), neon_dot.pack_rhs(70, 64, q, scale=scale))
