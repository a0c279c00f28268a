"""Q4_0 family (qsi8d32p × qsi4c32p): golden runs, jit == reference, reference == independent scalar models of the
packed layouts (spec §4.1–4.4, golden README) and of the kernel recipe (exact rational fma, signed zeros), the
4x8sb packer's ties-to-even, the MOPA −0.0 quirk, GET_ROWS against GGML's Q4_0 dequantization, bad inputs."""

from __future__ import annotations

import math
from fractions import Fraction

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import assert_sme_geometry, bits_equal, exact_fma, exact_round, round_binary, verify_family

from kleidipy.core.numerics import F16_BITS_TO_F32, FLT_MAX, f32_to_f16_bits, f32_to_f16_bits_scalar
from kleidipy.errors import (
    BufferSizeError,
    DTypeError,
    KernelShapeError,
    NonFiniteInputError,
    PackedLayoutMismatchError,
)
from kleidipy.kernels.catalogue import get_kernel, get_packer
from kleidipy.kernels.qsi8d32p_qsi4c32p import ukernels as fam
from kleidipy.tools.golden import GoldenSet

KERNEL_NAMES = [k.name for k in fam.KERNELS]
SME2_MOPA = "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
SME2_SDOT = "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot"
SME_MOPA = "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme_mopa"
I8MM_16X4 = "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm"
DOTPROD_16X4 = "matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod"
GEMV_1X8 = "matmul_clamp_f32_qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod"
SVLS = (128, 256, 512, 1024)
HYP = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _kernel(name: str, svl: int = 512):
    return get_kernel(name, svl)


def _q4_0(rng: np.random.Generator, n: int, k: int, d_scale: float = 0.05) -> np.ndarray:
    """Random GGML Q4_0 blocks [n, k/32, 18]: random codes, random fp16 d of both signs (incl. tiny ones)."""
    blocks = rng.integers(0, 256, size=(n, k // 32, 18), dtype=np.uint8)
    d = (rng.standard_normal((n, k // 32)) * d_scale).astype(np.float16)
    d.reshape(-1)[:: max(1, d.size // 3)] = np.float16(3e-7)  # fp16 subnormals: fp16(d/16) rounds
    bits = d.view(np.uint16)
    blocks[:, :, 0], blocks[:, :, 1] = bits & 0xFF, bits >> 8
    return blocks


def _lhs(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    x.reshape(-1)[rng.integers(0, m * k, size=3)] = 0.0
    if m > 1:
        x[-1, :32] = 0.0  # an all-zero block: LHS scale 0
    return x


# --------------------------------------------------------------------------------------------- exact model


def _f16(x: Fraction) -> float:
    return float(round_binary(x, 11, -14))


def _model_quantize(x: np.ndarray, ties_even: bool) -> tuple[list[list[int]], list[list[float]]]:
    """Spec §4.3 quantization with exact rationals: q per element, fp16 scale values per block."""
    qs, scales = [], []
    for row in x.astype(np.float64):
        q_row, s_row = [], []
        for b in range(len(row) // 32):
            block = [Fraction(float(v)) for v in row[32 * b : 32 * b + 32]]
            sf = exact_round(max(abs(v) for v in block) / 127)
            inv = exact_round(1 / Fraction(sf)) if sf else 0.0
            for v in block:
                scaled = Fraction(exact_round(v * Fraction(inv)))
                whole = math.floor(abs(scaled))
                rest = abs(scaled) - whole
                up = rest > Fraction(1, 2) or (rest == Fraction(1, 2) and (not ties_even or whole % 2))
                q_row.append(int((whole + up) * (1 if scaled >= 0 else -1)))
            s_row.append(_f16(Fraction(sf)))
        qs.append(q_row)
        scales.append(s_row)
    return qs, scales


def _model_weights(blocks: np.ndarray) -> tuple[list[list[int]], list[list[float]]]:
    """GGML Q4_0: code j = low nibble of qs[j], code j+16 = high nibble; value (u − 8)·d."""
    codes, ds = [], []
    for row in blocks:
        c_row, d_row = [], []
        for blk in row:
            qs = [int(v) for v in blk[2:]]
            c_row += [v & 15 for v in qs] + [v >> 4 for v in qs]
            d_row.append(float(F16_BITS_TO_F32[int(blk[0]) | int(blk[1]) << 8]))
        codes.append(c_row)
        ds.append(d_row)
    return codes, ds


def _model_matmul(x: np.ndarray, blocks: np.ndarray, kern) -> np.ndarray:  # noqa: ANN001
    """The §5.2 recipe per element from the unpacked inputs, exact rationals and IEEE signed zeros."""
    q, s_l = _model_quantize(x, ties_even=False)
    codes, d = _model_weights(blocks)
    sme1 = kern.tier == "sme"  # RHS stores fp16(d/16); the kernel's dot is 16 × the true dot
    mopa = kern.flags.get("first_block_fmul", False)
    m, n, nb = x.shape[0], blocks.shape[0], blocks.shape[1]
    out = np.empty((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            acc = -0.0 if mopa else 0.0
            for b in range(nb):
                dot = sum(q[i][32 * b + t] * (codes[j][32 * b + t] - 8) for t in range(32))
                s_r = _f16(Fraction(d[j][b]) / 16) if sme1 else d[j][b]
                scale = s_l[i][b] * s_r + 0.0  # exact product of two fp16 values; FMLALB from +0
                acc = exact_fma(float(dot * (16 if sme1 else 1)), scale, acc)
            out[i, j] = acc
    return out


# --------------------------------------------------------------------------------------------- layout models


def _f16_bytes(value: float) -> tuple[int, int]:
    bits = int(np.array([value], np.float32).astype(np.float16).view(np.uint16)[0])
    return bits & 0xFF, bits >> 8


def _model_lhs_packed(x: np.ndarray, packer, mr: int, kr: int, sr: int) -> np.ndarray:  # noqa: ANN001
    """Spec §4.3 (qsi8d32p_f32, 4x8sb) or §4.4 (qsi8d32p_f32_neon) bytes, element by element."""
    m, k = x.shape
    nb = k // 32
    q, scales = _model_quantize(x, packer.ties_even)
    stride = mr * nb * 34
    out = np.zeros(-(-m // mr) * stride, np.uint8)
    sme = packer.name.endswith("_f32_neon") and "4x8sb" not in packer.name
    kbl = kr // sr
    for i in range(m):
        g, r = divmod(i, mr)
        for kk in range(k):
            b, t = divmod(kk, 32)
            if sme:
                off = g * stride + (kk // 4) * 4 * mr + 4 * r + kk % 4
            else:
                off = g * stride + b * mr * 34 + 2 * mr + (t // kbl) * mr * kbl + r * kbl + t % kbl
            out[off] = q[i][kk] & 0xFF
        for b in range(nb):
            so = g * stride + (mr * nb * 32 + 2 * (b * mr + r) if sme else b * mr * 34 + 2 * r)
            out[so], out[so + 1] = _f16_bytes(scales[i][b])
    return out


def _model_rhs_packed(blocks: np.ndarray, packer, nr: int, kr: int) -> np.ndarray:  # noqa: ANN001
    """Spec §4.1 / §4.2 / golden README (SME1) bytes, element by element."""
    n, nb, _ = blocks.shape
    codes, d = _model_weights(blocks)
    stride = nr * nb * 18
    groups = -(-n // nr)
    out = np.zeros(groups * stride, np.uint8)
    for row in range(groups * nr):
        g, r = divmod(row, nr)
        if packer is fam.RHS_QSI4C32PSCALEF16:
            src = min(row, n - 1)  # padding rows copy row n-1
            for b in range(nb):
                base = g * stride + b * nr * 18
                out[base + 2 * r], out[base + 2 * r + 1] = blocks[src, b, 0], blocks[src, b, 1]
                for j in range(16):
                    s, t = divmod(j, kr // 2)
                    out[base + 2 * nr + s * nr * (kr // 2) + r * (kr // 2) + t] = blocks[src, b, 2 + j] ^ 0x88
            continue
        if row >= n:  # SME layouts: padding rows are 0
            continue
        u = codes[row]
        for b in range(nb):
            so = g * stride + nr * nb * 16 + 2 * (b * nr + r)
            if packer is fam.RHS_QSI4C32PS1S0SCALEF16_NEON:
                for kk in range(32 * b, 32 * b + 32):
                    byte = g * stride + 2 * ((kk // 4) * nr + r) + (kk % 4) // 2
                    out[byte] |= u[kk] << (4 * (kk % 2))
                out[so], out[so + 1] = blocks[row, b, 0], blocks[row, b, 1]
            else:
                for p in range(4):
                    for j in range(4):
                        lo, hi = u[32 * b + 8 * p + j], u[32 * b + 8 * p + j + 4]
                        out[g * stride + 4 * ((b * 4 + p) * nr + r) + j] = (lo | hi << 4) ^ 0x88
                out[so], out[so + 1] = _f16_bytes(_f16(Fraction(d[row][b]) / 16))
    return out


# --------------------------------------------------------------------------------------------- golden


@pytest.mark.parametrize("execution", ["reference", "jit"])
def test_golden_runs_bit_exact(golden_dir, execution):
    count, failures = verify_family(golden_dir, fam.FAMILY_NAME, execution)
    assert count == 122
    assert not failures, "\n".join(failures[:10])


def test_golden_layouts_match_the_element_models(golden_dir):
    """The element-by-element layout models used below reproduce the golden packed bytes."""
    golden = GoldenSet(golden_dir)
    case = next(c for c in golden.manifest["cases"] if (c["m"], c["n"], c["k"]) == (7, 33, 96))
    blocks = golden.array(case["inputs"]["rhs_q4_0"])
    lhs = golden.array(case["inputs"]["lhs_f32"]).reshape(7, 96)
    seen = set()
    for run in case["runs"]:
        if run.get("family") != fam.FAMILY_NAME or run.get("status") != "ok" or (run["dir"], run["variant"]) in seen:
            continue
        seen.add((run["dir"], run["variant"]))
        p = run["params"]
        rhs_packer = get_packer(run["kernels"]["rhs_pack"])
        want = golden.array(run["files"]["rhs_packed"])
        np.testing.assert_array_equal(_model_rhs_packed(blocks, rhs_packer, p["nr"], p["kr"]), want)
        if p["mr"] > 1:
            lhs_packer = get_packer(run["kernels"]["lhs_pack"])
            got = _model_lhs_packed(lhs, lhs_packer, p["mr"], p["kr"], p["sr"])
            np.testing.assert_array_equal(got, golden.array(run["files"]["lhs_packed"]))
    assert len(seen) == 9  # 3 NEON GEMMs + 2 SME GEMMs at 3 SVLs (GEMV kernels do not run for m = 7)


# --------------------------------------------------------------------------------------------- properties


@HYP
@given(
    name=st.sampled_from(KERNEL_NAMES),
    svl=st.sampled_from(SVLS),
    m=st.integers(1, 40),
    n=st.integers(1, 150),
    nb=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    clamp=st.booleans(),
)
def test_jit_equals_reference(name, svl, m, n, nb, seed, clamp):
    kern = _kernel(name, svl)
    m = 1 if kern.kind == "gemv" else m
    k = 32 * nb
    rng = np.random.default_rng(seed)
    x, blocks = _lhs(rng, m, k), _q4_0(rng, n, k)
    rhs = {ex: kern.pack_rhs(n, k, blocks, execution=ex) for ex in ("reference", "jit")}
    lhs = {ex: kern.pack_lhs(x, execution=ex) for ex in ("reference", "jit")}
    np.testing.assert_array_equal(rhs["jit"], rhs["reference"])
    np.testing.assert_array_equal(lhs["jit"], lhs["reference"])
    lo, hi = (-0.3, 0.25) if clamp else (-FLT_MAX, FLT_MAX)
    dst = {ex: kern.run(m, n, k, lhs[ex], rhs[ex], None, None, lo, hi, execution=ex) for ex in ("reference", "jit")}
    assert bits_equal(dst["jit"], dst["reference"])
    if clamp:
        assert dst["jit"].min() >= np.float32(lo) and dst["jit"].max() <= np.float32(hi)


@HYP
@given(
    name=st.sampled_from(KERNEL_NAMES),
    svl=st.sampled_from(SVLS),
    m=st.integers(1, 6),
    n=st.integers(1, 20),
    nb=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_reference_equals_exact_model(name, svl, m, n, nb, seed):
    kern = _kernel(name, svl)
    m = 1 if kern.kind == "gemv" else m
    k = 32 * nb
    rng = np.random.default_rng(seed)
    x, blocks = _lhs(rng, m, k), _q4_0(rng, n, k)
    dst = kern.run(m, n, k, kern.pack_lhs(x, execution="reference"), kern.pack_rhs(n, k, blocks), execution="reference")
    want = _model_matmul(x, blocks, kern)
    assert bits_equal(dst, want)


@HYP
@given(
    which=st.sampled_from(["neon", "sme2", "sme1"]),
    n=st.integers(1, 70),
    nb=st.integers(1, 3),
    nr=st.sampled_from([1, 4, 8, 16, 64]),
    kr=st.sampled_from([2, 4, 8, 16, 32]),
    seed=st.integers(0, 2**31),
)
def test_rhs_packers_match_layout_model(which, n, nb, nr, kr, seed):
    packer = {
        "neon": fam.RHS_QSI4C32PSCALEF16,
        "sme2": fam.RHS_QSI4C32PS1S0SCALEF16_NEON,
        "sme1": fam.RHS_QSI4C32PS4S0SF16_NEON,
    }[which]
    kr = kr if which == "neon" else 4
    k = 32 * nb
    blocks = _q4_0(np.random.default_rng(seed), n, k)
    want = _model_rhs_packed(blocks, packer, nr, kr)
    for execution in ("reference", "jit"):
        got = packer.run(n, k, nr, kr, 2, blocks.reshape(-1), bl=32, execution=execution)
        np.testing.assert_array_equal(got, want)
        assert got.layout.packer == packer.name


@HYP
@given(
    which=st.sampled_from(["generic", "sme", "4x8sb"]),
    m=st.integers(1, 20),
    nb=st.integers(1, 3),
    mr=st.sampled_from([1, 2, 4, 8, 16]),
    kr_sr=st.sampled_from([(4, 2), (8, 2), (16, 2), (4, 1), (8, 1), (32, 1)]),
    seed=st.integers(0, 2**31),
)
def test_lhs_packers_match_layout_model(which, m, nb, mr, kr_sr, seed):
    packer = {
        "generic": fam.LHS_QSI8D32P_F32,
        "sme": fam.LHS_QSI8D32P_F32_NEON,
        "4x8sb": fam.LHS_QSI8D32P4X8SB_F32_NEON,
    }[which]
    kr, sr = {"generic": kr_sr, "sme": (4, 2), "4x8sb": (16, 2)}[which]
    mr = 4 if which == "4x8sb" else mr
    k = 32 * nb
    x = _lhs(np.random.default_rng(seed), m, k)
    want = _model_lhs_packed(x, packer, mr, kr, sr)
    for execution in ("reference", "jit"):
        got = packer.run(m, k, mr, kr, sr, x, bl=32, execution=execution)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("packer", [fam.LHS_QSI8D32P_F32, fam.LHS_QSI8D32P_F32_NEON])
def test_lhs_row_offset_and_stride(packer):
    """m_idx_start places rows inside their group; lhs_stride (bytes) selects rows of a wider matrix."""
    rng = np.random.default_rng(7)
    wide = rng.standard_normal((9, 100)).astype(np.float32)
    x = np.ascontiguousarray(wide[:, :64])
    mr, kr, sr = 4, 4, 2
    full = packer.run(9, 64, mr, kr, sr, x, bl=32, execution="reference")
    for execution in ("reference", "jit"):
        strided = packer.run(9, 64, mr, kr, sr, wide, bl=32, lhs_stride=400, execution=execution)
        np.testing.assert_array_equal(strided, full)
        shifted = packer.run(7, 64, mr, kr, sr, x[2:], bl=32, m_idx_start=2, execution=execution)
        assert shifted.size == full.size
        q_full, s_full = packer.unpack(np.asarray(full), 9, 64, mr, kr, sr)
        q_part, s_part = packer.unpack(np.asarray(shifted), 9, 64, mr, kr, sr)
        np.testing.assert_array_equal(q_part[2:], q_full[2:])
        assert bits_equal(s_part[2:], s_full[2:])
        assert not q_part[:2].any() and bits_equal(s_part[:2], np.zeros_like(s_part[:2]))  # +0.0, not −0.0


def test_threads_give_the_same_bits():
    rng = np.random.default_rng(3)
    m, n, k = 21, 200, 96
    x, blocks = _lhs(rng, m, k), _q4_0(rng, n, k)
    for name, svl in ((SME2_MOPA, 128), (I8MM_16X4, None), (DOTPROD_16X4, None)):
        kern = get_kernel(name, svl)
        rhs = kern.pack_rhs(n, k, blocks)
        lhs1 = kern.pack_lhs(x)
        lhs2 = kern.pack_lhs(x, threads=2)
        np.testing.assert_array_equal(lhs1, lhs2)
        one = kern.run(m, n, k, lhs1, rhs)
        two = kern.run(m, n, k, lhs1, rhs, threads=2, min_split_macs=0)
        assert bits_equal(one, two)


def test_dst_stride_and_gemv_rows_path():
    """A wider dst keeps its other columns; the few-rows (GEMV) and panel loop nests agree."""
    rng = np.random.default_rng(11)
    n, k = 70, 128
    blocks = _q4_0(rng, n, k)
    kern = get_kernel(SME2_MOPA, 256)
    rhs = kern.pack_rhs(n, k, blocks)
    x = _lhs(rng, 6, k)
    full = kern.run(6, n, k, kern.pack_lhs(x), rhs)
    for rows in (1, 2, 3):  # rows <= FEW_ROWS use the GEMV nest
        part = kern.run(rows, n, k, kern.pack_lhs(x[:rows]), rhs)
        assert bits_equal(part, full[:rows])
    dst = np.full((6, n + 5), 7.0, np.float32)
    kern.run(6, n, k, kern.pack_lhs(x), rhs, dst, (n + 5) * 4)
    assert bits_equal(dst[:, :n], full)
    assert (dst[:, n:] == 7.0).all()


# --------------------------------------------------------------------------------------------- quirks


@pytest.mark.parametrize("execution", ["reference", "jit"])
def test_mopa_first_block_keeps_negative_zero(execution):
    """A zero block dot with a negative scale: MOPA's first-block FMUL gives −0.0, the fma kernels +0.0.
    An all-zero LHS block has scale +0 and S = +0 + s_L·s_R = +0 (FMLALB from +0): +0.0 everywhere."""
    k, n = 64, 4
    blocks = np.zeros((n, 2, 18), np.uint8)
    blocks[:, :, 2:] = 0x88  # every code 8: value 0, so every dot is 0
    d = np.float16(-0.5).view(np.uint16)
    blocks[:, :, 0], blocks[:, :, 1] = d & 0xFF, d >> 8
    x = np.ones((2, k), np.float32)
    x[1] = 0.0  # row 1: all-zero blocks, LHS scale 0
    for name in KERNEL_NAMES:
        kern = _kernel(name, 256)
        m = 1 if kern.kind == "gemv" else 2
        dst = kern.run(m, n, k, kern.pack_lhs(x[:m]), kern.pack_rhs(n, k, blocks), execution=execution)
        assert (dst == 0).all()
        mopa = kern.flags.get("first_block_fmul", False)
        assert np.signbit(dst[0]).tolist() == [mopa] * n, name
        if m == 2:
            assert not np.signbit(dst[1]).any(), name


@pytest.mark.parametrize("execution", ["reference", "jit"])
def test_4x8sb_rounds_ties_to_even(execution):
    """amax = 127 gives scale 1 and inverse 1: x.5 values are exact ties. The generic packer rounds them away
    from zero, the 4x8sb packer to even; nothing else differs."""
    ties = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5], np.float32)
    x = np.tile(np.concatenate([[127.0], ties, np.linspace(-3, 3, 23)]).astype(np.float32), (5, 2))
    generic = fam.LHS_QSI8D32P_F32.run(5, 64, 4, 16, 2, x, bl=32, execution=execution)
    sb = fam.LHS_QSI8D32P4X8SB_F32_NEON.run(5, 64, 4, 16, 2, x, bl=32, execution=execution)
    q_g, s_g = fam.LHS_QSI8D32P_F32.unpack(np.asarray(generic), 5, 64, 4, 16, 2)
    q_s, s_s = fam.LHS_QSI8D32P_F32.unpack(np.asarray(sb), 5, 64, 4, 16, 2)
    assert (s_g == 1.0).all() and (s_s == 1.0).all()
    np.testing.assert_array_equal(q_g[:, 1:9], np.tile([1, -1, 2, -2, 3, -3, 127, -127], (5, 1)))
    np.testing.assert_array_equal(q_s[:, 1:9], np.tile([0, 0, 2, -2, 2, -2, 126, -126], (5, 1)))
    differ = q_g != q_s
    assert differ[:, 1:9].sum() == 5 * 6 and differ.sum() == differ[:, 1:9].sum() + differ[:, 33:41].sum()
    np.testing.assert_array_equal(q_s, np.array(_model_quantize(x, ties_even=True)[0]))


def test_i8mm_kernels_accept_both_roundings_of_the_lhs():
    """The 16x4 I8MM GEMM packs with the 4x8sb packer, as llama.cpp pairs them (ties to even), and accepts the
    generic packer's buffers (the golden pairing); the 8x4x32 one the other way round."""
    rng = np.random.default_rng(5)
    m, n, k = 9, 12, 64
    x, blocks = _lhs(rng, m, k), _q4_0(rng, n, k)
    kern = get_kernel(I8MM_16X4)
    assert kern.lhs_packer is fam.LHS_QSI8D32P4X8SB_F32_NEON and kern.alt_lhs_packers == (fam.LHS_QSI8D32P_F32,)
    other = get_kernel("matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_8x4x32_neon_i8mm")
    assert other.lhs_packer is fam.LHS_QSI8D32P_F32 and other.alt_lhs_packers == (fam.LHS_QSI8D32P4X8SB_F32_NEON,)
    lhs = fam.LHS_QSI8D32P_F32.run(m, k, 4, 16, 2, x, bl=32)
    rhs = kern.pack_rhs(n, k, blocks)
    own = kern.run(m, n, k, kern.pack_lhs(x), rhs)  # random data has no exact ties: same bytes, same dst
    for execution in ("reference", "jit"):
        dst = kern.run(m, n, k, lhs, rhs, execution=execution)
        assert bits_equal(dst, own)
    sb = fam.LHS_QSI8D32P4X8SB_F32_NEON.run(m, k, 4, 16, 2, x, bl=32)
    with pytest.raises(PackedLayoutMismatchError):  # same layout, but not this kernel's packer or kr
        get_kernel(DOTPROD_16X4).run(m, n, k, sb, get_kernel(DOTPROD_16X4).pack_rhs(n, k, blocks))


def test_f32_to_f16_bits_matches_numpy():
    @numba.njit(cache=False)
    def convert(bits):
        out = np.empty(bits.size, np.uint16)
        for i in range(bits.size):
            out[i] = f32_to_f16_bits_scalar(bits[i])
        return out

    rng = np.random.default_rng(0)
    edge = np.arange(0x33000000 - 4096, 0x38800000 + 4096, 7, dtype=np.uint32)  # fp16 subnormal range
    top = np.arange(0x477FE000 - 70000, 0x47800000 + 4096, 3, dtype=np.uint32)  # around 65504 / Inf
    bits = np.concatenate([rng.integers(0, 2**32, 400_000, dtype=np.uint32), edge, top, edge | 0x80000000])
    with np.errstate(over="ignore"):
        want = f32_to_f16_bits(bits.view(np.float32))
    assert (convert(bits) == want).all()


# --------------------------------------------------------------------------------------------- GET_ROWS


def _ggml_dequant(blocks: np.ndarray) -> np.ndarray:
    n, nb, _ = blocks.shape
    d = F16_BITS_TO_F32[blocks[:, :, 0].astype(np.uint16) | blocks[:, :, 1].astype(np.uint16) << 8]
    u = np.concatenate([blocks[:, :, 2:] & 15, blocks[:, :, 2:] >> 4], axis=2).astype(np.float32)
    return ((u - 8) * d[:, :, None]).reshape(n, nb * 32)


@HYP
@given(
    which=st.sampled_from(["sme2", "neon"]),
    svl=st.sampled_from(SVLS),
    kr=st.sampled_from([8, 16]),
    n=st.integers(1, 140),
    nb=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_get_rows_is_ggml_dequantization(which, svl, kr, n, nb, seed):
    packer = fam.RHS_QSI4C32PS1S0SCALEF16_NEON if which == "sme2" else fam.RHS_QSI4C32PSCALEF16
    nr, kr = (4 * svl // 32, 4) if which == "sme2" else (4, kr)
    k = 32 * nb
    rng = np.random.default_rng(seed)
    blocks = _q4_0(rng, n, k)
    packed = packer.run(n, k, nr, kr, 2, blocks, bl=32)
    rows = rng.integers(0, n, size=7)
    want = _ggml_dequant(blocks)[rows]
    for execution in ("reference", "jit"):
        got = packer.get_rows(packed, rows, n, k, nr, kr, execution=execution)
        assert got.dtype == np.float32 and got.shape == (7, k)
        assert bits_equal(got, want)


def test_get_rows_bad_inputs():
    blocks = _q4_0(np.random.default_rng(1), 10, 64)
    sme2 = fam.RHS_QSI4C32PS1S0SCALEF16_NEON
    packed = sme2.run(10, 64, 16, 4, 2, blocks, bl=32)
    with pytest.raises(KernelShapeError):
        sme2.get_rows(packed, [10], 10, 64, 16, 4)
    with pytest.raises(KernelShapeError):
        sme2.get_rows(packed, [-1], 10, 64, 16, 4)
    with pytest.raises(DTypeError):
        sme2.get_rows(packed, np.array([1.0]), 10, 64, 16, 4)
    with pytest.raises(PackedLayoutMismatchError):
        sme2.get_rows(packed, [1], 10, 64, 32, 4)
    with pytest.raises(BufferSizeError):
        sme2.get_rows(np.asarray(packed)[:-1], [1], 10, 64, 16, 4)
    with pytest.raises(DTypeError):
        sme2.get_rows(np.asarray(packed).view(np.int8), [1], 10, 64, 16, 4)
    sme1 = fam.RHS_QSI4C32PS4S0SF16_NEON
    with pytest.raises(KernelShapeError):
        sme1.get_rows(sme1.run(10, 64, 16, 4, 2, blocks, bl=32), [1], 10, 64, 16, 4)


# --------------------------------------------------------------------------------------------- catalogue, errors


def test_catalogue_geometry():
    kerns = {k.name: k for k in fam.KERNELS}
    assert set(kerns) == set(KERNEL_NAMES) and len(kerns) == 9
    assert_sme_geometry(SME2_MOPA, SME2_SDOT, SVLS, 4, 2)
    tiers = {k.name: (k.tier, k.kind) for k in fam.KERNELS}
    assert tiers[SME_MOPA] == ("sme", "gemm") and tiers[GEMV_1X8] == ("dotprod", "gemv")
    assert tiers[I8MM_16X4] == ("i8mm", "gemm")
    assert get_kernel(I8MM_16X4).m_step == 16 and get_kernel(I8MM_16X4).n_step == 4
    assert get_packer("kai_run_lhs_quant_pack_qsi8d32p4x8sb_f32_neon") is fam.LHS_QSI8D32P4X8SB_F32_NEON


def test_bad_inputs():
    rng = np.random.default_rng(2)
    blocks, x = _q4_0(rng, 8, 64), _lhs(rng, 3, 64)
    kern = get_kernel(SME2_MOPA, 512)
    rhs, lhs = kern.pack_rhs(8, 64, blocks), kern.pack_lhs(x)
    with pytest.raises(KernelShapeError):  # k not a multiple of bl
        kern.pack_rhs(8, 48, blocks)
    with pytest.raises(KernelShapeError):
        fam.LHS_QSI8D32P_F32.run(3, 48, 4, 8, 2, x[:, :48], bl=32)
    with pytest.raises(KernelShapeError):
        kern.run(3, 8, 48, lhs, rhs)
    with pytest.raises(KernelShapeError):  # m > 1 on a GEMV kernel
        get_kernel(GEMV_1X8).run(3, 8, 64, lhs, rhs)
    with pytest.raises(BufferSizeError):
        kern.run(3, 8, 64, np.asarray(lhs)[:-1], rhs)
    with pytest.raises(BufferSizeError):
        kern.run(3, 8, 64, lhs, np.asarray(rhs)[:-1])
    with pytest.raises(BufferSizeError):
        kern.pack_rhs(8, 64, blocks.reshape(-1)[:-1])
    with pytest.raises(KernelShapeError):
        kern.pack_rhs(8, 64, blocks[:, :1])
    with pytest.raises(DTypeError):
        kern.run(3, 8, 64, np.asarray(lhs).view(np.int8), rhs)
    with pytest.raises(DTypeError):
        kern.pack_rhs(8, 64, blocks.view(np.int8))
    with pytest.raises(DTypeError):
        kern.pack_lhs(x.astype(np.float64))
    for bad in (np.nan, np.inf):
        y = x.copy()
        y[1, 5] = bad
        with pytest.raises(NonFiniteInputError):
            kern.pack_lhs(y)
    with pytest.raises(PackedLayoutMismatchError):  # packed for another SVL
        get_kernel(SME2_MOPA, 256).run(3, 8, 64, lhs, rhs)
    with pytest.raises(PackedLayoutMismatchError):  # packed for another kernel (SME1 RHS layout)
        get_kernel(SME_MOPA, 512).run(3, 8, 64, lhs, rhs)
    with pytest.raises(PackedLayoutMismatchError):  # NEON RHS under the SME2 kernel
        kern.run(3, 8, 64, lhs, get_kernel(DOTPROD_16X4).pack_rhs(8, 64, blocks))
    with pytest.raises(KernelShapeError):  # Q4_0 packers take no bias / scale
        kern.pack_rhs(8, 64, blocks, bias=np.zeros(8, np.float32))
    with pytest.raises(KernelShapeError):  # SME packers take only kr=4, sr=2
        fam.RHS_QSI4C32PS1S0SCALEF16_NEON.run(8, 64, 16, 8, 2, blocks, bl=32)
    with pytest.raises(KernelShapeError):
        fam.LHS_QSI8D32P4X8SB_F32_NEON.run(3, 64, 8, 16, 2, x, bl=32)
    with pytest.raises(KernelShapeError):
        fam.LHS_QSI8D32P_F32_NEON.run(3, 64, 4, 8, 2, x, bl=32)
