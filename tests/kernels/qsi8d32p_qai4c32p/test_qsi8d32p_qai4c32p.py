"""Q4_1 family (qsi8d32p × qai4c32p): golden runs, jit == reference, reference == independent scalar models of
the README layouts and of the kernel recipe (exact rational fma), the Q4_1 mapping, GET_ROWS and bad inputs."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import assert_sme_geometry, bits_equal, exact_fma, verify_family

from kleidipy.core import vnni
from kleidipy.core.numerics import F16_BITS_TO_F32, FLT_MAX
from kleidipy.errors import (
    BufferSizeError,
    DTypeError,
    KernelShapeError,
    NonFiniteInputError,
    PackedLayoutMismatchError,
)
from kleidipy.kernels.catalogue import get_kernel, get_packer
from kleidipy.kernels.qsi8d32p_qai4c32p import ukernels as fam
from kleidipy.kernels.qsi8d32p_qai4c32p import vnni_pack as q41_pack
from kleidipy.tools.golden import GoldenSet

KERNEL_NAMES = [k.name for k in fam.KERNELS]
SME_MOPA = "matmul_clamp_f32_qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa"
SME_DOT = "matmul_clamp_f32_qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot"
NEON_I8MM = "matmul_clamp_f32_qsi8d32p4x8_qai4c32p4x8_8x4_neon_i8mm"
NEON_DOT_GEMM = "matmul_clamp_f32_qsi8d32p4x4_qai4c32p4x4_8x4_neon_dotprod"
NEON_GEMV = "matmul_clamp_f32_qsi8d32p1x8_qai4c32p4x8_1x4_neon_dotprod"
SVLS = (128, 256, 512, 1024)
HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------------------------- golden


@pytest.mark.parametrize("execution", ["reference", "jit"])
def test_golden_runs_bit_exact(golden_dir, execution):
    count, failures = verify_family(golden_dir, fam.FAMILY_NAME, execution)
    assert count == 112
    assert not failures, "\n".join(failures[:10])


def test_q4_1_mapping_matches_golden_inputs(golden_dir):
    golden = GoldenSet(golden_dir)
    for case in golden.manifest["cases"]:
        n, k, inputs = case["n"], case["k"], case["inputs"]
        blocks = golden.array(inputs["rhs_q4_1"])
        for order in ("s0s1", "s1s0"):
            codes, scale, zero = fam.q4_1_to_qai4c32(blocks, n, k, order)
            np.testing.assert_array_equal(codes, golden.array(inputs[f"rhs_q4_1_qau4c32_{order}"]))
            assert bits_equal(scale, golden.array(inputs["rhs_q4_1_scale_f32"]))
            assert bits_equal(zero, golden.array(inputs["rhs_q4_1_zero_f32"]))


def _ggml_q4_1_dequant(blocks: np.ndarray, n: int, k: int) -> np.ndarray:
    """GGML dequantize_row_q4_1: u·d + m (the product of an fp16 d and a 4-bit code is exact in f32)."""
    blk = blocks.reshape(n, k // 32, 20)
    d = F16_BITS_TO_F32[blk[:, :, 0].astype(np.uint16) | blk[:, :, 1].astype(np.uint16) << 8]
    m = F16_BITS_TO_F32[blk[:, :, 2].astype(np.uint16) | blk[:, :, 3].astype(np.uint16) << 8]
    u = np.concatenate([blk[:, :, 4:] & 15, blk[:, :, 4:] >> 4], axis=-1).astype(np.float32)
    return (u * d[..., None] + m[..., None]).reshape(n, k)


@pytest.mark.parametrize(
    ("kernel_name", "svl"),
    [(NEON_I8MM, None), (NEON_DOT_GEMM, None), (SME_MOPA, 128), (SME_MOPA, 512), (SME_DOT, 1024)],
)
def test_get_rows_equals_ggml_dequant(golden_dir, kernel_name, svl):
    golden = GoldenSet(golden_dir)
    kern = get_kernel(kernel_name, svl)
    for case in golden.manifest["cases"]:
        n, k = case["n"], case["k"]
        blocks = golden.array(case["inputs"]["rhs_q4_1"])
        codes, scale, zero = fam.q4_1_to_qai4c32(blocks, n, k, "s0s1")
        packed = kern.pack_rhs(n, k, codes, scale=scale, zero=zero)
        want = _ggml_q4_1_dequant(blocks, n, k)
        rows = np.r_[np.arange(n), [n - 1, 0, n // 2]]
        for execution in ("reference", "jit"):
            got = fam.get_rows(kern, packed, rows, n, k, execution=execution)
            assert got.dtype == np.float32 and got.shape == (rows.size, k)
            assert bits_equal(got, want[rows])


# --------------------------------------------------------------------------------------------- models


def _lhs_model(x: np.ndarray) -> tuple[list, list, list]:
    """README "LHS qsi8d32pscalef32_f32_neon", scalar: s = f32(127/amax), recip = f32(1/s), q = clamp(rne(x·s))."""
    q, row_sums, recips = [], [], []
    for row in x:
        qr, sr, rr = [], [], []
        for b in range(0, row.size, 32):
            blk = row[b : b + 32]
            amax = max(abs(float(v)) for v in blk)
            s = np.float32(0) if amax == 0 else np.float32(127) / np.float32(amax)
            recip = np.float32(0) if s == 0 else np.float32(1) / s
            qb = [max(-128, min(127, round(float(np.float32(v) * s)))) for v in blk]
            qr.append(qb)
            sr.append(np.float32(np.float32(sum(qb)) * recip))
            rr.append(recip)
        q.append(qr)
        row_sums.append(sr)
        recips.append(rr)
    return q, row_sums, recips


def _lhs_packed_model(x: np.ndarray, mr: int, kbl: int, row_offset: int = 0) -> bytes:
    m, k = x.shape
    nb = k // 32
    groups = -(-(m + row_offset) // mr)
    out = bytearray(groups * nb * mr * 40)
    q, row_sums, recips = _lhs_model(x)
    for r in range(m):
        g, ri = divmod(r + row_offset, mr)
        for b in range(nb):
            base = (g * nb + b) * mr * 40
            for e in range(32):
                out[base + (e // kbl) * mr * kbl + ri * kbl + e % kbl] = q[r][b][e] & 0xFF
            out[base + 32 * mr + 4 * ri : base + 32 * mr + 4 * ri + 4] = struct.pack("<f", row_sums[r][b])
            out[base + 36 * mr + 4 * ri : base + 36 * mr + 4 * ri + 4] = struct.pack("<f", recips[r][b])
    return bytes(out)


def _rhs_packed_model(u, scale, zero, bias, nr: int, kr: int, sr: int, neon: bool) -> bytes:
    """README "RHS qai4c32p_qau4c32s0s1" (neon) / "qai4c32ps1s0nrx4" element by element; u is [n, k] codes."""
    n, k = u.shape
    nb = k // 32
    groups = -(-n // nr)
    stride = nr * (nb * 24 + 4)
    out = bytearray(groups * stride)
    for g in range(groups):
        for b in range(nb):
            base = g * stride + b * nr * 24
            for col in range(nr):
                row = min(g * nr + col, n - 1)
                if neon:
                    blen = kr // sr
                    for db in range(16 * nr):
                        blk, rem = divmod(db, blen)
                        sup, c = divmod(blk, nr)
                        if c == col:
                            t = sup * blen + rem
                            out[base + db] = (u[row, 32 * b + t] | u[row, 32 * b + t + 16] << 4) ^ 0x88
                else:
                    for quad in range(8):
                        e = 32 * b + 4 * quad
                        val = sum(int(u[row, e + j]) << (4 * j) for j in range(4))
                        out[base + 2 * (quad * nr + col) : base + 2 * (quad * nr + col) + 2] = struct.pack("<H", val)
                s = np.float32(scale[row, b] * np.float32(0.0625)) if neon else scale[row, b]
                out[base + 16 * nr + 4 * col : base + 16 * nr + 4 * col + 4] = struct.pack("<f", zero[row, b])
                out[base + 20 * nr + 4 * col : base + 20 * nr + 4 * col + 4] = struct.pack("<f", s)
        for col in range(nr):
            row = g * nr + col
            value = 0.0 if bias is None or (row >= n and not neon) else bias[min(row, n - 1)]
            off = g * stride + nb * nr * 24 + 4 * col
            out[off : off + 4] = struct.pack("<f", value)
    return bytes(out)


def _kernel_model(x, u, scale, zero, bias, first_block_fmul: bool) -> np.ndarray:
    """The module docstring's recipe, scalar, with exact rational fma; inputs are unpacked (true scale, u − 8)."""
    q, row_sums, recips = _lhs_model(x)
    m, n, nb = x.shape[0], u.shape[0], u.shape[1] // 32
    out = np.empty((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            acc = np.float32(0)
            for b in range(nb):
                a = np.float32(sum(q[i][b][t] * (int(u[j, 32 * b + t]) - 8) for t in range(32)))
                s = scale[j, b] * recips[i][b]
                if first_block_fmul and b == 0:
                    acc = np.float32(zero[j, b] * row_sums[i][b])
                else:
                    acc = exact_fma(zero[j, b], row_sums[i][b], acc)
                acc = exact_fma(s, a, acc)
            out[i, j] = np.float32(acc + (bias[j] if bias is not None else np.float32(0)))
    return out


def _u_to_codes(u: np.ndarray, order: str) -> np.ndarray:
    first, second = u[:, 0::2], u[:, 1::2]
    return (first << 4 | second if order == "s0s1" else first | second << 4).astype(np.uint8)


def _weights(rng, n: int, k: int, with_bias: bool):
    u = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scale = (rng.random((n, k // 32), dtype=np.float32) * 0.05).astype(np.float32)
    zero = (rng.standard_normal((n, k // 32), dtype=np.float32) * 0.1).astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    return u, scale, zero, bias


# --------------------------------------------------------------------------------------------- packers


@HYP
@given(
    m=st.integers(1, 11),
    nb=st.integers(1, 3),
    mr_kbl=st.sampled_from([(1, 4), (4, 4), (4, 8), (1, 8), (16, 4), (8, 4)]),
    row_offset=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_lhs_packer_models(m, nb, mr_kbl, row_offset, seed):
    mr, kbl = mr_kbl
    row_offset %= mr
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, 32 * nb)) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = 0
    if m > 1:
        x[1, :32] = 0  # an all-zero block: scale and recip 0
    packer = get_packer("kai_run_lhs_quant_pack_qsi8d32pscalef32_f32_neon")
    ref = packer.run(m, x.shape[1], mr, 2 * kbl, 2, x, bl=32, m_idx_start=row_offset, execution="reference")
    jit = packer.run(m, x.shape[1], mr, 2 * kbl, 2, x, bl=32, m_idx_start=row_offset, execution="jit")
    assert bytes(ref) == bytes(jit) == _lhs_packed_model(x, mr, kbl, row_offset)


def test_lhs_packer_rounds_ties_to_even_and_handles_subnormal_blocks():
    x = np.zeros((2, 32), np.float32)
    x[0, :6] = [127.0, 2.5, -2.5, 3.5, 0.5, -0.5]  # amax 127 -> s = 1: ties
    x[1, :2] = [1e-45, -1e-45]  # subnormal amax: 127/amax = inf, x·inf = ±inf -> ±127/-128, 0·inf -> 0
    packer = fam.LHS_PACKER
    for execution in ("reference", "jit"):
        packed = np.asarray(packer.run(2, 32, 1, 8, 2, x, bl=32, execution=execution))
        q, row_sum, recip = fam.unpack_lhs(packed, 2, 32, 1, 4)
        assert q[0, 0, :6].tolist() == [127, 2, -2, 4, 0, 0]
        assert q[1, 0, :3].tolist() == [127, -128, 0] and recip[1, 0] == 0 and row_sum[1, 0] == 0


@pytest.mark.parametrize("isa", [vnni.PORTABLE, *([vnni.VNNI512] if vnni.HAS_AVX512_VNNI else [])], ids=str)
def test_vectorised_lhs_packer_is_the_scalar_one(isa):
    """``vnni_pack`` (the jit's and the compiled plan's packer): the reference packer's bytes for every chunk
    (kbl 4, 8, 16), mr and row offset, with exact ties, zero blocks, tiny blocks whose 127/amax overflows and
    subnormals, magnitudes from 1e-38 to 1e30."""
    rng = np.random.default_rng(41)
    for m, nb, mr, kbl, offset in (
        (1, 1, 1, 4, 0),
        (5, 3, 4, 8, 3),
        (19, 5, 16, 4, 7),
        (9, 2, 8, 16, 0),
        (33, 18, 32, 4, 1),
    ):
        scale = rng.choice([1e-38, 1e-30, 1e-3, 1.0, 1e3, 1e30], size=(m, 1))
        x = (rng.standard_normal((m, 32 * nb)) * scale).astype(np.float32)
        x[rng.random(x.shape) < 0.1] = 0
        x[0, :2] = [127.0, 2.5]  # (amax 127 in a block of the first row: an exact tie)
        if m > 2:
            x[1, :32] = 0
            x[2, :32] = np.float32(1e-45) * rng.integers(-3, 4, 32)
        want = fam.LHS_PACKER.run(m, 32 * nb, mr, 2 * kbl, 2, x, bl=32, m_idx_start=offset, execution="reference")
        assert np.array_equal(q41_pack.lhs_quant_pack(x, mr, kbl, offset, isa), want), (m, nb, mr, kbl, offset)


def test_lhs_packer_threads_split_like_one_thread():
    x = np.random.default_rng(3).standard_normal((23, 96)).astype(np.float32)
    one = fam.LHS_PACKER.run(23, 96, 4, 16, 2, x, bl=32, execution="jit")
    two = fam.LHS_PACKER.run(23, 96, 4, 16, 2, x, bl=32, execution="jit", threads=2)
    assert bytes(one) == bytes(two)


@HYP
@given(
    n=st.integers(1, 40),
    nb=st.integers(1, 3),
    packer_nr_kr=st.sampled_from(
        [
            ("rhs_pack_nxk_qai4c32p_qau4c32s0s1_f32_f32_f32_neon", 4, 16),
            ("rhs_pack_nxk_qai4c32p_qau4c32s0s1_f32_f32_f32_neon", 4, 8),
            ("rhs_pack_nxk_qai4c32p_qau4c32s0s1_f32_f32_f32_neon", 8, 4),
            ("rhs_pack_nxk_qai4c32ps1s0nrx4_qau4c32s1s0_f32_f32_f32_neon", 16, 8),
            ("rhs_pack_nxk_qai4c32ps1s0nrx4_qau4c32s0s1_f32_f32_f32_neon", 32, 8),
            ("rhs_pack_nxk_qai4c32ps1s0nrx4_qau4c32s0s1_f32_f32_f32_neon", 4, 8),
        ]
    ),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_rhs_packers_models(n, nb, packer_nr_kr, with_bias, seed):
    name, nr, kr = packer_nr_kr
    packer = get_packer(name)
    k = 32 * nb
    u, scale, zero, bias = _weights(np.random.default_rng(seed), n, k, with_bias)
    codes = _u_to_codes(u, packer.code_order)
    args = {"scale": scale, "zero": zero, "bias": bias}
    ref = packer.run(n, k, nr, kr, 2, codes, bl=32, execution="reference", **args)
    jit = packer.run(n, k, nr, kr, 2, codes, bl=32, execution="jit", **args)
    assert bytes(ref) == bytes(jit) == _rhs_packed_model(u, scale, zero, bias, nr, kr, 2, packer.neon)


def test_sme_packers_give_identical_bytes():
    u, scale, zero, bias = _weights(np.random.default_rng(5), 37, 96, True)
    packed = [
        p.run(37, 96, 32, 8, 2, _u_to_codes(u, p.code_order), bl=32, scale=scale, zero=zero, bias=bias)
        for p in (fam.RHS_PACKER_SME2_S1S0, fam.RHS_PACKER_SME2_S0S1)
    ]
    assert bytes(packed[0]) == bytes(packed[1])


# --------------------------------------------------------------------------------------------- kernels


def _run_pair(kern, m, n, k, rng, with_bias, clamp=(-FLT_MAX, FLT_MAX)):
    u, scale, zero, bias = _weights(rng, n, k, with_bias)
    x = rng.standard_normal((m, k)).astype(np.float32)
    lhs = kern.pack_lhs(x)
    rhs = kern.pack_rhs(n, k, _u_to_codes(u, kern.rhs_packer.code_order), scale=scale, zero=zero, bias=bias)
    outs = [kern.run(m, n, k, lhs, rhs, None, None, *clamp, execution=e) for e in ("reference", "jit")]
    return outs, (x, u, scale, zero, bias)


@HYP
@given(
    name=st.sampled_from(KERNEL_NAMES),
    svl=st.sampled_from(SVLS),
    m=st.integers(1, 40),
    n=st.integers(1, 150),
    nb=st.integers(1, 5),
    with_bias=st.booleans(),
    clamp=st.sampled_from([(-FLT_MAX, FLT_MAX), (-0.5, 0.5), (0.0, 0.0), (-2.0, 0.25)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_kernels_jit_equals_reference(name, svl, m, n, nb, with_bias, clamp, seed):
    kern = get_kernel(name, svl)
    m = 1 if kern.kind == "gemv" else m
    (ref, jit), _ = _run_pair(kern, m, n, 32 * nb, np.random.default_rng(seed), with_bias, clamp)
    assert bits_equal(ref, jit)
    assert (ref >= np.float32(clamp[0])).all() and (ref <= np.float32(clamp[1])).all()


@settings(max_examples=12, deadline=None)
@given(
    name=st.sampled_from(KERNEL_NAMES),
    svl=st.sampled_from(SVLS),
    m=st.integers(1, 5),
    n=st.integers(1, 9),
    nb=st.integers(1, 3),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_reference_equals_exact_scalar_model(name, svl, m, n, nb, with_bias, seed):
    kern = get_kernel(name, svl)
    m = 1 if kern.kind == "gemv" else m
    (ref, _), (x, u, scale, zero, bias) = _run_pair(kern, m, n, 32 * nb, np.random.default_rng(seed), with_bias)
    want = _kernel_model(x, u, scale, zero, bias, kern.flags.get("first_block_fmul", False))
    assert bits_equal(ref, want)


def test_mopa_first_block_fmul_keeps_negative_zero():
    """All-zero LHS, negative scale and zero, bias −0.0: the MOPA kernel's FMUL start keeps −0, fma from +0 not."""
    n, k = 4, 32
    x = np.zeros((1, k), np.float32)
    u = np.full((n, k), 8, np.uint8)
    scale, zero = np.full((n, 1), -1.0, np.float32), np.full((n, 1), -2.0, np.float32)
    bias = np.full(n, -0.0, np.float32)
    signs = {}
    for name in (SME_MOPA, SME_DOT):
        kern = get_kernel(name, 128)
        rhs = kern.pack_rhs(n, k, _u_to_codes(u, "s0s1"), scale=scale, zero=zero, bias=bias)
        outs = [kern.run(1, n, k, kern.pack_lhs(x), rhs, execution=e) for e in ("reference", "jit")]
        assert bits_equal(outs[0], outs[1])
        assert (outs[0] == 0).all()
        signs[name] = bool(np.signbit(outs[0]).all())
        want = _kernel_model(x, u, scale, zero, bias, kern.flags.get("first_block_fmul", False))
        assert bits_equal(outs[0], want)
    assert signs == {SME_MOPA: True, SME_DOT: False}


def test_kernel_threads_and_dst_stride():
    kern = get_kernel(SME_MOPA, 256)
    rng = np.random.default_rng(11)
    (ref, _), (x, u, scale, zero, _) = _run_pair(kern, 9, 70, 64, rng, False)
    lhs = kern.pack_lhs(x)
    rhs = kern.pack_rhs(70, 64, _u_to_codes(u, "s0s1"), scale=scale, zero=zero)
    threaded = kern.run(9, 70, 64, lhs, rhs, threads=2, min_split_macs=0)
    dst = np.full((9, 80), 7.0, np.float32)
    kern.run(9, 70, 64, lhs, rhs, dst, 80 * 4)
    assert bits_equal(threaded, ref)
    assert bits_equal(dst[:, :70], ref)
    assert (dst[:, 70:] == 7.0).all()


def test_sme_kernels_accept_either_packer_and_catalogue_geometry():
    assert_sme_geometry(SME_MOPA, SME_DOT, SVLS, 8, 2)
    kern = get_kernel(SME_DOT, 512)
    u, scale, zero, _ = _weights(np.random.default_rng(2), 64, 64, False)
    x = np.ones((1, 64), np.float32)
    outs, rows = [], []
    for packer in (fam.RHS_PACKER_SME2_S1S0, fam.RHS_PACKER_SME2_S0S1):
        rhs = packer.run(64, 64, kern.nr, 8, 2, _u_to_codes(u, packer.code_order), bl=32, scale=scale, zero=zero)
        outs.append(kern.run(1, 64, 64, kern.pack_lhs(x), rhs))
        rows.append(fam.get_rows(kern, rhs, [0, 63], 64, 64))
    assert bits_equal(outs[0], outs[1])
    assert bits_equal(rows[0], rows[1])


# --------------------------------------------------------------------------------------------- bad inputs


def _packed(kern, m=4, n=8, k=64):
    u, scale, zero, _ = _weights(np.random.default_rng(0), n, k, False)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    return kern.pack_lhs(x), kern.pack_rhs(n, k, _u_to_codes(u, "s0s1"), scale=scale, zero=zero), (u, scale, zero)


def test_bad_shapes():
    kern = get_kernel(NEON_I8MM)
    lhs, rhs, (u, scale, zero) = _packed(kern)
    with pytest.raises(KernelShapeError):
        kern.run(4, 8, 48, lhs, rhs)
    with pytest.raises(KernelShapeError):
        kern.pack_lhs(np.zeros((2, 48), np.float32))
    with pytest.raises(KernelShapeError):
        kern.pack_rhs(8, 48, np.zeros((8, 24), np.uint8), scale=scale, zero=zero)
    with pytest.raises(KernelShapeError):
        get_kernel(NEON_GEMV).run(2, 8, 64, lhs, rhs)
    with pytest.raises(KernelShapeError):
        kern.pack_rhs(8, 64, _u_to_codes(u, "s0s1"), scale=scale)  # zero missing
    with pytest.raises(KernelShapeError):
        fam.RHS_PACKER_SME2_S0S1.run(8, 64, 8, 4, 2, _u_to_codes(u, "s0s1"), bl=32, scale=scale, zero=zero)
    with pytest.raises(KernelShapeError):
        fam.get_rows(kern, rhs, [8], 8, 64)
    with pytest.raises(KernelShapeError):
        fam.q4_1_to_qai4c32(np.zeros(40, np.uint8), 1, 48)


def test_bad_buffers_and_dtypes():
    kern = get_kernel(NEON_I8MM)
    lhs, rhs, (u, scale, zero) = _packed(kern)
    with pytest.raises(BufferSizeError):
        kern.run(4, 8, 64, lhs[:-1], rhs)
    with pytest.raises(BufferSizeError):
        kern.run(4, 8, 64, lhs, np.asarray(rhs)[:-4])
    with pytest.raises(BufferSizeError):
        kern.pack_rhs(8, 64, _u_to_codes(u, "s0s1")[:4], scale=scale, zero=zero)
    with pytest.raises(BufferSizeError):
        kern.pack_rhs(8, 64, _u_to_codes(u, "s0s1"), scale=scale[:4], zero=zero)
    with pytest.raises(BufferSizeError):
        fam.get_rows(kern, np.asarray(rhs)[:10], [0], 8, 64)
    with pytest.raises(BufferSizeError):
        fam.q4_1_to_qai4c32(np.zeros(39, np.uint8), 1, 64)
    with pytest.raises(DTypeError):
        kern.pack_lhs(np.zeros((4, 64), np.float64))
    with pytest.raises(DTypeError):
        kern.pack_rhs(8, 64, _u_to_codes(u, "s0s1").astype(np.int8), scale=scale, zero=zero)
    with pytest.raises(DTypeError):
        kern.pack_rhs(8, 64, _u_to_codes(u, "s0s1"), scale=scale.astype(np.float64), zero=zero)
    with pytest.raises(DTypeError):
        kern.run(4, 8, 64, np.asarray(lhs).view(np.int8), rhs)
    with pytest.raises(DTypeError):
        fam.q4_1_to_qai4c32(np.zeros(40, np.int8), 1, 32)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_lhs(bad):
    x = np.ones((3, 64), np.float32)
    x[2, 17] = bad
    for execution in ("reference", "jit"):
        with pytest.raises(NonFiniteInputError):
            get_kernel(SME_MOPA, 512).pack_lhs(x, execution=execution)


def test_buffer_packed_for_another_kernel_or_svl():
    lhs, rhs, _ = _packed(get_kernel(SME_MOPA, 256), m=8, n=64)
    with pytest.raises(PackedLayoutMismatchError):
        get_kernel(SME_MOPA, 512).run(8, 64, 64, lhs, rhs)
    with pytest.raises(PackedLayoutMismatchError):
        fam.get_rows(get_kernel(SME_MOPA, 512), rhs, [0], 64, 64)
    neon_lhs, neon_rhs, _ = _packed(get_kernel(NEON_I8MM))
    with pytest.raises(PackedLayoutMismatchError):
        get_kernel(NEON_DOT_GEMM).run(4, 8, 64, neon_lhs, neon_rhs)
    with pytest.raises(PackedLayoutMismatchError):
        get_kernel(NEON_I8MM).run(8, 64, 64, lhs, neon_rhs)
