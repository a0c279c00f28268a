"""AVX-512 VNNI tiles of the Q8_0 family's NEON layouts (kleidipy.kernels.qai8dxp_qsi8cxp.vnni, nr = 4, kr = 4 or
8): bit for bit equal to the portable jit function they replace and to the numpy reference, for every NEON kernel,
on random shapes (m = 1 … 9 and beyond, n and k off every multiple the tiles use), extreme values (int32 wrap,
accumulators past 2^24, signed zeros), their lane maps and per-row LHS data, the layout probe, and the public
kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal, mixed_f32
from qai8dxp_models import call_matmul

from kleidipy.core import vnni_columns
from kleidipy.core.numerics import FLT_MAX
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qai8dxp_qsi8cxp import jit, vnni
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam

needs_vnni = pytest.mark.skipif(not vnni.HAVE_VNNI, reason="host lacks AVX-512 VNNI")
HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NEON = [k.name for k in fam.KERNELS if k.tier in ("i8mm", "dotprod")]


def pack(kern, x: np.ndarray, w: np.ndarray, scale: np.ndarray, bias: np.ndarray | None):  # noqa: ANN001, ANN201
    """Packed LHS and RHS (the family's jit packers) of float32 rows x [m, k] and int8 weights w [n, k]."""
    (m, k), n = x.shape, w.shape[0]
    lhs = np.asarray(fam.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="jit"))
    rhs = np.asarray(kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, w, scale=scale, bias=bias)).copy()
    return lhs, rhs


def operands(kern, m: int, n: int, k: int, seed: int):  # noqa: ANN001, ANN201
    """Random packed operands: rows of mixed magnitudes (a zero row sometimes), int8 weights with −128, scales
    and biases with ±0."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(m, k)) * rng.choice([1e-3, 1.0, 1e3], size=(m, 1))).astype(np.float32)
    if seed % 3 == 0:
        x[0] = 0.0
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    bias = mixed_f32(rng, n, 1e-3, 10.0, subnormals=False) if seed % 4 else None
    return pack(kern, x, w, mixed_f32(rng, n, 1e-4, 0.1, subnormals=False), bias)


def assert_exact(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """The VNNI tiles give the bits of the portable jit function and of the numpy reference; returns them."""
    got = call_matmul(fam.MATMUL_COMPUTE, kern, m, n, k, lhs, rhs)
    assert bits_equal(got, call_matmul(jit.matmul_qai8dxp, kern, m, n, k, lhs, rhs)), (kern.name, m, n, k)
    assert bits_equal(got, kern._reference(m, n, k, lhs, rhs)), (kern.name, m, n, k)
    return got


# --------------------------------------------------------------------------------------------- shapes


def test_the_neon_kernels_are_the_four_int8_layouts() -> None:
    geos = {(k.mr, k.nr, k.kr, k.sr) for k in (get_kernel(name, None) for name in NEON)}
    assert geos == {(1, 4, 4, 1), (4, 4, 4, 1), (1, 4, 8, 1), (4, 4, 8, 1)}


@needs_vnni
@HYP
@given(
    m=st.integers(1, 21),
    n=st.integers(1, 200),
    k=st.integers(1, 300),
    name=st.sampled_from(NEON),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shapes(m: int, n: int, k: int, name: str, seed: int) -> None:
    kern = get_kernel(name, None)
    m = 1 if kern.kind == "gemv" else m
    assert_exact(kern, m, n, k, *operands(kern, m, n, k, seed))


@needs_vnni
@pytest.mark.parametrize("name", NEON)
def test_small_m_and_ragged_n_k(name: str) -> None:
    """m = 1 … 9 (the GEMM tile's 4 rows, its tails and the one-row tile), n around 4, 16 and 64, k off 32."""
    kern = get_kernel(name, None)
    for m in range(1, 10) if kern.kind == "gemm" else (1,):
        for n, k in ((1, 1), (3, 31), (4, 32), (5, 33), (17, 70), (63, 100), (65, 7), (130, 64)):
            assert_exact(kern, m, n, k, *operands(kern, m, n, k, 100 * m + n))


@needs_vnni
@pytest.mark.parametrize("name", NEON)
def test_int32_wrap_and_large_accumulators(name: str) -> None:
    """Σ q·w past 2^31 (k = 140000, q = w = −128: the int32 sum wraps, as the kernels' MLA does), dots past 2^24
    (SCVTF rounds) and arbitrary stored row sums (the −zp·rowsum term wraps)."""
    kern = get_kernel(name, None)
    m = 1 if kern.kind == "gemv" else 3
    n, k = 6, 140_000
    x = np.full((m, k), -1.0, np.float32)  # quantizes to q = −128 everywhere (zp = 127)
    w = np.full((n, k), -128, np.int8)
    w[1::2, ::5] = 127
    lhs, rhs = pack(kern, x, w, np.full(n, 1e-9, np.float32), None)
    assert (fam.unpack_lhs(lhs, m, k, kern.mr, kern.kr // kern.sr)[0] == -128).all()
    assert int(w[0].astype(np.int64).sum()) * -128 > 2**31
    assert_exact(kern, m, n, k, lhs, rhs)
    rng = np.random.default_rng(5)
    n, k = 37, 4000
    x = np.full((m, k), 1.0, np.float32)
    x[:, ::7] = 0.5
    w = np.full((n, k), 127, np.int8)
    w[::3] = -128
    w[1::3, ::11] = -128
    lhs, rhs = pack(kern, x, w, np.full(n, 1e-6, np.float32), None)
    got = assert_exact(kern, m, n, k, lhs, rhs)
    assert np.abs(got).max() / 1e-6 * 255 > 2**24  # |acc| past 2^24 (S = 1e-6 / 255: the LHS spans [0, 1])
    k_int, stride = fam.k_internal(k), kern.rhs_packer.get_rhs_packed_stride(k, kern.nr, kern.kr, kern.sr)
    for g in range(-(-n // kern.nr)):  # random int32 row sums
        rhs[g * stride + kern.nr * k_int :][: 4 * kern.nr].view(np.int32)[:] = rng.integers(-(2**31), 2**31, 4)
    assert_exact(kern, m, n, k, lhs, rhs)


@needs_vnni
@pytest.mark.parametrize("name", NEON)
def test_signed_zeros(name: str) -> None:
    """All-zero rows give acc = 0: F·S is −0 for a negative scale and −0 + −0 bias stays −0, +0 + −0 is +0."""
    kern = get_kernel(name, None)
    m = 1 if kern.kind == "gemv" else 5
    n, k = 21, 96
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = np.where(np.arange(n) % 2, np.float32(-0.5), np.float32(0.25)).astype(np.float32)
    bias = np.where(np.arange(n) % 3, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    got = assert_exact(kern, m, n, k, *pack(kern, np.zeros((m, k), np.float32), w, scale, bias))
    negative = (np.arange(n) % 2 == 1) & (np.arange(n) % 3 != 0)
    assert (got == 0).all()
    assert (np.signbit(got) == negative[None, :]).all()


# --------------------------------------------------------------------------------------------- parts


def lane_column(lane: int, kr: int) -> int:
    """Column of 32-bit lane ``lane`` of a 64-byte load of a NEON RHS group's data (int8 (c, k) at
    (k//kr)·4·kr + c·kr + k%kr): byte 4·lane is column (4·lane // kr) % 4."""
    return (4 * lane // kr) % 4


@pytest.mark.parametrize("kr", [4, 8])
def test_lane_maps(kr: int) -> None:
    """Lane L of a group's block load holds column lane_column(L) and K group _lane_k_group(L) (each (column,
    K group) once), and the two fold rounds of sum_columns turn 4 such accumulators g into lane 4g + c = the
    sum of the 4 lanes of g that hold column c."""
    lanes = {(lane_column(lane, kr), vnni._lane_k_group(lane, kr)) for lane in range(16)}
    assert lanes == {(c, t) for c in range(4) for t in range(4)}
    for lane in range(16):  # byte 4·lane of the block: K index (4·lane // 4kr)·kr + (4·lane) % kr
        assert vnni._lane_k_group(lane, kr) == ((4 * lane) // (4 * kr) * kr + (4 * lane) % kr) // 4
    accs = [[{(g, lane_column(lane, kr), lane)} for lane in range(16)] for g in range(4)]
    first, second = vnni_columns.COLUMN_FOLDS[kr]
    order = (accs[0], accs[2], accs[1], accs[3]) if kr == 4 else tuple(accs)  # as sum_columns feeds them

    def fold(x: list, y: list, lanes: tuple) -> list:
        return [(x + y)[lanes[0][j]] | (x + y)[lanes[1][j]] for j in range(16)]

    out = fold(fold(order[0], order[1], first), fold(order[2], order[3], first), second)
    for lane, terms in enumerate(out):
        assert len(terms) == 4 and {(g, c) for g, c, _ in terms} == {(lane // 4, lane % 4)}


@needs_vnni
@pytest.mark.parametrize("name", NEON)
def test_lhs_rows(name: str) -> None:
    """What the tiles read per LHS row: the row table (rows past m repeat row m − 1), the vpermd index that puts
    a row's K groups in the RHS lane order, and −128·Σq (wrapping)."""
    kern = get_kernel(name, None)
    mr, kbl = kern.mr, kern.kr // kern.sr
    for m in (1, 5, 8) if kern.kind == "gemm" else (1,):
        k = 100
        lhs, _ = operands(kern, m, 4, k, m)
        k_int = fam.k_internal(k)
        table, index, corr = vnni.neon_rows(m, k_int, mr, kbl, kern.kr, lhs.view(np.int8))
        q, _, _ = fam.unpack_lhs(lhs, m, k, mr, kbl)
        rows = -(-m // vnni.GEMM_ROWS) * vnni.GEMM_ROWS
        assert table.shape == (rows, 2) and corr.shape == (rows,)
        words = lhs.view(np.int32)
        groups = np.ascontiguousarray(q).view(np.int32)  # K group t of row i: its 4 int8 as one word
        for i in range(rows):
            row = min(i, m - 1)
            base, sel = table[i]
            assert base == row // mr * mr * (k_int + 8) and sel == row % mr * 64
            assert corr[i] == fam.wrap_i32(-128 * q[row].astype(np.int64).sum())
            for blk in range(k_int // 16):
                window = words[(base + blk * mr * 16) // 4 :][: 4 * mr]
                want = [groups[row, 4 * blk + vnni._lane_k_group(lane, kern.kr)] for lane in range(16)]
                assert np.array_equal(window[index[sel // 64]], want)


def test_layout_probe() -> None:
    """The tiles take the int8 layouts of the SME and NEON kernels, not the int4 per-channel ones."""
    for name, svl in [(name, None) for name in NEON] + [(k.name, 512) for k in fam.KERNELS if k.tier.startswith("sme")]:
        kern = get_kernel(name, svl)
        lay = kern.rhs_packer.layout(70, kern.nr, kern.kr, kern.sr)
        args = (fam.k_internal(70), kern.kr // kern.sr, kern.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi)
        assert vnni.is_vnni_layout(kern.mr, *args), name
    int4 = get_kernel("matmul_clamp_f32_qai8dxp1x8_qsi4cxp4x8_1x4x32_neon_dotprod", None)
    lay = int4.rhs_packer.layout(64, int4.nr, int4.kr, int4.sr)
    args = (64, int4.kr // int4.sr, int4.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi)
    assert not vnni.is_vnni_layout(int4.mr, *args)
    kern = get_kernel(NEON[0], None)
    lay = kern.rhs_packer.layout(64, kern.nr, kern.kr, kern.sr)
    assert not vnni.is_vnni_layout(kern.mr, 64, kern.kr, kern.nr, lay.blen, 0, np.roll(lay.k_lo, 1), lay.k_hi)
    assert not vnni.is_vnni_layout(8, 64, kern.kr, kern.nr, lay.blen, 0, lay.k_lo, lay.k_hi)  # blocks past 64 B


# --------------------------------------------------------------------------------------------- public kernels


@HYP
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 150),
    k=st.integers(1, 130),
    name=st.sampled_from(NEON),
    clamp=st.sampled_from([(-FLT_MAX, FLT_MAX), (-0.5, 0.75), (0.0, 0.0)]),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_public_kernels_jit_equals_reference(
    m: int, n: int, k: int, name: str, clamp: tuple, threads: int, seed: int
) -> None:
    kern = get_kernel(name, None)
    m = 1 if kern.kind == "gemv" else m
    lhs, rhs = operands(kern, m, n, k, seed)
    want = kern.run(m, n, k, lhs, rhs, None, None, *clamp, execution="reference")
    got = kern.run(m, n, k, lhs, rhs, None, None, *clamp, execution="jit", threads=threads, min_split_macs=0)
    assert bits_equal(got, want)
