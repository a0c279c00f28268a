"""Per-channel int4 family (qai8dxp × qsi4cxp): golden runs, jit == reference, reference == independent scalar
models of the two README RHS layouts and of each kernel's recipe, K and N tails, threads, and bad inputs."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernel_helpers import assert_sme_geometry, assert_threads_keep_bits, bits_equal, family_runs, verify_family
from qai8dxp_models import HYP, SVLS, model_dst, model_lhs_packed

from kleidipy.core.numerics import FLT_MAX, fma_f32
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError, PackedLayoutMismatchError
from kleidipy.kernels.catalogue import get_kernel, get_packer
from kleidipy.kernels.qai8dxp_qsi4cxp import ukernels as fam
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as core

KERNEL_NAMES = [k.name for k in fam.KERNELS]
SME_MOPA = "matmul_clamp_f32_qai8dxp1vlx8_qsi4cxp4vlx8_1vlx4vl_sme2_mopa"
SME_DOT = "matmul_clamp_f32_qai8dxp1x4_qsi4cxp4vlx4_1x4vl_sme2_sdot"
NEON_I8MM = "matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_8x4x32_neon_i8mm"
NEON_GEMV = "matmul_clamp_f32_qai8dxp1x8_qsi4cxp4x8_1x4x32_neon_dotprod"
NEON_PACKER = "rhs_pack_nxk_qsi4cxp_qs4cxs1s0"
SME_PACKER = "rhs_pack_nxk_qsi4cxps1s0_qsu4cxs1s0_neon"
EXECUTIONS = ("reference", "jit")


# --------------------------------------------------------------------------------------------- models


def codes_of(packed_codes: np.ndarray, k: int) -> np.ndarray:
    """u [n, k] from the s1s0 input: element k in nibble k%2 of byte k//2."""
    return np.stack([packed_codes & 15, packed_codes >> 4], axis=2).reshape(len(packed_codes), -1)[:, :k]


def model_rhs_neon(packed_codes, scale, bias, nr, kr, sr, k) -> bytes:  # noqa: ANN001
    """README 'RHS qsi4cxp_qs4cxs1s0': data byte db → blen = kr/sr, blk = db//blen, sb = blk//nr, col = blk%nr,
    t = sb·blen + db%blen, k0 = 32(t//16) + t%16, k1 = k0 + 16, byte = (u[k0] | u[k1]<<4) XOR 0x88 (u = 8 past K);
    then nr int32 16·Σ(u−8), nr f32 scale/16, nr f32 bias; padding copies row N−1."""
    u = codes_of(packed_codes, k).astype(int)
    n = len(u)
    k_int, blen = core.k_internal(k), kr // sr
    stride = nr * (k_int // 2 + 12)
    out = bytearray(-(-n // nr) * stride)
    for g in range(-(-n // nr)):
        for db in range(nr * k_int // 2):
            blk = db // blen
            sb, col = divmod(blk, nr)
            t = sb * blen + db % blen
            k0 = 32 * (t // 16) + t % 16
            src = min(g * nr + col, n - 1)
            lo, hi = (u[src, kk] if kk < k else 8 for kk in (k0, k0 + 16))
            out[g * stride + db] = (lo | hi << 4) ^ 0x88
        base = g * stride + nr * k_int // 2
        for col in range(nr):
            src = min(g * nr + col, n - 1)
            struct.pack_into("<i", out, base + 4 * col, 16 * int((u[src] - 8).sum()))
            struct.pack_into("<f", out, base + 4 * nr + 4 * col, np.float32(scale[src] * np.float32(0.0625)))
            struct.pack_into("<f", out, base + 8 * nr + 4 * col, 0.0 if bias is None else bias[src])
    return bytes(out)


def model_rhs_sme(packed_codes, scale, bias, nr, kr, k) -> bytes:  # noqa: ANN001
    """README 'RHS qsi4cxps1s0_qsu4cxs1s0_neon': chunk c, column r → kr/2 bytes at c·nr·kr/2 + r·kr/2, byte j =
    (u[c·kr+2j]−8)&15 | ((u[c·kr+2j+1]−8)&15)<<4 (0 past K); then nr int32 Σ(u−8), nr f32 scale, nr f32 bias;
    padding columns all 0."""
    u = codes_of(packed_codes, k).astype(int)
    n = len(u)
    k_int = core.k_internal(k)
    stride = nr * (k_int // 2 + 12)
    out = bytearray(-(-n // nr) * stride)
    for col_global in range(n):
        g, r = divmod(col_global, nr)
        w = [u[col_global, kk] - 8 if kk < k else 0 for kk in range(k_int)]
        for c in range(k_int // kr):
            for j in range(kr // 2):
                out[g * stride + c * nr * kr // 2 + r * kr // 2 + j] = (w[c * kr + 2 * j] & 15) | (
                    (w[c * kr + 2 * j + 1] & 15) << 4
                )
        base = g * stride + nr * k_int // 2
        struct.pack_into("<i", out, base + 4 * r, sum(w))
        struct.pack_into("<f", out, base + 4 * nr + 4 * r, scale[col_global])
        struct.pack_into("<f", out, base + 8 * nr + 4 * r, 0.0 if bias is None else bias[col_global])
    return bytes(out)


def model_rhs(name, packed_codes, scale, bias, nr, kr, sr, k) -> bytes:  # noqa: ANN001
    if name == NEON_PACKER:
        return model_rhs_neon(packed_codes, scale, bias, nr, kr, sr, k)
    return model_rhs_sme(packed_codes, scale, bias, nr, kr, k)


def model_kernel(kernel, lhs, packed_codes, scale, bias, k) -> np.ndarray:  # noqa: ANN001
    """The NEON kernels multiply 16·w and scale/16; the SME2 ones w and scale."""
    w = codes_of(packed_codes, k).astype(np.int64) - 8
    if kernel.rhs_packer.name == NEON_PACKER:
        return model_dst(lhs, w, scale, bias, kernel.recipe, weight_factor=16, scale_factor=0.0625)
    return model_dst(lhs, w, scale, bias, kernel.recipe)


def random_case(seed: int, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lhs = (rng.standard_normal((m, k)) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
    codes = rng.integers(0, 256, (n, -(-k // 2)), dtype=np.uint8)
    scale = (rng.random(n) * 0.1).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return lhs, codes, scale, bias


# --------------------------------------------------------------------------------------------- golden


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_golden_runs_bit_exact(golden_dir, execution):
    count, failures = verify_family(golden_dir, fam.FAMILY_NAME, execution)
    assert count == 66
    assert not failures, "\n".join(failures[:10])


def test_golden_packed_buffers_match_the_readme_models(golden_dir):
    golden, runs = family_runs(golden_dir, fam.FAMILY_NAME)
    seen = set()
    for case, run in runs:
        p, packer = run["params"], run["kernels"]["rhs_pack"].removeprefix("kai_run_")
        key = (id(case), p["mr"], p["nr"], p["kr"], packer)
        if key in seen or case["m"] > 16:
            continue
        seen.add(key)
        m, n, k = case["m"], case["n"], case["k"]
        lhs = golden.array(case["inputs"]["lhs_f32"]).reshape(m, k)
        assert model_lhs_packed(lhs, p["mr"], p["kr"], p["sr"]) == golden.read(run["files"]["lhs_packed"])
        codes = golden.array(case["inputs"]["rhs_qsu4cx_s1s0"]).reshape(n, -1)
        scale = golden.array(case["inputs"]["rhs_qsu4cx_scale_f32"])
        expect = model_rhs(packer, codes, scale, None, p["nr"], p["kr"], p["sr"], k)
        assert expect == golden.read(run["files"]["rhs_packed"])


def test_sme2_mopa_uses_the_integer_zero_point_correction(golden_dir):
    """v1.16's SME2 MOPA added f32(f32(−zp)·f32(Σw))·S in float; the v1.30 golden dst is the integer recipe."""
    golden, runs = family_runs(golden_dir, fam.FAMILY_NAME)
    for case, run in runs:
        if run["variant"] != "clamp_f32_qai8dxp1vlx8_qsi4cxp4vlx8_1vlx4vl_sme2_mopa" or run["clamped"]:
            continue
        m, n, k = case["m"], case["n"], case["k"]
        kernel = get_kernel(SME_MOPA, run["svl_bytes"] * 8)
        lhs = np.asarray(golden.array(run["files"]["lhs_packed"]))
        rhs = np.asarray(golden.array(run["files"]["rhs_packed"]))
        q, offsets, recip = core.unpack_lhs(lhs, m, k, kernel.mr, 4)
        w, sums, scales, biases = kernel.rhs_packer.unpack(rhs, n, k, kernel.nr, 4, 1)
        dot = core.wrap_i32(q.astype(np.int64) @ w.T).astype(np.float32)
        s = scales[None, :] * recip[:, None]
        correction = (offsets.astype(np.float32)[:, None] * sums.astype(np.float32)[None, :]) * s
        float_zp = fma_f32(s, dot, correction) + biases
        gold = golden.array(run["files"]["dst"]).reshape(m, n)
        assert (float_zp.view(np.uint32) != gold.view(np.uint32)).any()  # the v1.16 recipe gives other bits
        assert bits_equal(kernel.run(m, n, k, lhs, rhs), gold)


# --------------------------------------------------------------------------------------------- packers


@HYP
@given(
    packer=st.sampled_from([NEON_PACKER, SME_PACKER]),
    n=st.integers(1, 40),
    k=st.integers(1, 100),
    nr=st.sampled_from([4, 16, 64]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_rhs_packers_jit_reference_and_model_agree(packer, n, k, nr, with_bias, seed):
    kr, sr = (16, 2) if packer == NEON_PACKER else (4, 1)
    _, codes, scale, bias = random_case(seed, 1, n, k)
    bias = bias if with_bias else None
    p = get_packer(packer)
    ref = p.run(n, k, nr, kr, sr, codes, scale=scale, bias=bias, execution="reference")
    jit = p.run(n, k, nr, kr, sr, codes, scale=scale, bias=bias, execution="jit")
    assert np.array_equal(ref, jit)
    assert bytes(ref) == model_rhs(packer, codes, scale, bias, nr, kr, sr, k)


def test_odd_k_ignores_the_unused_high_nibble():
    """With odd K the last input byte's high nibble is not an element: it must not reach the packed data."""
    codes = np.array([[0x21, 0xF3, 0xA5]], dtype=np.uint8)  # k = 5: u = 1, 2, 3, 15, 5 (0xA ignored)
    other = codes.copy()
    other[0, 2] = 0x05
    scale = np.ones(1, dtype=np.float32)
    for name, kr, sr in ((NEON_PACKER, 16, 2), (SME_PACKER, 4, 1)):
        for execution in EXECUTIONS:
            a = get_packer(name).run(1, 5, 4, kr, sr, codes, scale=scale, execution=execution)
            b = get_packer(name).run(1, 5, 4, kr, sr, other, scale=scale, execution=execution)
            assert np.array_equal(a, b)


# --------------------------------------------------------------------------------------------- kernels


@HYP
@given(
    name=st.sampled_from(KERNEL_NAMES),
    svl=st.sampled_from(SVLS),
    m=st.integers(1, 20),
    n=st.integers(1, 70),
    k=st.integers(1, 100),
    clamp=st.sampled_from([None, (-0.5, 0.5), (0.0, FLT_MAX)]),
    seed=st.integers(0, 2**31),
)
def test_kernels_jit_equals_reference_equals_model(name, svl, m, n, k, clamp, seed):
    kernel = get_kernel(name, svl)
    m = 1 if kernel.kind == "gemv" else m
    lhs, codes, scale, bias = random_case(seed, m, n, k)
    lo, hi = clamp or (-FLT_MAX, FLT_MAX)
    outs = []
    for execution in EXECUTIONS:
        rhs_packed = kernel.pack_rhs(n, k, codes, scale=scale, bias=bias, execution=execution)
        lhs_packed = kernel.pack_lhs(lhs, execution=execution)
        outs.append(kernel.run(m, n, k, lhs_packed, rhs_packed, clamp_min=lo, clamp_max=hi, execution=execution))
    assert bits_equal(outs[0], outs[1])
    model = model_kernel(kernel, lhs, codes, scale, bias, k)
    model = np.minimum(np.maximum(model, np.float32(lo)), np.float32(hi))
    assert bits_equal(outs[0], model)


@pytest.mark.parametrize("name", [NEON_I8MM, SME_MOPA])
def test_threads_split_columns_without_changing_bits(name):
    kernel = get_kernel(name, 128)
    lhs, codes, scale, bias = random_case(9, 19, 50, 64)
    lp, rp = kernel.pack_lhs(lhs), kernel.pack_rhs(50, 64, codes, scale=scale, bias=bias)
    assert_threads_keep_bits(kernel, 19, 50, 64, lp, rp, EXECUTIONS)


def test_kernel_geometry_and_identity():
    assert_sme_geometry(SME_MOPA, SME_DOT, SVLS, 4, 1)
    for svl in SVLS:
        assert get_kernel(SME_MOPA, svl).rhs_packer.name == get_kernel(SME_DOT, svl).rhs_packer.name == SME_PACKER
    steps = {k.name: (k.m_step, k.n_step, k.mr, k.nr, k.kr, k.sr, k.tier, k.kind) for k in fam.KERNELS}
    assert steps[NEON_I8MM] == (8, 4, 4, 4, 16, 2, "i8mm", "gemm")
    assert steps["matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm"] == (4, 4, 4, 4, 16, 2, "i8mm", "gemm")
    assert steps[NEON_GEMV] == (1, 4, 1, 4, 16, 2, "dotprod", "gemv")
    assert get_kernel(SME_DOT).recipe == core.Recipe.FMA_BIAS and get_kernel(NEON_GEMV).recipe == core.Recipe.FMUL_FADD


# --------------------------------------------------------------------------------------------- bad inputs


def test_bad_inputs_raise_typed_errors():
    kernel = get_kernel(NEON_I8MM)
    lhs, codes, scale, _ = random_case(2, 6, 9, 45)
    lp, rp = kernel.pack_lhs(lhs), kernel.pack_rhs(9, 45, codes, scale=scale)
    with pytest.raises(DTypeError):  # signed codes
        kernel.pack_rhs(9, 45, codes.view(np.int8), scale=scale)
    with pytest.raises(BufferSizeError):  # ceil(45/2) = 23 bytes per row
        kernel.pack_rhs(9, 45, codes[:, :22].copy(), scale=scale)
    with pytest.raises(KernelShapeError):
        get_packer(SME_PACKER).run(9, 45, 4, 4, 1, codes, scale=scale, bl=32)
    with pytest.raises(KernelShapeError):
        get_kernel(NEON_GEMV).run(3, 9, 45, lp, rp)
    with pytest.raises(BufferSizeError):
        kernel.run(6, 9, 45, np.asarray(lp), np.asarray(rp)[:-1])
    with pytest.raises(PackedLayoutMismatchError):  # NEON-packed RHS into the SME2 kernel
        get_kernel(SME_MOPA, 128).run(6, 9, 45, get_kernel(SME_MOPA, 128).pack_lhs(lhs), rp)
    with pytest.raises(PackedLayoutMismatchError):  # SVL 128 buffers into the SVL 256 kernel
        sme = get_kernel(SME_DOT, 128)
        get_kernel(SME_DOT, 256).run(1, 9, 45, sme.pack_lhs(lhs[:1]), sme.pack_rhs(9, 45, codes, scale=scale))
