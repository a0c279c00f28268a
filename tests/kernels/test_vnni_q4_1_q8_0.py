"""AVX-512 VNNI execution of the Q4_1 (kleidipy.kernels.qsi8d32p_qai4c32p.vnni) and Q8_0
(kleidipy.kernels.qai8dxp_qsi8cxp.vnni) SME2-layout kernels: bit for bit equal to the portable jit functions they
replace and to the families' numpy references on random shapes with tails and every SVL; through the public kernels
(clamp, threads, golden runs) after switching them in; the fallbacks for other layouts and for hosts without
AVX-512 VNNI."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal, mixed_f32
from qai8dxp_models import call_matmul

from kleidipy.core.numerics import FLT_MAX
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qai8dxp_qsi8cxp import jit as q8_jit
from kleidipy.kernels.qai8dxp_qsi8cxp import neon as q8_native
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as q8_fam
from kleidipy.kernels.qai8dxp_qsi8cxp import vnni as q8_vnni
from kleidipy.kernels.qsi8d32p_qai4c32p import jit as q41_jit
from kleidipy.kernels.qsi8d32p_qai4c32p import sme2 as q41_sme2
from kleidipy.kernels.qsi8d32p_qai4c32p import ukernels as q41_fam
from kleidipy.kernels.qsi8d32p_qai4c32p import vnni as q41_vnni

needs_vnni = pytest.mark.skipif(not q41_vnni.HAVE_VNNI, reason="host lacks AVX-512 VNNI")
SVLS = (128, 256, 512, 1024, 2048)
HYP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Q41_MOPA = "matmul_clamp_f32_qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa"
Q41_DOT = "matmul_clamp_f32_qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot"
Q8_KERNELS = [
    "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa",
    "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot",
    "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa",
    "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot",
]


def lhs_rows(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """float32 rows of mixed magnitudes, with an all-zero 32-block in the first row."""
    x = rng.normal(size=(m, k)) * rng.choice([1e-3, 1.0, 1e3], size=(m, 1))
    x = x.astype(np.float32)
    x[0, : min(k, 32)] = 0.0
    return x


# --------------------------------------------------------------------------------------------- Q4_1


def q41_operands(kern, m: int, n: int, k: int, seed: int, with_bias: bool = True):  # noqa: ANN001, ANN201
    """Packed LHS and RHS (the family's jit packers) for a Q4_1 kernel; bias with −0.0 entries."""
    rng = np.random.default_rng(seed)
    nb = k // 32
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scale = mixed_f32(rng, (n, nb), 1e-4, 0.1)
    zero = mixed_f32(rng, (n, nb), 1e-3, 1.0)
    bias = np.where(rng.random(n) < 0.3, np.float32(-0.0), rng.normal(size=n)).astype(np.float32) if with_bias else None
    lhs = q41_fam.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, lhs_rows(rng, m, k), bl=32, execution="jit")
    rhs = kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, codes, bl=32, scale=scale, zero=zero, bias=bias)
    return lhs, rhs


def q41_functions(kern) -> tuple:  # noqa: ANN001
    """(VNNI function, portable jit function) of a Q4_1 SME2 kernel, ``(m, n, k, mr, nr, lhs, rhs)``."""
    fmul = bool(kern.flags.get("first_block_fmul"))
    return lambda *args: q41_vnni.compute_sme2(*args, fmul), lambda *args: q41_jit.matmul_sme2(*args, fmul)


@needs_vnni
@HYP
@given(
    m=st.integers(1, 21),
    n=st.integers(1, 200),
    nb=st.integers(1, 6),
    svl=st.sampled_from(SVLS),
    gemv=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_q4_1_random_shapes(m: int, n: int, nb: int, svl: int, gemv: bool, seed: int) -> None:
    kern = get_kernel(Q41_DOT if gemv else Q41_MOPA, svl)
    m = 1 if gemv else m
    k = 32 * nb
    lhs, rhs = q41_operands(kern, m, n, k, seed, with_bias=seed % 4 != 0)
    ours, portable = q41_functions(kern)
    lhs_u8, rhs_u8 = np.asarray(lhs), np.asarray(rhs)
    got = ours(m, n, k, kern.mr, kern.nr, lhs_u8, rhs_u8)
    assert bits_equal(got, portable(m, n, k, kern.mr, kern.nr, lhs_u8, rhs_u8))
    assert bits_equal(got, kern._reference(m, n, k, lhs_u8, rhs_u8))


@needs_vnni
@pytest.mark.parametrize("svl", [128, 512, 2048])
def test_q4_1_model_shapes(svl: int) -> None:
    """SmolLM2-like K (576 = 18 blocks), m across the direct/panel switch, n with a tail of 1..63 columns."""
    for name, m in (
        (Q41_DOT, 1),
        (Q41_MOPA, 1),
        (Q41_MOPA, 2),
        (Q41_MOPA, 3),
        (Q41_MOPA, 4),
        (Q41_MOPA, 5),
        (Q41_MOPA, 9),
        (Q41_MOPA, 33),
    ):
        kern = get_kernel(name, svl)
        n, k = 3 * kern.nr + 37, 576
        lhs, rhs = q41_operands(kern, m, n, k, svl + m)
        ours, portable = q41_functions(kern)
        lhs_u8, rhs_u8 = np.asarray(lhs), np.asarray(rhs)
        assert bits_equal(
            ours(m, n, k, kern.mr, kern.nr, lhs_u8, rhs_u8), portable(m, n, k, kern.mr, kern.nr, lhs_u8, rhs_u8)
        )


@needs_vnni
def test_q4_1_mopa_keeps_negative_zero() -> None:
    """An all-zero LHS (row sums and recips +0) against negative zeros and scales: every term is −0. The MOPA
    recipe's first zero term is an FMUL, so its sum stays −0 (and a −0 bias keeps it); the dot kernel's fma
    from +0 gives +0."""
    m, n, k = 1, 64, 64
    rng = np.random.default_rng(3)
    x = np.zeros((m, k), np.float32)
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scale = np.full((n, k // 32), -1.0, np.float32)
    zero = np.full((n, k // 32), -1.0, np.float32)
    bias = np.full(n, -0.0, np.float32)
    for name, sign in ((Q41_MOPA, 0x80000000), (Q41_DOT, 0)):
        kern = get_kernel(name, 512)
        lhs = q41_fam.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, bl=32, execution="jit")
        rhs = kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, codes, bl=32, scale=scale, zero=zero, bias=bias)
        ours, _ = q41_functions(kern)
        got = ours(m, n, k, kern.mr, kern.nr, np.asarray(lhs), np.asarray(rhs))
        assert (got.view(np.uint32) == sign).all(), name
        assert bits_equal(got, kern._reference(m, n, k, np.asarray(lhs), np.asarray(rhs)))


# --------------------------------------------------------------------------------------------- Q8_0


def q8_operands(kern, m: int, n: int, k: int, seed: int):  # noqa: ANN001, ANN201
    """Packed LHS and RHS (the family's jit packers) for a Q8_0 kernel; int8 weights include −128."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = mixed_f32(rng, (n,), 1e-4, 0.1)
    bias = np.where(rng.random(n) < 0.3, np.float32(-0.0), rng.normal(size=n)).astype(np.float32)
    lhs = q8_fam.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, lhs_rows(rng, m, k), execution="jit")
    rhs = kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, w, scale=scale, bias=bias)
    return np.asarray(lhs), np.asarray(rhs)


@needs_vnni
@HYP
@given(
    m=st.integers(1, 21),
    n=st.integers(1, 200),
    k=st.integers(1, 200),
    svl=st.sampled_from(SVLS),
    name=st.sampled_from(Q8_KERNELS),
    seed=st.integers(0, 2**32 - 1),
)
def test_q8_0_random_shapes(m: int, n: int, k: int, svl: int, name: str, seed: int) -> None:
    kern = get_kernel(name, svl)
    m = 1 if kern.kind == "gemv" else m
    lhs, rhs = q8_operands(kern, m, n, k, seed)
    got = call_matmul(q8_fam.MATMUL_COMPUTE, kern, m, n, k, lhs, rhs)
    assert bits_equal(got, call_matmul(q8_jit.matmul_qai8dxp, kern, m, n, k, lhs, rhs))
    assert bits_equal(got, kern._reference(m, n, k, lhs, rhs))


@needs_vnni
@pytest.mark.parametrize("svl", [128, 512, 2048])
def test_q8_0_wrapping_and_large_accumulators(svl: int) -> None:
    """Arbitrary stored row sums (the correction wraps modulo 2^32) and dots past 2^24 (SCVTF rounds)."""
    rng = np.random.default_rng(svl)
    for name, m in ((Q8_KERNELS[0], 7), (Q8_KERNELS[1], 1)):
        kern = get_kernel(name, svl)
        n, k = kern.nr + 21, 4000
        w = np.full((n, k), 127, np.int8)
        w[::3] = -128
        scale = np.full(n, 1e-6, np.float32)
        x = np.full((m, k), 1.0, np.float32)
        x[:, ::7] = 0.5
        lhs = np.asarray(q8_fam.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="jit"))
        rhs = np.asarray(kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, w, scale=scale)).copy()
        got = call_matmul(q8_fam.MATMUL_COMPUTE, kern, m, n, k, lhs, rhs)
        assert np.abs(got).max() / 1e-6 * 255 > 2**25  # |acc| past 2^24 (S = 1e-6 / 255: the LHS spans [0, 1])
        assert bits_equal(got, call_matmul(q8_jit.matmul_qai8dxp, kern, m, n, k, lhs, rhs))
        k_int = q8_fam.k_internal(k)
        stride = kern.rhs_packer.get_rhs_packed_stride(k, kern.nr, kern.kr, kern.sr)
        for g in range(-(-n // kern.nr)):  # random int32 row sums
            sums = rhs[g * stride + kern.nr * k_int :][: 4 * kern.nr].view(np.int32)
            sums[:] = rng.integers(-(2**31), 2**31, kern.nr)
        got = call_matmul(q8_fam.MATMUL_COMPUTE, kern, m, n, k, lhs, rhs)
        assert bits_equal(got, call_matmul(q8_jit.matmul_qai8dxp, kern, m, n, k, lhs, rhs))
        assert bits_equal(got, kern._reference(m, n, k, lhs, rhs))


@needs_vnni
def test_q8_0_int4_layout_falls_back() -> None:
    """The int4 per-channel family's layout goes to the portable function (the NEON int8 layouts have tiles of
    their own: tests/kernels/qai8dxp_qsi8cxp/test_qai8dxp_qsi8cxp_vnni_neon.py)."""
    int4 = get_kernel("matmul_clamp_f32_qai8dxp1x4_qsi4cxp4vlx4_1x4vl_sme2_sdot", 512)  # kr = 4, nr = 64: int4
    rng = np.random.default_rng(2)
    m, n, k = 1, 40, 64
    lhs = np.asarray(int4.lhs_packer.run(m, k, int4.mr, int4.kr, int4.sr, lhs_rows(rng, m, k), execution="jit"))
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    rhs = np.asarray(int4.rhs_packer.run(n, k, int4.nr, int4.kr, int4.sr, codes, scale=mixed_f32(rng, (n,), 1e-3, 1.0)))
    assert bits_equal(call_matmul(q8_fam.MATMUL_COMPUTE, int4, m, n, k, lhs, rhs), int4._reference(m, n, k, lhs, rhs))


# --------------------------------------------------------------------------------------------- switched in


def test_families_run_the_best_compute_for_this_host() -> None:
    """The public kernels' jit execution uses the VNNI functions where the host has AVX-512 VNNI (Q8_0: the native
    aarch64 tiles on an Arm host with DotProd)."""
    sme2 = q41_sme2.AVAILABLE  # (an Arm host with SME2: the native tiles)
    best = q41_vnni.compute_sme2 if q41_vnni.HAVE_VNNI else q41_jit.matmul_sme2
    assert q41_fam.SME2_COMPUTE is (q41_sme2.compute if sme2 else best)
    kern = get_kernel(Q8_KERNELS[0], 512)
    lay = kern.rhs_packer.layout(64, kern.nr, kern.kr, kern.sr)
    args = (kern.mr, 64, kern.kr // kern.sr, kern.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi)
    if not q8_native.AVAILABLE:  # x86: the Q8_0 chain runs the SME layouts on the VNNI tiles where the host has them
        assert q8_fam.is_tiled_layout(*args) == q8_vnni.HAVE_VNNI


@HYP
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 300),
    nb=st.integers(1, 4),
    svl=st.sampled_from([128, 512, 2048]),
    which=st.sampled_from([Q41_MOPA, Q41_DOT, *Q8_KERNELS]),
    clamp=st.sampled_from([(-FLT_MAX, FLT_MAX), (-0.5, 0.75), (0.0, 0.0), (-3.0, -1.0)]),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_public_kernels_jit_equals_reference(
    m: int, n: int, nb: int, svl: int, which: str, clamp: tuple, threads: int, seed: int
) -> None:
    kern = get_kernel(which, svl)
    m = 1 if kern.kind == "gemv" else m
    q4_1 = "qai4c32p" in which
    k = 32 * nb if q4_1 else 32 * nb - seed % 32
    lhs, rhs = (q41_operands if q4_1 else q8_operands)(kern, m, n, k, seed)
    want = kern.run(m, n, k, lhs, rhs, None, None, *clamp, execution="reference")
    got = kern.run(m, n, k, lhs, rhs, None, None, *clamp, execution="jit", threads=threads, min_split_macs=0)
    assert bits_equal(got, want)
