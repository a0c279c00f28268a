"""AVX-512 VNNI execution of the Q4_0 SME1 kernels (kleidipy.kernels.qsi8d32p_qsi4c32p.vnni_s4s0).

Both ISAs (VNNI512 when the host has it, PORTABLE everywhere), the MOPA GEMM and the DOT GEMV bound to SVL 128,
256 and 512, bit for bit against ``jit.matmul_qsi8d32p_qsi4c32ps4s0sf16`` (what the runtime ran before) and the
family's numpy reference kernel: row tails, column tails, K tails of the 64-column panels, random shapes, signed
zeros (the MOPA first-block FMUL), junk in the padding columns, shapes the tiles hand back to the jit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal

from kleidipy.core import vnni
from kleidipy.core.numerics import f32_to_f16_bits
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni_s4s0 as vs

ISAS = [vnni.PORTABLE] + ([vnni.VNNI512] if vnni.HAS_AVX512_VNNI else [])
SVLS = (128, 256, 512)
MOPA = "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme_mopa"
DOT = "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme_dot"


def q4_0_blocks(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """GGML Q4_0 blocks [n, k/32, 18]: random codes, fp16 d of both signs, some tiny (fp16(d/16) subnormal), some ±0."""
    blocks = rng.integers(0, 256, (n, k // 32, 18), dtype=np.uint8)
    d = (rng.standard_normal((n, k // 32)) * rng.choice([1e-6, 0.05, 30.0], (n, k // 32))).astype(np.float32)
    bits = f32_to_f16_bits(d)
    bits[rng.random(bits.shape) < 0.05] = 0x8000
    bits[rng.random(bits.shape) < 0.05] = 0x0000
    blocks[:, :, 0], blocks[:, :, 1] = bits & 0xFF, bits >> 8
    return blocks


def operands(kern, rng: np.random.Generator, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """The kernel's packed LHS (rows of mixed magnitude, an all-zero block) and RHS, as plain uint8 arrays."""
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 100.0], (m, 1))).astype(np.float32)
    if k >= 64:
        x[0, 32:64] = 0.0
    lhs = kern.pack_lhs(x, execution="reference")
    rhs = kern.pack_rhs(n, k, q4_0_blocks(rng, n, k), execution="reference")
    return np.asarray(lhs), np.asarray(rhs)


def check(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, reference: bool = True) -> None:  # noqa: ANN001
    """Both ISAs' tiles and compute_s4s0 == the portable jit (== the family's reference kernel)."""
    fmul = kern.flags.get("first_block_fmul", False)
    want = jit.matmul_qsi8d32p_qsi4c32ps4s0sf16(m, n, k, kern.mr, kern.nr, lhs, rhs, fmul)
    if reference:
        assert bits_equal(want, kern.run(m, n, k, lhs, rhs, execution="reference")), (kern.name, m, n, k)
    for isa in ISAS:
        got = vs._compute(isa, m, n, k, kern.mr, kern.nr, lhs, rhs, fmul)
        assert bits_equal(got, want), (kern.name, kern.nr, m, n, k, isa)
    assert bits_equal(vs.compute_s4s0(m, n, k, kern.mr, kern.nr, lhs, rhs, fmul), want)


@pytest.mark.parametrize("svl", SVLS)
def test_gemm_every_svl(svl: int) -> None:
    """The MOPA GEMM: row tails of the 4-row tiles and of the mr-row groups, column tails, K up to 6 blocks."""
    kern = get_kernel(MOPA, svl)
    rng = np.random.default_rng(svl)
    vl = svl // 32
    for m, n, k in ((1, 70, 64), (2, 16, 32), (3, 33, 96), (4, 64, 64), (5, 130, 192), (vl + 3, 2 * kern.nr + 17, 160)):
        lhs, rhs = operands(kern, rng, m, n, k)
        check(kern, m, n, k, lhs, rhs)


@pytest.mark.parametrize("svl", SVLS)
def test_gemv_every_svl(svl: int) -> None:
    """The DOT GEMV (m = 1): column tails within and past a group, one to many blocks."""
    kern = get_kernel(DOT, svl)
    rng = np.random.default_rng(svl + 1)
    for n, k in ((1, 32), (kern.nr, 64), (kern.nr + 3, 96), (3 * kern.nr - 5, 256), (200, 32 * 13)):
        lhs, rhs = operands(kern, rng, 1, n, k)
        check(kern, 1, n, k, lhs, rhs)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gemm=st.booleans(),
    m=st.integers(1, 21),
    n=st.integers(1, 200),
    nb=st.integers(1, 6),
    svl=st.sampled_from(SVLS),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shapes(gemm: bool, m: int, n: int, nb: int, svl: int, seed: int) -> None:
    """Any m on either kernel (the DOT's mr = 1 packing takes any m too)."""
    kern = get_kernel(MOPA if gemm else DOT, svl)
    lhs, rhs = operands(kern, np.random.default_rng(seed), m, n, 32 * nb)
    check(kern, m, n, 32 * nb, lhs, rhs, reference=False)


def test_signed_zeros() -> None:
    """s_R = −0 and s_L = 1 give S = +0; a negative dot then gives a −0 term: kept by the MOPA recipe (from −0),
    not by the DOT one (from +0)."""
    n, k = 64, 64
    x = np.zeros((1, k), np.float32)
    x[0, 5] = x[0, 40] = -1.0
    blocks = np.full((n, 2, 18), 0x99, np.uint8)  # codes 9: w = +1
    blocks[:, :, 0], blocks[:, :, 1] = 0x00, 0x80  # d = −0
    for name, bits in ((MOPA, 0x80000000), (DOT, 0)):
        kern = get_kernel(name, 512)
        lhs = np.asarray(kern.pack_lhs(x, execution="reference"))
        rhs = np.asarray(kern.pack_rhs(n, k, blocks, execution="reference"))
        fmul = kern.flags.get("first_block_fmul", False)
        for isa in ISAS:
            assert (vs._compute(isa, 1, n, k, kern.mr, kern.nr, lhs, rhs, fmul).view(np.uint32) == bits).all()
        check(kern, 1, n, k, lhs, rhs)


def test_padding_columns_are_ignored() -> None:
    """Junk in the padding columns of the last RHS group (data and scales) does not reach the output."""
    rng = np.random.default_rng(5)
    n, k = 70, 96
    for name, m in ((MOPA, 6), (DOT, 1)):
        kern = get_kernel(name, 512)
        lhs, rhs = operands(kern, rng, m, n, k)
        nr, nb = kern.nr, k // 32
        dirty = rhs.copy().reshape(-1, nr * nb * 18)
        last = dirty[-1]
        data = last[: nr * nb * 16].reshape(nb * 4, nr, 4)
        data[:, n % nr :] = rng.integers(0, 256, data[:, n % nr :].shape, dtype=np.uint8)
        scales = last[nr * nb * 16 :].reshape(nb, nr, 2)
        scales[:, n % nr :] = rng.integers(0, 256, scales[:, n % nr :].shape, dtype=np.uint8)
        want = jit.matmul_qsi8d32p_qsi4c32ps4s0sf16(m, n, k, kern.mr, nr, lhs, rhs, name == MOPA)
        for isa in ISAS:
            assert bits_equal(vs._compute(isa, m, n, k, kern.mr, nr, lhs, dirty.reshape(-1), name == MOPA), want)


def test_shapes_the_tiles_do_not_take() -> None:
    """nr not a multiple of 16 goes to the portable jit (the same bits); short buffers are refused."""
    rng = np.random.default_rng(3)
    kern = get_kernel(MOPA, 512)
    m, n, k, mr, nr = 3, 10, 64, 4, 8
    lhs = rng.integers(0, 256, -(-m // mr) * mr * k // 32 * 34, dtype=np.uint8)
    rhs = rng.integers(0, 256, -(-n // nr) * nr * k // 32 * 18, dtype=np.uint8)
    rhs.reshape(-1, nr * k // 32 * 18)[:, nr * k // 2 :] = 0x3C  # finite fp16 scales
    want = jit.matmul_qsi8d32p_qsi4c32ps4s0sf16(m, n, k, mr, nr, lhs, rhs, True)
    assert bits_equal(vs.compute_s4s0(m, n, k, mr, nr, lhs, rhs, True), want)
    lhs, rhs = operands(kern, rng, 5, 70, 64)
    with pytest.raises(ValueError, match="too small"):
        vs.compute_s4s0(5, 70, 64, kern.mr, kern.nr, lhs, rhs[:-1], True)
    with pytest.raises(ValueError, match="too small"):
        vs.compute_s4s0(5, 70, 64, kern.mr, kern.nr, lhs[:-1], rhs, True)
