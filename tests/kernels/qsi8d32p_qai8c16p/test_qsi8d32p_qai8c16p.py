"""Exact-weight family (qsi8d32p × qai8c16p, kleidipy's own: no KleidiAI golden data exists): every GGML type's codes,
scales and offsets dequantize to gguf's values bit for bit (and so do the packed weights), the packer's executions
agree, jit == reference == an exact scalar model of the recipe on random shapes with tails in n and k, the emulator's
programs (isa) == reference, a GEMM row is its GEMV, threads keep the bits, bad inputs raise typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import assert_threads_keep_bits, bits_equal, exact_fma

from kleidipy import formats
from kleidipy.core.numerics import FLT_MAX
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError, UnsupportedTensorTypeError
from kleidipy.formats import codes16
from kleidipy.kernels.catalogue import family_of
from kleidipy.kernels.qsi8d32p_qai4c32p.ukernels import unpack_lhs
from kleidipy.kernels.qsi8d32p_qai8c16p import jit, vnni
from kleidipy.kernels.qsi8d32p_qai8c16p import ukernels as fam

GEMM, GEMV = fam.KERNELS
FAMILY = family_of(GEMM)
HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: byte offsets of each type's fp16 fields (d, and dmin / m) and of Q8_K's f32 d
_F16_FIELDS = {T.Q6_K: (208,), T.Q5_1: (0, 2), T.Q4_1: (0, 2), T.Q4_K: (0, 2), T.Q5_K: (0, 2)}


def random_blocks(t: T, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes of n rows of k values of type t, with finite scale fields (every code pattern occurs)."""
    block_size, type_size = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, (n, k // block_size, type_size), dtype=np.uint8)
    if t == T.Q8_K:
        d = (rng.standard_normal((n, k // block_size)) * 1e-3).astype("<f4")
        raw[..., :4] = d.view(np.uint8).reshape(n, -1, 4)
        return raw
    for off in _F16_FIELDS.get(t, (0,)):
        bits = (rng.standard_normal((n, k // block_size)) * 2.0 ** rng.integers(-20, 3)).astype("<f2").view("<u2")
        raw[..., off], raw[..., off + 1] = bits & 0xFF, bits >> 8
    return raw


# --------------------------------------------------------------------------------------------- exact weights


@pytest.mark.parametrize("t", codes16.TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_codes_dequantize_to_gguf_bit_for_bit(t, seed):
    rng = np.random.default_rng(seed)
    n, k = 7, 512
    raw = random_blocks(t, n, k, rng)
    codes, scale, offset = codes16.codes16(raw, t, n, k)
    assert codes.dtype == np.int8 and scale.shape == offset.shape == (n, k // 16)
    want = formats.dequantize(raw, t, n, k)
    assert bits_equal(codes16.dequantize(codes, scale, offset), want)
    if t != T.Q8_K:  # (gguf has no Q8_K; formats reads it itself)
        assert bits_equal(quants.dequantize(raw.reshape(n, -1), t).astype(np.float32).reshape(n, k), want)


@pytest.mark.parametrize("t", [T.Q5_0, T.Q5_1, T.Q8_0], ids=lambda t: t.name)
def test_gguf_quantized_weights_pack_exactly(t):
    """Weights quantized by gguf, packed: GET_ROWS of the packed buffer (both executions) is gguf's dequantization."""
    rng = np.random.default_rng(5)
    n, k = 13, 96
    raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), t)
    rhs, kw = FAMILY.from_ggml(t, raw, n, k, GEMM.rhs_packer, "jit")
    packed = GEMM.pack_rhs(n, k, rhs, **kw)
    want = quants.dequantize(raw, t).astype(np.float32)
    for execution in ("reference", "jit"):
        assert bits_equal(fam.get_rows(GEMM, packed, np.arange(n), n, k, execution=execution), want)


@pytest.mark.parametrize("t", codes16.TYPES, ids=lambda t: t.name)
def test_packed_weights_are_the_files(t):
    rng = np.random.default_rng(int(t))
    n, k = 9, 256
    raw = random_blocks(t, n, k, rng)
    rhs, kw = FAMILY.from_ggml(t, raw, n, k, GEMV.rhs_packer, "jit")
    packed = GEMV.pack_rhs(n, k, rhs, **kw)
    rows = np.array([8, 0, 3])
    got = fam.get_rows(GEMV, packed, rows, n, k, execution="jit")
    assert bits_equal(got, formats.dequantize(raw, t, n, k)[rows])


# --------------------------------------------------------------------------------------------- packer, kernels


def _weights(rng, n, k, with_bias, symmetric=False):
    codes = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = (rng.standard_normal((n, k // 16)) * 0.01).astype(np.float32)
    zeros = 1.0 if symmetric else 0.3  # the symmetric types store -0 offsets (the VNNI tile skips those blocks)
    offset = np.where(rng.random((n, k // 16)) < zeros, np.float32(-0.0), rng.standard_normal((n, k // 16)) * 0.1)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    return codes, scale, offset.astype(np.float32), bias


@HYP
@given(n=st.integers(1, 70), nb=st.integers(1, 6), with_bias=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_packer_executions_agree_and_unpack(n, nb, with_bias, seed):
    k = 32 * nb
    codes, scale, offset, bias = _weights(np.random.default_rng(seed), n, k, with_bias)
    ref = GEMM.pack_rhs(n, k, codes, scale=scale, zero=offset, bias=bias, execution="reference")
    jit = GEMM.pack_rhs(n, k, codes, scale=scale, zero=offset, bias=bias, execution="jit")
    assert np.array_equal(ref, jit) and ref.size == GEMM.rhs_packed_size(n, k)
    got = fam.RHS_PACKER.unpack(np.asarray(ref), n, k, GEMM.nr, GEMM.kr, GEMM.sr)
    want_bias = bias if with_bias else np.zeros(n, np.float32)
    for a, b in zip(got, (codes, offset, scale, want_bias), strict=True):
        assert np.array_equal(np.ascontiguousarray(a).view(np.uint8), b.view(np.uint8))


def _run(kern, m, n, k, rng, with_bias, clamp=(-FLT_MAX, FLT_MAX), symmetric=False):
    codes, scale, offset, bias = _weights(rng, n, k, with_bias, symmetric)
    x = rng.standard_normal((m, k)).astype(np.float32)
    lhs = kern.pack_lhs(x)
    rhs = kern.pack_rhs(n, k, codes, scale=scale, zero=offset, bias=bias)
    outs = [kern.run(m, n, k, lhs, rhs, None, None, *clamp, execution=e) for e in ("reference", "jit")]
    return outs, (lhs, rhs, x, codes, scale, offset, bias)


@HYP
@given(
    gemm=st.booleans(),
    m=st.integers(1, 19),
    n=st.integers(1, 90),
    nb=st.integers(1, 7),
    with_bias=st.booleans(),
    clamp=st.sampled_from([(-FLT_MAX, FLT_MAX), (-0.5, 0.5), (-2.0, 0.25)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_kernels_jit_equals_reference(gemm, m, n, nb, with_bias, clamp, seed):
    kern = GEMM if gemm else GEMV
    m = m if gemm else 1
    (ref, jit), _ = _run(kern, m, n, 32 * nb, np.random.default_rng(seed), with_bias, clamp)
    assert bits_equal(ref, jit)
    assert (ref >= np.float32(clamp[0])).all() and (ref <= np.float32(clamp[1])).all()


@pytest.mark.parametrize(
    ("m", "n", "nb", "symmetric", "seed"),
    [(1, 1, 1, False, 0), (3, 17, 2, False, 1), (5, 33, 3, True, 2), (9, 40, 1, False, 3), (4, 70, 2, False, 4)],
)
def test_isa_programs_equal_reference(m, n, nb, symmetric, seed):
    """The emulator's programs (``execution="isa"``) give the reference's bits, with ±0 and other offsets (or only
    ±0), tails in m and n, clamped, for both kernels."""
    rng = np.random.default_rng(seed)
    for kern, rows in ((GEMM, m), (GEMV, 1)):
        (ref, _), (lhs, rhs, *_) = _run(kern, rows, n, 32 * nb, rng, seed % 2 == 0, (-0.5, 0.5), symmetric)
        assert bits_equal(kern.run(rows, n, 32 * nb, lhs, rhs, None, None, -0.5, 0.5, execution="isa"), ref)


def test_isa_counts_by_hand_and_threads_keep_bits():
    """One 4 × 16 tile, k = 32 (two 16-blocks): per block 4 SDOT for Σq, 4 column vectors × 4 quads × 4 rows SDOT by
    element, per row and vector 2 FMUL and 2 FMLA; the GEMV's quads are one LDR q per block. 2 threads: the same
    bits."""
    (ref, _), (lhs, rhs, *_) = _run(GEMM, 4, 16, 32, np.random.default_rng(9), True)
    dst, mach = GEMM.isa(GEMM, 4, 16, 32, lhs, rhs)
    assert bits_equal(dst, ref)
    c = mach.counts
    assert c["SDOT"] == 2 * (4 + 4 * 4 * 4) and c["FMUL"] == c["FMLA"] == 2 * 2 * 4 * 4
    assert c["SCVTF"] == 2 * (1 + 4 * 4) and c["FADD"] == 4 * 4 and c["STR"] == 4 * 4
    assert c["LDR"] == 2 * (4 + 4 * 6) + 1 + 4  # quads, codes/offsets/scales, the recips, the bias
    (_, _), (lhs1, rhs1, *_) = _run(GEMV, 1, 16, 32, np.random.default_rng(9), True)
    _, gemv = GEMV.isa(GEMV, 1, 16, 32, lhs1, rhs1)
    assert gemv.counts["SDOT"] == 2 * (4 + 4 * 4) and gemv.counts["LDR"] == 2 * (1 + 4 * 6) + 1 + 4
    assert_threads_keep_bits(GEMM, 6, 37, 64, *_run(GEMM, 6, 37, 64, np.random.default_rng(4), True)[1][:2], ("isa",))


def _scalar_model(lhs, m, k, codes, scale, offset, bias):
    """The recipe on exact rationals, one (row, column) at a time."""
    q, _, recip = unpack_lhs(np.asarray(lhs), m, k, GEMM.mr, GEMM.kr // GEMM.sr)
    q = q.reshape(m, -1)
    out = np.empty((m, codes.shape[0]), np.float32)
    for i in range(m):
        for j in range(codes.shape[0]):
            acc = np.float32(0.0)
            for b in range(k // 16):
                t = slice(16 * b, 16 * b + 16)
                a = np.float32(int(np.dot(q[i, t].astype(np.int64), codes[j, t].astype(np.int64))))
                s = np.float32(int(q[i, t].sum()))
                rc = recip[i, b // 2]
                acc = exact_fma(np.float32(scale[j, b] * rc), a, acc)
                acc = exact_fma(np.float32(offset[j, b] * rc), s, acc)
            out[i, j] = acc + (bias[j] if bias is not None else np.float32(0))
    return out


@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 5), n=st.integers(1, 9), nb=st.integers(1, 3), with_bias=st.booleans(), seed=st.integers(0))
def test_reference_equals_exact_scalar_model(m, n, nb, with_bias, seed):
    k = 32 * nb
    (ref, _), (lhs, _, _, codes, scale, offset, bias) = _run(GEMM, m, n, k, np.random.default_rng(seed), with_bias)
    assert bits_equal(ref, _scalar_model(lhs, m, k, codes, scale, offset, bias))


def test_gemm_rows_are_gemv_rows_and_threads_keep_bits():
    rng = np.random.default_rng(3)
    m, n, k = 6, 37, 160
    (ref, _), (lhs, rhs, x, *_) = _run(GEMM, m, n, k, rng, True)
    for i in range(m):
        row = GEMV.run(1, n, k, GEMV.pack_lhs(x[i : i + 1]), rhs, execution="jit")
        assert bits_equal(row, ref[i : i + 1])
    assert_threads_keep_bits(GEMM, m, n, k, lhs, rhs, ("reference", "jit"))


def test_geometry_and_selection():
    assert (GEMM.mr, GEMM.nr, GEMM.kr, GEMM.sr, GEMM.m_step, GEMM.n_step) == (4, 16, 4, 1, 4, 16)
    assert (GEMV.mr, GEMV.nr, GEMV.kr, GEMV.sr, GEMV.m_step, GEMV.n_step) == (1, 16, 4, 1, 1, 16)
    assert FAMILY.exact_rows and GEMM.lhs_packer is GEMV.lhs_packer and GEMM.rhs_packer is GEMV.rhs_packer


def test_bad_inputs():
    n, k = 4, 64
    codes, scale, offset, _ = _weights(np.random.default_rng(0), n, k, False)
    with pytest.raises(DTypeError):
        GEMM.pack_rhs(n, k, codes.view(np.uint8), scale=scale, zero=offset)
    with pytest.raises(BufferSizeError):
        GEMM.pack_rhs(n, k, codes, scale=scale[:, :1], zero=offset)
    with pytest.raises(KernelShapeError):
        fam.RHS_PACKER.run(n, k, 4, 8, 2, codes, bl=32, scale=scale, zero=offset)
    with pytest.raises(KernelShapeError):
        GEMM.pack_rhs(n, 48, codes, scale=scale, zero=offset)
    with pytest.raises(UnsupportedTensorTypeError):
        codes16.codes16(np.zeros(18 * 2, np.uint8), T.Q4_0, 1, 64)


@pytest.mark.skipif(not vnni.HAVE_VNNI, reason="the host has no AVX-512 VNNI")
@settings(max_examples=15, deadline=None)
@given(
    m=st.integers(1, 9),
    n=st.integers(1, 70),
    nb=st.integers(1, 5),
    symmetric=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_vnni_tile_equals_portable_loops(m, n, nb, symmetric, seed):
    k = 32 * nb
    (ref, _), (lhs, rhs, *_) = _run(GEMM, m, n, k, np.random.default_rng(seed), True, symmetric=symmetric)
    args = (m, n, k, GEMM.mr, GEMM.nr, GEMM.kr // GEMM.sr, np.asarray(lhs), np.asarray(rhs))
    assert bits_equal(vnni.compute(*args), jit.matmul(*args)) and bits_equal(vnni.compute(*args), ref)
