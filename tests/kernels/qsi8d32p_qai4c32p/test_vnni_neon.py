"""AVX-512 VNNI tiles of the Q4_1 NEON-layout kernels (kleidipy.kernels.qsi8d32p_qai4c32p.vnni.compute_neon):
bit for bit equal to the portable jit loop they replace and to the family's numpy reference, for every NEON
kernel, on random shapes (m across the direct/panel switch, n with tails of the 4-column groups, 16-column
vectors and 64-column tiles), on SmolLM2-like K, with signed zeros and large magnitudes; and the selection of
the compute function (eager and compiled plan, one chain)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal, mixed_f32

from kleidipy.core import vnni
from kleidipy.core.numerics import FLT_MAX
from kleidipy.graph import matmul as mm
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qsi8d32p_qai4c32p import jit as q41_jit
from kleidipy.kernels.qsi8d32p_qai4c32p import neon as q41_native
from kleidipy.kernels.qsi8d32p_qai4c32p import ukernels as fam
from kleidipy.kernels.qsi8d32p_qai4c32p import vnni as q41_vnni

needs_vnni = pytest.mark.skipif(not q41_vnni.HAVE_VNNI, reason="host lacks AVX-512 VNNI")
HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NEON_KERNELS = [k.name for k in fam.KERNELS if k.rhs_packer.neon]


def operands(kern, m: int, n: int, k: int, seed: int, big: bool = False) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Packed LHS and RHS (the family's packers) of a NEON kernel: LHS rows of mixed magnitudes (an all-zero
    block in row 0), bias with −0.0 entries; ``big``: scales, zeros and rows near the float32 range."""
    rng = np.random.default_rng(seed)
    nb = k // 32
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    top = 1e30 if big else 1.0
    scale = mixed_f32(rng, (n, nb), 1e-4, 0.1 * top)
    zero = mixed_f32(rng, (n, nb), 1e-3, top)
    bias = np.where(rng.random(n) < 0.3, np.float32(-0.0), rng.normal(size=n)).astype(np.float32)
    x = rng.normal(size=(m, k)) * rng.choice([1e-3, 1.0, 1e6 if big else 1e3], size=(m, 1))
    x = x.astype(np.float32)
    x[0, :32] = 0.0
    lhs = kern.pack_lhs(x, execution="jit")
    rhs = kern.pack_rhs(n, k, codes, scale=scale, zero=zero, bias=bias, execution="jit")
    return np.asarray(lhs)[: kern.lhs_packed_size(m, k)].copy(), np.asarray(rhs)[: kern.rhs_packed_size(n, k)].copy()


def check(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """The VNNI tiles == the portable jit loop == the numpy reference, bit for bit; returns the result."""
    kbl = kern.kr // kern.sr
    got = q41_vnni.compute_neon(m, n, k, kern.mr, kern.nr, kbl, lhs, rhs)
    assert bits_equal(got, q41_jit.matmul_neon(m, n, k, kern.mr, kern.nr, kbl, lhs, rhs)), (kern.name, m, n, k)
    assert bits_equal(got, kern._reference(m, n, k, lhs, rhs)), (kern.name, m, n, k)
    return got


@pytest.mark.parametrize("isa", [vnni.PORTABLE] + ([vnni.VNNI512] if vnni.HAS_AVX512_VNNI else []), ids=str)
@pytest.mark.parametrize(("mr", "groups"), [(1, 8), (1, 16), (2, 4), (2, 8), (4, 8), (8, 4), (16, 8), (32, 8)])
def test_neg_block_sums(isa: vnni.Isa, mr: int, groups: int) -> None:
    """core.vnni.neg_block_sums (vpdpbusd for mr % 16 == 0 and for 16 % mr == 0 with whole vectors, scalar
    otherwise) against numpy, on the packed-LHS geometry of this family and the −128 weight of the NEON codes."""
    rng = np.random.default_rng(mr * groups)
    m, nb = 3 * mr - 1, 3
    block_bytes = mr * (4 * groups + 8)
    lhs = rng.integers(0, 256, -(-m // mr) * nb * block_bytes, dtype=np.uint8)
    q = lhs.view(np.int8).reshape(-1, nb, block_bytes)[:, :, : 4 * groups * mr].astype(np.int64)
    want = -128 * q.reshape(-1, nb, groups, mr, 4).sum(axis=(2, 4))
    got = vnni.neg_block_sums(isa, lhs, m, mr, nb * block_bytes, nb, block_bytes, groups, 128)
    assert np.array_equal(got, want.astype(np.int32).reshape(-1))


@needs_vnni
@pytest.mark.parametrize("name", NEON_KERNELS)
def test_lhs_terms(name: str) -> None:
    """The tiles' accumulator starts: −128·Σq per row and block of the packed LHS (chunks of 4 or 8 values)."""
    kern = get_kernel(name)
    m, k = 7, 160
    lhs, _ = operands(kern, m, 4, k, 5)
    q, _, _ = fam.unpack_lhs(lhs, m, k, kern.mr, kern.kr // kern.sr)
    groups = -(-m // kern.mr)
    want = np.zeros((groups * kern.mr, k // 32), np.int64)
    want[:m] = -128 * q.sum(axis=-1)
    want = want.reshape(groups, kern.mr, -1).transpose(0, 2, 1).reshape(-1)
    got = q41_vnni._lhs_terms(m, k, kern.mr, kern.kr // kern.sr, lhs, q41_vnni.NEON_WEIGHT)
    assert np.array_equal(got, want.astype(np.int32))


@needs_vnni
@HYP
@given(
    name=st.sampled_from(NEON_KERNELS),
    m=st.integers(1, 9),
    n=st.integers(1, 200),
    nb=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shapes(name: str, m: int, n: int, nb: int, seed: int) -> None:
    kern = get_kernel(name)
    lhs, rhs = operands(kern, m, n, 32 * nb, seed)
    check(kern, m, n, 32 * nb, lhs, rhs)


@needs_vnni
@pytest.mark.parametrize("name", NEON_KERNELS)
def test_model_shapes(name: str) -> None:
    """SmolLM2-like K (576, 1536), m across the direct/panel switch and partial row tiles, n with a tail."""
    for m, n, k in (
        (1, 157, 576),
        (2, 64, 576),
        (3, 203, 1536),
        (4, 70, 576),
        (5, 130, 576),
        (9, 77, 576),
        (33, 66, 96),
    ):
        kern = get_kernel(name)
        lhs, rhs = operands(kern, m, n, k, m * n + k)
        check(kern, m, n, k, lhs, rhs)


@needs_vnni
@pytest.mark.parametrize("name", NEON_KERNELS)
def test_large_magnitudes(name: str) -> None:
    """Scales and zeros up to 1e30 and rows up to 1e6: products near and past the float32 range (±inf)."""
    kern = get_kernel(name)
    for m, n, seed in ((1, 45, 1), (4, 70, 2), (7, 19, 3)):
        lhs, rhs = operands(kern, m, n, 128, seed, big=True)
        check(kern, m, n, 128, lhs, rhs)


@needs_vnni
@pytest.mark.parametrize("name", NEON_KERNELS)
def test_signed_zeros(name: str) -> None:
    """An all-zero LHS (row sums and recips +0) against negative zeros and scales, bias −0: every term is −0, the
    NEON recipe's fma from +0 makes the sum +0 and +0 + −0 stays +0; with zero = −0 and bias −0 the same."""
    kern = get_kernel(name)
    m, n, k = 3, 21, 64
    x = np.zeros((m, k), np.float32)
    codes = np.random.default_rng(4).integers(0, 256, (n, k // 2), dtype=np.uint8)
    bias = np.full(n, -0.0, np.float32)
    lhs = np.asarray(kern.pack_lhs(x, execution="jit"))[: kern.lhs_packed_size(m, k)].copy()
    for value in (-1.0, -0.0):
        field = np.full((n, k // 32), value, np.float32)
        rhs = np.asarray(kern.pack_rhs(n, k, codes, scale=field, zero=field, bias=bias, execution="jit"))
        got = check(kern, m, n, k, lhs, rhs[: kern.rhs_packed_size(n, k)].copy())
        assert (got.view(np.uint32) == 0).all()


@needs_vnni
def test_padding_columns_are_ignored() -> None:
    """Junk in the padding columns of the last group (n % 4 != 0) does not reach the n real columns."""
    kern = get_kernel(NEON_KERNELS[0])
    m, n, k = 5, 18, 96
    lhs, rhs = operands(kern, m, n, k, 8)
    want = check(kern, m, n, k, lhs, rhs)
    stride = kern.rhs_packed_size(kern.nr, k)
    dirty = rhs.copy()
    group = dirty[(n // 4) * stride :]
    chunk = kern.kr // kern.sr
    for b in range(k // 32):  # padding columns 2, 3 of the last group: their code bytes and zero/scale fields
        block = group[b * 96 : (b + 1) * 96]
        for j in range(16):
            for c in (2, 3):
                block[((j // chunk) * 4 + c) * chunk + j % chunk] = 0xA5
        block[64 + 8 : 64 + 16] = 0xFF  # zeros of columns 2, 3: NaN
        block[80 + 8 : 80 + 16] = 0xFF
    got = q41_vnni.compute_neon(m, n, k, kern.mr, kern.nr, kern.kr // kern.sr, lhs, dirty)
    assert bits_equal(got, want)


@pytest.mark.parametrize("name", NEON_KERNELS)
def test_kernel_runs_the_best_compute(name: str) -> None:
    """The jit execution of a NEON kernel runs the native aarch64 tiles where the host has them, else the VNNI tiles
    where it has those, else the portable loop; the public run (clamped or not) gives the reference's bits either
    way."""
    best = q41_vnni.compute_neon if q41_vnni.HAVE_VNNI else q41_jit.matmul_neon
    assert fam.NEON_COMPUTE is (q41_native.compute if q41_native.AVAILABLE else best)
    kern = get_kernel(name)
    m, n, k = 1 if kern.kind == "gemv" else 6, 37, 160
    lhs, rhs = operands(kern, m, n, k, 11)
    outs = [kern.run(m, n, k, lhs, rhs, None, None, -0.5, 0.5, execution=e) for e in ("reference", "jit")]
    assert bits_equal(outs[0], outs[1])
    wide = [kern.run(m, n, k, lhs, rhs, None, None, -FLT_MAX, FLT_MAX, execution=e) for e in ("reference", "jit")]
    assert bits_equal(wide[0], wide[1])


@pytest.mark.parametrize("name", NEON_KERNELS)
def test_compiled_plan_runs_the_jit_chain(name: str) -> None:
    """The plan runs a NEON kernel on the family's NEON chain (``ukernels.NEON_COMPUTE``, the jit's): the same bits
    as the prepared matmul, at 1 and 2 threads; the chain's portable link (a host without AVX-512 VNNI) has them
    too."""
    kern = get_kernel(name)
    m, n, k = 1 if kern.kind == "gemv" else 5, 70, 96
    lhs, rhs = operands(kern, m, n, k, 12)
    prepared = kern.prepare(n, k, rhs)
    want = kern.run(m, n, k, lhs, rhs, None, None, -FLT_MAX, FLT_MAX, execution="reference")
    nk = mm.node_kernel(prepared)
    assert nk.routine.endswith("_matmul_neon")
    for nth in (1, 2):
        out = np.empty((m, n), np.float32)
        for ith in range(nth):
            mm.matmul(nk.params, m, n, lhs, prepared.rhs, out, ith, nth)
        assert bits_equal(out, want), nth
    portable = q41_jit.matmul_neon(m, n, k, kern.mr, kern.nr, kern.kr // kern.sr, np.asarray(lhs), prepared.rhs)
    assert bits_equal(np.maximum(np.minimum(portable, FLT_MAX), -FLT_MAX), want)
