"""AVX-512 VNNI tiles of the per-channel int4 family (kleidipy.kernels.qai8dxp_qsi4cxp.vnni): for every kernel of the
family (NEON layouts; SME2 ones at each SVL), bit for bit equal to the numpy reference (``execution="reference"``)
and to the portable jit function they replace, under both recipes, on random shapes (m = 1 … 21, n and k off every
multiple the tiles use), extreme values (int32 wrap, accumulators past 2^24, signed zeros); the layout probe
accepts exactly this family's layouts and every other call goes to the rest of the family's tile chain."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal, mixed_f32
from qai8dxp_models import call_matmul

from kleidipy.kernels.catalogue import get_kernel
from kleidipy.kernels.qai8dxp_qsi4cxp import ukernels as fam
from kleidipy.kernels.qai8dxp_qsi4cxp import vnni
from kleidipy.kernels.qai8dxp_qsi8cxp import jit
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as core

needs_vnni = pytest.mark.skipif(not vnni.HAVE_VNNI, reason="host lacks AVX-512 VNNI")
HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SVLS = (128, 256, 512, 1024)
#: (kernel name, SVL) of every kernel of the family: NEON ones once, SME2 ones at each SVL
CASES = [(k.name, None) for k in fam.KERNELS if not k.tier.startswith("sme")] + [
    (k.name, svl) for k in fam.KERNELS if k.tier.startswith("sme") for svl in SVLS
]
RECIPES = list(core.Recipe)


def kernel(name: str, svl: int | None, recipe: core.Recipe | None = None):  # noqa: ANN201
    """The kernel at ``svl``, with its own recipe or ``recipe``."""
    kern = get_kernel(name, svl)
    return kern if recipe is None else replace(kern, flags={**kern.flags, "recipe": recipe})


def pack(kern, x: np.ndarray, codes: np.ndarray, scale: np.ndarray, bias: np.ndarray | None):  # noqa: ANN001, ANN201
    """Packed LHS and RHS (the family's jit packers) of float32 rows x [m, k] and 4-bit codes [n, ceil(k/2)]."""
    m, k = x.shape
    n = codes.shape[0]
    lhs = np.asarray(core.LHS_PACKER.run(m, k, kern.mr, kern.kr, kern.sr, x, execution="jit"))
    rhs = np.asarray(kern.rhs_packer.run(n, k, kern.nr, kern.kr, kern.sr, codes, scale=scale, bias=bias)).copy()
    return lhs, rhs


def operands(kern, m: int, n: int, k: int, seed: int):  # noqa: ANN001, ANN201
    """Random packed operands: rows of mixed magnitudes (a zero row sometimes), every 4-bit code, scales and
    biases with ±0."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(m, k)) * rng.choice([1e-3, 1.0, 1e3], size=(m, 1))).astype(np.float32)
    if seed % 3 == 0:
        x[0] = 0.0
    codes = rng.integers(0, 256, (n, -(-k // 2)), dtype=np.uint8)
    bias = mixed_f32(rng, n, 1e-3, 10.0, subnormals=False) if seed % 4 else None
    return pack(kern, x, codes, mixed_f32(rng, n, 1e-4, 0.1, subnormals=False), bias)


def assert_exact(kern, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """The VNNI tiles (the probe takes the layout: not the portable loop) through the family's tile chain give the
    bits of the numpy reference and of the portable jit function; returns them."""
    assert probe(kern, k), (kern.name, kern.svl_bits, k)
    got = call_matmul(fam.MATMUL_COMPUTE, kern, m, n, k, lhs, rhs)
    assert bits_equal(got, kern.run(m, n, k, lhs, rhs, execution="reference")), (kern.name, kern.svl_bits, m, n, k)
    assert bits_equal(got, call_matmul(jit.matmul_qai8dxp, kern, m, n, k, lhs, rhs)), (kern.name, m, n, k)
    return got


def probe(kern, k: int, mr: int | None = None, **change) -> bool:  # noqa: ANN001
    """_is_vnni_layout on a kernel's RHS layout at k (fields of the layout, or mr, replaced)."""
    lay = kern.rhs_packer.layout(k, kern.nr, kern.kr, kern.sr)
    fields = {"blen": lay.blen, "nibble_factor": lay.nibble_factor, "k_lo": lay.k_lo, "k_hi": lay.k_hi, **change}
    args = (core.k_internal(k), kern.kr // kern.sr, kern.nr, *fields.values())
    return vnni._is_vnni_layout(kern.mr if mr is None else mr, *args)


# --------------------------------------------------------------------------------------------- shapes


def test_the_family_is_two_layouts() -> None:
    """NEON: nr = 4, kr = 16, sr = 2 (mr 1 or 4); SME2: nr = 4·VL, kr = 4, sr = 1 (mr VL or 1)."""
    geos = {(name, svl): get_kernel(name, svl) for name, svl in CASES}
    assert {(k.mr, k.nr, k.kr, k.sr) for (_, svl), k in geos.items() if svl is None} == {(1, 4, 16, 2), (4, 4, 16, 2)}
    for (_, svl), k in geos.items():
        if svl is not None:
            assert (k.nr, k.kr, k.sr) == (4 * svl // 32, 4, 1) and k.mr in (1, svl // 32)


@needs_vnni
@HYP
@given(
    m=st.integers(1, 21),
    n=st.integers(1, 200),
    k=st.integers(1, 300),
    case=st.sampled_from(CASES),
    recipe=st.sampled_from(RECIPES),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shapes(m: int, n: int, k: int, case: tuple, recipe: core.Recipe, seed: int) -> None:
    kern = kernel(*case, recipe)
    m = 1 if kern.kind == "gemv" else m
    assert_exact(kern, m, n, k, *operands(kern, m, n, k, seed))


@needs_vnni
@pytest.mark.parametrize("case", CASES)
def test_small_m_and_ragged_n_k(case: tuple) -> None:
    """m = 1 … 9 (the GEMM tiles' 4 rows, their tails and the one-row tiles), n around 4, 16 and 64, k off 32,
    under both recipes."""
    for recipe in RECIPES:
        kern = kernel(*case, recipe)
        for m in range(1, 10) if kern.kind == "gemm" else (1,):
            for n, k in ((1, 1), (3, 31), (4, 32), (5, 33), (17, 70), (63, 100), (65, 7), (130, 64)):
                assert_exact(kern, m, n, k, *operands(kern, m, n, k, 100 * m + n))


@needs_vnni
def test_large_shapes() -> None:
    """Several column panels and row tiles: n, k = 2048-ish with tails, m past the GEMM tiles."""
    for name, svl in CASES[:3] + [c for c in CASES if c[1] in (128, 512)]:
        kern = get_kernel(name, svl)
        m, n, k = (1 if kern.kind == "gemv" else 11), 1100, 2050
        assert_exact(kern, m, n, k, *operands(kern, m, n, k, 7))


@needs_vnni
@pytest.mark.parametrize("case", [c for c in CASES if c[1] in (None, 128, 512)])
def test_int32_wrap_and_large_accumulators(case: tuple) -> None:
    """Dots past 2^24 (SCVTF rounds), arbitrary stored row sums (the −zp·rowsum term wraps) and, for the NEON
    layouts (nibbles read as 16·w), Σ q·16w past 2^31 (k = 140000, q = −128, w = −8: the int32 sum wraps, as the
    kernels' MLA does)."""
    kern = get_kernel(*case)
    m = 1 if kern.kind == "gemv" else 3
    if kern.rhs_packer is fam.RHS_PACKER_NEON:
        n, k = 6, 140_000
        x = np.full((m, k), -1.0, np.float32)  # quantizes to q = −128 everywhere (zp = 127)
        codes = np.zeros((n, k // 2), np.uint8)  # w = −8
        codes[1::2, ::5] = 0xFF  # w = 7
        lhs, rhs = pack(kern, x, codes, np.full(n, 1e-9, np.float32), None)
        assert (core.unpack_lhs(lhs, m, k, kern.mr, kern.kr // kern.sr)[0] == -128).all()
        assert 16 * 8 * 128 * k > 2**31
        assert_exact(kern, m, n, k, lhs, rhs)
    rng = np.random.default_rng(5)
    n, k = 37, 40_000
    x = np.full((m, k), 1.0, np.float32)
    x[:, ::7] = 0.5
    codes = np.full((n, k // 2), 0xFF, np.uint8)  # w = 7
    codes[::3] = 0
    codes[1::3, ::11] = 0x80
    lhs, rhs = pack(kern, x, codes, np.full(n, 1e-6, np.float32), None)
    assert_exact(kern, m, n, k, lhs, rhs)
    q = core.unpack_lhs(lhs, m, k, kern.mr, kern.kr // kern.sr)[0].astype(np.int64)
    w = kern.rhs_packer.unpack(rhs, n, k, kern.nr, kern.kr, kern.sr)[0]
    assert np.abs(q @ w.T).max() > 2**24
    k_int, stride = core.k_internal(k), kern.rhs_packer.get_rhs_packed_stride(k, kern.nr, kern.kr, kern.sr)
    for g in range(-(-n // kern.nr)):  # random int32 row sums
        sums = rhs[g * stride + kern.nr * k_int // 2 :][: 4 * kern.nr].view(np.int32)
        sums[:] = rng.integers(-(2**31), 2**31, kern.nr)
    assert_exact(kern, m, n, k, lhs, rhs)


@needs_vnni
@pytest.mark.parametrize("case", [c for c in CASES if c[1] in (None, 256)])
def test_signed_zeros(case: tuple) -> None:
    """All-zero rows give acc = 0: F·S is −0 for a negative scale and −0 + −0 bias stays −0, +0 + −0 is +0
    (FMUL_FADD); fma(S, 0, bias) keeps a −0 bias only when S·0 is −0 too (FMA_BIAS)."""
    for recipe in RECIPES:
        kern = kernel(*case, recipe)
        m = 1 if kern.kind == "gemv" else 5
        n, k = 21, 96
        rng = np.random.default_rng(1)
        codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        scale = np.where(np.arange(n) % 2, np.float32(-0.5), np.float32(0.25)).astype(np.float32)
        bias = np.where(np.arange(n) % 3, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
        got = assert_exact(kern, m, n, k, *pack(kern, np.zeros((m, k), np.float32), codes, scale, bias))
        negative = (np.arange(n) % 2 == 1) & (np.arange(n) % 3 != 0)
        assert (got == 0).all()
        assert (np.signbit(got) == negative[None, :]).all()


# --------------------------------------------------------------------------------------------- layout probe


def test_layout_probe_accepts_exactly_this_family() -> None:
    """Every kernel of the family at every SVL and k; not the Q8_0 family's int8 layouts, nor a layout or LHS off
    the tiles' (bytes moved, nibbles swapped, another nibble weight, blen, nr, or an LHS block past 64 bytes)."""
    for name, svl in CASES:
        kern = get_kernel(name, svl)
        for k in (1, 32, 70, 2048, 2050):
            assert probe(kern, k), (name, svl, k)
        lay = kern.rhs_packer.layout(96, kern.nr, kern.kr, kern.sr)
        assert not probe(kern, 96, k_lo=np.roll(lay.k_lo, 1))
        assert not probe(kern, 96, k_lo=lay.k_hi, k_hi=lay.k_lo)
        last = lay.k_hi.copy()
        last[-1] += 1
        assert not probe(kern, 96, k_hi=last)
        assert not probe(kern, 96, k_lo=lay.k_lo[:-1], k_hi=lay.k_hi[:-1])
        assert not probe(kern, 96, nibble_factor={16: 1, 1: 16}[lay.nibble_factor])
        assert not probe(kern, 96, nibble_factor=0)
        assert not probe(kern, 96, blen=2 * lay.blen)
    neon = get_kernel(CASES[0][0], None)
    assert not probe(neon, 64, mr=8)  # a block of 16 K of an 8-row LHS group is 128 bytes
    for kern in core.KERNELS:
        for svl in SVLS if kern.tier.startswith("sme") else (None,):
            assert not probe(get_kernel(kern.name, svl), 70), (kern.name, svl)


def test_other_calls_go_to_fallback() -> None:
    """A layout the probe refuses (here the Q8_0 family's) is the next link's, with the same arguments (the tiles'
    link in a chain, ``jit.with_tiles((vnni.tiles,), …)``: here with a recording fallback)."""
    calls = []
    matmul_qai8dxp = jit.with_tiles((vnni.tiles,), lambda *args: calls.append(args))
    q8 = get_kernel(core.KERNELS[-1].name, None)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 40)).astype(np.float32)
    w = rng.integers(-128, 128, (5, 40), dtype=np.int8)
    lhs = np.asarray(core.LHS_PACKER.run(1, 40, q8.mr, q8.kr, q8.sr, x, execution="jit"))
    rhs = np.asarray(q8.rhs_packer.run(5, 40, q8.nr, q8.kr, q8.sr, w, scale=np.ones(5, np.float32)))
    call_matmul(matmul_qai8dxp, q8, 1, 5, 40, lhs, rhs)
    assert len(calls) == 1 and len(calls[0]) == 16 and calls[0][:3] == (1, 5, 64)
    if vnni.HAVE_VNNI:
        kern = get_kernel(CASES[0][0], None)
        call_matmul(matmul_qai8dxp, kern, 1, 5, 40, *operands(kern, 1, 5, 40, 1))
        assert len(calls) == 1
