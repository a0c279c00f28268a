"""AVX-512 VNNI execution of the Q4_0 SME2-layout kernels (kleidipy.kernels.qsi8d32p_qsi4c32p.vnni).

Both ISAs (VNNI512 when the host has it, PORTABLE everywhere) against: an independent exact model of spec
§5.2 written here (own packers from codes, integer dots, float64-exact fma), the golden KleidiAI outputs, and
the family's own reference when it is importable. Also the fast LHS quantize+pack against golden bytes,
the family's packer and a numpy model.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal

from kleidipy.core import vnni
from kleidipy.core.numerics import F16_BITS_TO_F32, clamp_f32, f32_to_f16_bits, fma_f32, round_away
from kleidipy.errors import BufferSizeError, DTypeError, KernelShapeError
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni as vk
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni_neon as vn
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni_pack as vk_pack
from kleidipy.tools.golden import GoldenSet, iter_runs

ISAS = [vnni.PORTABLE] + ([vnni.VNNI512] if vnni.HAS_AVX512_VNNI else [])
SVLS = (128, 256, 512, 1024, 2048)
GEMM = "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
GEMV = "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot"
RHS_PACKER = "kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon"


# --------------------------------------------------------------------------------------------- model


def le_bytes(values: np.ndarray) -> np.ndarray:
    """Little-endian bytes of uint16 values (last axis doubles)."""
    return np.ascontiguousarray(values, dtype="<u2").view(np.uint8)


def padded(a: np.ndarray, multiple: int, dtype: type) -> np.ndarray:
    """a's rows as ``dtype``, zero rows appended up to a multiple of ``multiple``."""
    out = np.zeros((-(-a.shape[0] // multiple) * multiple, *a.shape[1:]), dtype)
    out[: a.shape[0]] = a
    return out


def pack_rhs(u: np.ndarray, d_bits: np.ndarray, nr: int) -> np.ndarray:
    """§4.1 from codes u [n, k] (0..15) and fp16 bits [n, k/32]; padding columns 0."""
    n, k = u.shape
    nb, groups = k // 32, -(-n // nr)
    codes, scales = padded(u, nr, np.uint16), padded(d_bits, nr, np.uint16)
    words = codes[:, 0::4] | codes[:, 1::4] << 4 | codes[:, 2::4] << 8 | codes[:, 3::4] << 12  # [n, k/4]
    data = le_bytes(words.reshape(groups, nr, k // 4).transpose(0, 2, 1)).reshape(groups, -1)
    sc = le_bytes(scales.reshape(groups, nr, nb).transpose(0, 2, 1)).reshape(groups, -1)
    return np.concatenate([data, sc], axis=1).reshape(-1)


def pack_lhs(q: np.ndarray, s_bits: np.ndarray, mr: int) -> np.ndarray:
    """§4.4 from int8 q [m, k] and fp16 bits [m, k/32]; padding rows 0."""
    m, k = q.shape
    nb, groups = k // 32, -(-m // mr)
    qq, ss = padded(q, mr, np.int8), padded(s_bits, mr, np.uint16)
    data = np.ascontiguousarray(qq.reshape(groups, mr, k // 4, 4).transpose(0, 2, 1, 3)).view(np.uint8)
    sc = le_bytes(ss.reshape(groups, mr, nb).transpose(0, 2, 1)).reshape(groups, -1)
    data = data.reshape(groups, -1)
    return np.concatenate([data, sc], axis=1).reshape(-1)


def model(q: np.ndarray, s_bits: np.ndarray, u: np.ndarray, d_bits: np.ndarray, fmul: bool) -> np.ndarray:
    """Spec §5.2: per block exact integer dot, S = s_L·s_R + 0, acc = fma(dot, S, acc) from ±0."""
    m, k = q.shape
    w = u.astype(np.int64) - 8
    acc = np.full((m, u.shape[0]), -0.0 if fmul else 0.0, np.float32)
    s_l, s_r = F16_BITS_TO_F32[s_bits], F16_BITS_TO_F32[d_bits]
    for b in range(k // 32):
        dot = q[:, 32 * b : 32 * b + 32].astype(np.int64) @ w[:, 32 * b : 32 * b + 32].T
        scale = (s_l[:, b, None] * s_r[None, :, b]).astype(np.float32) + np.float32(0)
        acc = fma_f32(dot.astype(np.float32), scale, acc)
    return acc


def fp16_scales(rng: np.random.Generator, shape: tuple[int, ...], special: bool) -> np.ndarray:
    """fp16 bits of mixed-sign scales (normal and subnormal); with ``special`` some ±0."""
    mag = rng.choice([1e-7, 1e-5, 1e-3, 0.05, 2.0, 300.0], size=shape) * rng.uniform(0.5, 1.0, size=shape)
    bits = f32_to_f16_bits((mag * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32))
    if special:
        bits[rng.random(shape) < 0.15] = 0x0000
        bits[rng.random(shape) < 0.15] = 0x8000
    return bits


def operands(rng: np.random.Generator, m: int, n: int, k: int, special: bool = True):  # noqa: ANN201
    q = rng.integers(-127, 128, (m, k)).astype(np.int8)
    q[rng.random((m, k)) < 0.05] = -128 if special else 0  # -128 never comes from the packer, still exact
    if special and k >= 64:
        q[0, 32:64] = 0  # an all-zero LHS block
    u = rng.integers(0, 16, (n, k)).astype(np.uint8)
    return q, fp16_scales(rng, (m, k // 32), special), u, fp16_scales(rng, (n, k // 32), special)


# --------------------------------------------------------------------------------------------- compute


@pytest.mark.parametrize("isa", ISAS, ids=str)
@pytest.mark.parametrize("svl", SVLS)
@pytest.mark.parametrize("kind", ["gemm", "gemv"])
def test_matches_model_every_svl(isa: vnni.Isa, svl: int, kind: str) -> None:
    vl = svl // 32
    mr, nr = (vl, 4 * vl) if kind == "gemm" else (1, 4 * vl)
    rng = np.random.default_rng(svl + (kind == "gemm"))
    shapes = [(1, 4 * vl + 3, 96)] if kind == "gemv" else [(1, 70, 64), (3, 33, 32), (vl + 5, 2 * nr + 17, 160)]
    for m, n, k in shapes:
        q, s_bits, u, d_bits = operands(rng, m, n, k)
        lhs, rhs = pack_lhs(q, s_bits, mr), pack_rhs(u, d_bits, nr)
        for fmul in (False, True):
            got = vk.compute(m, n, k, mr, nr, lhs, rhs, fmul, isa)
            assert bits_equal(got, model(q, s_bits, u, d_bits, fmul)), (m, n, k, fmul)


@pytest.mark.parametrize("nr", [64, 128])
def test_gemv_streams_over_many_panels(nr: int) -> None:
    """The GEMV reads up to GEMV_PANELS panels at once, far apart, then the panels left over: every panel count
    and leftover (n not a multiple of 64 included), both ISAs, the same bits as the model."""
    rng = np.random.default_rng(nr)
    k = 96
    for n in (64, 130, 192, 256, 64 * 5 + 1, 64 * 6, 64 * 7 - 5, 64 * 8, 64 * 11 + 17, 64 * 13):
        q, s_bits, u, d_bits = operands(rng, 1, n, k)
        lhs, rhs = pack_lhs(q, s_bits, 1), pack_rhs(u, d_bits, nr)
        for fmul in (False, True):
            want = model(q, s_bits, u, d_bits, fmul)
            for isa in ISAS:
                assert bits_equal(vk.compute(1, n, k, 1, nr, lhs, rhs, fmul, isa), want), (n, fmul, isa)


@pytest.mark.parametrize("nr", [64, 128])
def test_decoded_panels(nr: int) -> None:
    """More than DECODE_ROWS rows read each panel decoded once (fewer spread it in every row tile): both sides of
    the threshold, tail row tiles of 1-3 rows and a partial last panel, both ISAs, the same bits as the model."""
    rng = np.random.default_rng(nr + 1)
    k, n = 96, 2 * 64 + 21
    for m in (vk.DECODE_ROWS, vk.DECODE_ROWS + 1, vk.DECODE_ROWS + 2, vk.DECODE_ROWS + 3, 2 * vk.DECODE_ROWS + 4):
        q, s_bits, u, d_bits = operands(rng, m, n, k, special=True)
        lhs, rhs = pack_lhs(q, s_bits, 16), pack_rhs(u, d_bits, nr)
        for fmul in (False, True):
            want = model(q, s_bits, u, d_bits, fmul)
            for isa in ISAS:
                assert bits_equal(vk.compute(m, n, k, 16, nr, lhs, rhs, fmul, isa), want), (m, fmul, isa)


def test_long_k() -> None:
    """Many blocks (the prefetch runs past the end of the buffer on the last panel: harmless)."""
    rng = np.random.default_rng(9)
    m, n, k = 9, 130, 32 * 65
    q, s_bits, u, d_bits = operands(rng, m, n, k)
    lhs, rhs = pack_lhs(q, s_bits, 16), pack_rhs(u, d_bits, 64)
    for fmul in (False, True):
        want = model(q, s_bits, u, d_bits, fmul)
        for isa in ISAS:
            assert bits_equal(vk.compute(m, n, k, 16, 64, lhs, rhs, fmul, isa), want)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 21),
    n=st.integers(1, 200),
    nb=st.integers(1, 6),
    svl=st.sampled_from(SVLS),
    fmul=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shapes_both_isas(m: int, n: int, nb: int, svl: int, fmul: bool, seed: int) -> None:
    vl = svl // 32
    mr = 1 if seed % 2 else vl  # mr = 1: the GEMV packing (any m works)
    rng = np.random.default_rng(seed)
    q, s_bits, u, d_bits = operands(rng, m, n, 32 * nb, special=bool(seed % 3))
    lhs, rhs = pack_lhs(q, s_bits, mr), pack_rhs(u, d_bits, 4 * vl)
    want = model(q, s_bits, u, d_bits, fmul)
    for isa in ISAS:
        assert bits_equal(vk.compute(m, n, 32 * nb, mr, 4 * vl, lhs, rhs, fmul, isa), want)


def test_signed_zeros() -> None:
    """S = s_L·s_R + 0 turns the −0 product of s_L = 1, s_R = −0 into +0, so a negative dot gives a −0 term:
    the MOPA recipe (start −0, fma(x, y, −0) = x·y) keeps it, the SDOT recipe (start +0) does not."""
    k, n = 64, 64
    q = np.zeros((1, k), np.int8)
    q[0, 5] = q[0, 40] = -3
    u = np.full((n, k), 9, np.uint8)  # w = +1: dot = -3 in both blocks
    d_bits = np.full((n, 2), 0x8000, np.uint16)
    s_bits = np.full((1, 2), 0x3C00, np.uint16)
    lhs, rhs = pack_lhs(q, s_bits, 1), pack_rhs(u, d_bits, 64)
    for isa in ISAS:
        mopa = vk.compute(1, n, k, 1, 64, lhs, rhs, True, isa)
        sdot = vk.compute(1, n, k, 1, 64, lhs, rhs, False, isa)
        assert (mopa.view(np.uint32) == 0x80000000).all()
        assert (sdot.view(np.uint32) == 0).all()
        assert bits_equal(mopa, model(q, s_bits, u, d_bits, True))


def test_padding_columns_are_ignored() -> None:
    """KleidiAI leaves the padding columns of a partial RHS group unwritten: garbage there must not matter."""
    rng = np.random.default_rng(7)
    m, n, k = 5, 70, 64
    q, s_bits, u, d_bits = operands(rng, m, n, k)
    for nr in (64, 128):
        rhs = pack_rhs(u, d_bits, nr)
        dirty = rhs.copy().reshape(-1, nr * 2 * 18)
        junk = rng.integers(0, 256, dirty.shape, dtype=np.uint8)
        pad = np.ones(dirty.shape, bool)
        clean = pack_rhs(np.ones_like(u), np.full_like(d_bits, 0x0101), nr).reshape(dirty.shape) != 0
        pad[clean] = False
        dirty[pad] = junk[pad]
        for mr, mm in ((16, m), (1, 1)):
            lhs = pack_lhs(q[:mm], s_bits[:mm], mr)
            for isa in ISAS:
                got = vk.compute(mm, n, k, mr, nr, lhs, dirty.reshape(-1), True, isa)
                assert bits_equal(got, model(q[:mm], s_bits[:mm], u, d_bits, True))


def test_matches_family_reference() -> None:
    """The family's numpy reference kernel (another implementation of the same recipe), when present."""
    fam = pytest.importorskip("kleidipy.kernels.qsi8d32p_qsi4c32p.ukernels")
    from kleidipy.kernels.catalogue import get_kernel

    rng = np.random.default_rng(11)
    for name, m in ((GEMM, 19), (GEMV, 1)):
        kern = get_kernel(name, 256)
        n, k = 45, 128
        x = rng.normal(size=(m, k)).astype(np.float32)
        blocks = rng.integers(0, 256, (n, k // 32, 18)).astype(np.uint8)
        blocks[:, :, :2] = f32_to_f16_bits(rng.uniform(-0.1, 0.1, (n, k // 32)).astype(np.float32))[..., None].view(
            np.uint8
        )
        lhs = kern.pack_lhs(x, execution="reference")
        rhs = kern.pack_rhs(n, k, blocks, execution="reference")
        want = kern.run(m, n, k, lhs, rhs, execution="reference")
        fmul = kern.flags.get("first_block_fmul", False)
        for isa in ISAS:
            got = vk.compute(m, n, k, kern.mr, kern.nr, np.asarray(lhs), np.asarray(rhs), fmul, isa)
            assert bits_equal(got, want), (name, isa)
    assert fam.FAMILY_NAME == "qsi8d32p_qsi4c32p"


def _golden_runs(golden_dir, rhs_packer: str = RHS_PACKER):  # noqa: ANN001, ANN202
    """The golden set and its runs whose RHS packer is ``rhs_packer`` (the SME2 layout's by default)."""
    gold = GoldenSet(golden_dir)
    runs = [
        (case, run)
        for case, run in iter_runs(gold)
        if run.get("status") == "ok" and run["kernels"].get("rhs_pack") == rhs_packer
    ]
    return gold, runs


def _golden_operands(gold: GoldenSet, case: dict, run: dict) -> tuple:
    """m, n, k, the run's params, its packed LHS and RHS and KleidiAI's dst [m, n]."""
    m, n, k = case["m"], case["n"], case["k"]
    want = gold.array(run["files"]["dst"]).reshape(m, n)
    return m, n, k, run["params"], gold.array(run["files"]["lhs_packed"]), gold.array(run["files"]["rhs_packed"]), want


def test_golden_dst(golden_dir) -> None:  # noqa: ANN001
    """Every SME2 Q4_0 golden run (MOPA and SDOT, SVL 128/256/512, clamped or not): dst bit for bit."""
    gold, runs = _golden_runs(golden_dir)
    assert len(runs) >= 20
    from kleidipy.tools.golden import _clamp_values

    for case, run in runs:
        m, n, k, p, lhs, rhs, want = _golden_operands(gold, case, run)
        fmul = run["variant"].endswith("_mopa")
        lo, hi = _clamp_values(p)
        for isa in ISAS:
            got = clamp_f32(vk.compute(m, n, k, p["mr"], p["nr"], lhs, rhs, fmul, isa), lo, hi)
            assert bits_equal(got, want), (run["dir"], run["variant"], run.get("clamped"), isa)


# --------------------------------------------------------------------------------------------- bad input


def test_bad_input() -> None:
    lhs, rhs = np.zeros(34 * 16, np.uint8), np.zeros(64 * 18, np.uint8)
    with pytest.raises(KernelShapeError):
        vk.compute(1, 64, 48, 16, 64, lhs, rhs, False)
    with pytest.raises(KernelShapeError):
        vk.compute(1, 64, 32, 16, 8, lhs, rhs, False)
    with pytest.raises(BufferSizeError):
        vk.compute(17, 64, 32, 16, 64, lhs, rhs, False)
    with pytest.raises(BufferSizeError):
        vk.compute(1, 65, 32, 16, 64, lhs, rhs, False)
    with pytest.raises(DTypeError):
        vk.compute(1, 64, 32, 16, 64, lhs.view(np.int8), rhs, False)
    with pytest.raises(DTypeError):
        vk.compute(1, 64, 32, 16, 64, lhs, rhs.reshape(2, -1), False)


# --------------------------------------------------------------------------------------------- LHS pack


def quantize_model(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """§4.3 quantization in numpy: int8 [m, k] and fp16 scale bits [m, k/32]."""
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    scale = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0).astype(np.float32)
    q = round_away((blocks * inv[..., None]).astype(np.float32)).astype(np.int8)
    with np.errstate(over="ignore"):  # scales past 65504 are stored as fp16 infinity
        return q.reshape(m, k), f32_to_f16_bits(scale)


def lhs_rows(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = rng.normal(size=(m, k)) * rng.choice([1e-30, 1e-6, 1e-3, 1.0, 1e3, 1e6, 1e9], size=(m, 1))
    x = x.astype(np.float32)
    x[0, :32] = 0.0  # zero block: scale 0, inv 0
    if k >= 64:
        x[-1, 32:64] = np.float32(127.0)
        x[-1, 33] = np.float32(-63.5)  # an exact .5 tie: rounds away from zero
        x[-1, 34] = np.float32(0.5)
    return x


@pytest.mark.parametrize("isa", ISAS, ids=str)
def test_lhs_pack_matches_model(isa: vnni.Isa) -> None:
    rng = np.random.default_rng(3)
    for m, k, mr, offset in ((1, 64, 1, 0), (3, 96, 4, 1), (17, 160, 16, 0), (5, 320, 8, 6), (70, 64, 64, 0)):
        x = lhs_rows(rng, m, k)
        q, s_bits = quantize_model(x)
        q_all = np.zeros((offset + m, k), np.int8)
        s_all = np.zeros((offset + m, k // 32), np.uint16)
        q_all[offset:], s_all[offset:] = q, s_bits
        want = pack_lhs(q_all, s_all, mr)
        assert np.array_equal(vk_pack.lhs_quant_pack_qsi8d32p_f32_neon(x, mr, offset, isa), want), (m, k, mr, offset)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_lhs_pack_matches_family_packer() -> None:
    fam = pytest.importorskip("kleidipy.kernels.qsi8d32p_qsi4c32p.ukernels")
    packer = fam.LHS_QSI8D32P_F32_NEON
    rng = np.random.default_rng(5)
    for m, k, mr in ((1, 2048, 1), (19, 256, 16), (9, 96, 8)):
        x = lhs_rows(rng, m, k)
        for execution in ("reference", "jit"):
            want = np.asarray(packer.run(m, k, mr, 4, 2, x, bl=32, execution=execution))
            for isa in ISAS:
                got = vk_pack.lhs_quant_pack_qsi8d32p_f32_neon(x, mr, 0, isa)
                assert np.array_equal(got, want), (m, k, mr, execution)


def test_lhs_pack_tiny_blocks_take_the_packers_bytes() -> None:
    """Blocks whose amax is below ~4e-37 (1/scale overflows): the vectorised packer hands those rows to the
    portable one, so the packed bytes are the family packer's at every input the runtime can give it."""
    from kleidipy.kernels.qsi8d32p_qsi4c32p import jit

    rng = np.random.default_rng(9)
    m, k, mr = 6, 128, 4
    x = rng.normal(size=(m, k)).astype(np.float32)
    x[1, 32:64] *= np.float32(1e-38)  # 1/scale overflows
    x[3, :32] = np.float32(1e-44)  # subnormal
    x[3, 96:] *= np.float32(1e-30)  # tiny but 1/scale finite
    x[4, 64:96] = 0.0
    for offset in (0, 3):
        want = jit.lhs_quant_pack_qsi8d32p(x, mr, 4, offset, jit.LHS_QSI8D32P_NEON, False)
        for isa in ISAS:
            assert np.array_equal(vk_pack.lhs_quant_pack_qsi8d32p_f32_neon(x, mr, offset, isa), want), (offset, isa)


@pytest.mark.parametrize(("layout", "kbl"), [(0, 4), (0, 8), (1, 4)], ids=["neon-kbl4", "neon-kbl8", "sme"])
@pytest.mark.parametrize("ties_even", [False, True], ids=["away", "even"])
def test_every_lhs_packer_is_the_portable_one(layout: int, kbl: int, ties_even: bool) -> None:
    """The vectorised packer in each layout (``jit.LHS_QSI8D32P`` 0 with chunks of 4 or 8, the SME layout 1) and
    rounding (roundf, or ties to even as the 4x8sb packer): the portable packer's bytes, exact ties and tiny blocks
    included, at any row offset."""
    from kleidipy.kernels.qsi8d32p_qsi4c32p import jit

    rng = np.random.default_rng(layout * 10 + kbl + ties_even)
    for m, k, mr, offset in ((1, 32, 1, 0), (5, 96, 4, 3), (19, 160, 16, 7), (9, 64, 8, 0)):
        x = (rng.normal(size=(m, k)) * 10.0 ** rng.integers(-3, 4, size=(m, 1))).astype(np.float32)
        x[rng.random((m, k)) < 0.05] = np.float32(0.5)  # exact ties where amax = 127 · 0.5 / 0.5 ...
        x[0, :32] = 0.0
        x[-1, -32:] *= np.float32(1e-39)  # 1/scale overflows: the portable packer's row
        want = jit.lhs_quant_pack_qsi8d32p(x, mr, kbl, offset, layout, ties_even)
        for isa in ISAS:
            got = vk_pack.lhs_quant_pack_qsi8d32p(x, mr, kbl, offset, layout, ties_even, isa)
            assert np.array_equal(got, want), (m, k, mr, offset, isa)


@pytest.mark.parametrize("ties_even", [False, True], ids=["away", "even"])
def test_lhs_pack_rounds_every_half_as_the_portable_packer(ties_even: bool) -> None:
    """Blocks whose amax is 127 (scale 1: the values are what is rounded) holding k + 1/2 and the floats either side
    of it for every k < 127, both signs: the vectorised rounding (roundf as trunc(y + copysign(0.49999997, y))) is
    the portable packer's at each."""
    from kleidipy.kernels.qsi8d32p_qsi4c32p import jit

    halves = np.arange(127, dtype=np.float32) + np.float32(0.5)
    values = np.concatenate([np.nextafter(halves, np.float32(0)), halves, np.nextafter(halves, np.float32(200))])
    values = np.concatenate([values, -values, np.zeros(13)]).astype(np.float32)
    blocks = values.reshape(-1, 31)  # (775 values: 25 blocks of 31, each with 127 first)
    x = np.concatenate([np.full((blocks.shape[0], 1), np.float32(127.0)), blocks], axis=1).reshape(1, -1)
    for layout, kbl in ((jit.LHS_QSI8D32P_NEON, 4), (jit.LHS_QSI8D32P, 8)):
        want = jit.lhs_quant_pack_qsi8d32p(x, 1, kbl, 0, layout, ties_even)
        for isa in ISAS:
            assert np.array_equal(vk_pack.lhs_quant_pack_qsi8d32p(x, 1, kbl, 0, layout, ties_even, isa), want)


def test_lhs_pack_golden(golden_dir) -> None:  # noqa: ANN001
    gold, runs = _golden_runs(golden_dir)
    for case, run in runs:
        x = gold.array(case["inputs"]["lhs_f32"]).reshape(case["m"], case["k"])
        want = gold.array(run["files"]["lhs_packed"])
        for isa in ISAS:
            got = vk_pack.lhs_quant_pack_qsi8d32p_f32_neon(x, run["params"]["mr"], 0, isa)
            assert np.array_equal(got, want), (run["dir"], run["variant"], isa)


# --------------------------------------------------------------------------------------------- vnni helpers


def test_host_isa_and_dpbusd_loop() -> None:
    assert vnni.HOST_ISA is (vnni.VNNI512 if vnni.HAS_AVX512_VNNI else vnni.PORTABLE)
    for isa in ISAS:  # the measurement loop runs and both ISAs compute the same checksum
        assert vnni.dpbusd_loop(isa, 3) == vnni.dpbusd_loop(vnni.PORTABLE, 3)


# --------------------------------------------------------------------------------------------- NEON layout

#: (mr, kr, sr) of the family's NEON kernels (dotprod / i8mm GEMMs, dotprod GEMVs)
NEON_GEOMETRIES = ((4, 16, 2), (4, 8, 2), (1, 16, 2), (1, 8, 2))
NEON_RHS_PACKER = "kai_run_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0"


def pack_lhs_neon(q: np.ndarray, s_bits: np.ndarray, mr: int, kbl: int) -> np.ndarray:
    """``lhs_quant_pack_qsi8d32p_f32``'s layout from int8 q [m, k] and fp16 bits [m, k/32]: per group of mr rows
    and block, mr fp16 scales, then the int8 in chunks of kbl values per row; padding rows 0."""
    m, k = q.shape
    nb, groups = k // 32, -(-m // mr)
    qq, ss = padded(q, mr, np.int8), padded(s_bits, mr, np.uint16)
    data = qq.reshape(groups, mr, nb, 32 // kbl, kbl).transpose(0, 2, 3, 1, 4).reshape(groups, nb, 32 * mr)
    sc = le_bytes(ss.reshape(groups, mr, nb).transpose(0, 2, 1))  # [groups, nb, 2mr]
    return np.concatenate([sc, data.view(np.uint8)], axis=2).reshape(-1)


def pack_rhs_neon(u: np.ndarray, d_bits: np.ndarray, kr: int) -> np.ndarray:
    """The NEON RHS layout (nr = 4) by the family's packer, from codes u [n, k] and fp16 bits [n, k/32]."""
    from kleidipy.kernels.catalogue import get_packer

    n, k = u.shape
    blocks = np.zeros((n, k // 32, 18), np.uint8)
    blocks[:, :, :2] = le_bytes(d_bits).reshape(n, k // 32, 2)
    ub = u.reshape(n, k // 32, 32)
    blocks[:, :, 2:] = ub[:, :, :16] | ub[:, :, 16:] << 4
    return np.asarray(get_packer(NEON_RHS_PACKER).run(n, k, 4, kr, 2, blocks.reshape(-1), bl=32))


def check_neon(rng: np.random.Generator, m: int, n: int, k: int, geometry: tuple[int, int, int]) -> None:
    mr, kr, sr = geometry
    q, s_bits, u, d_bits = operands(rng, m, n, k)
    lhs, rhs = pack_lhs_neon(q, s_bits, mr, kr // sr), pack_rhs_neon(u, d_bits, kr)
    want = model(q, s_bits, u, d_bits, False)
    for isa in ISAS:
        got = vn.compute_neon(m, n, k, mr, 4, kr, sr, lhs, rhs, isa)
        assert bits_equal(got, want), (m, n, k, geometry, isa)


@pytest.mark.parametrize("geometry", NEON_GEOMETRIES, ids=str)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 32), (1, 64, 64), (2, 70, 96), (5, 130, 128), (9, 64, 32)])
def test_neon_matches_model(geometry: tuple[int, int, int], m: int, n: int, k: int) -> None:
    """The NEON-layout tiles (the GEMV straight from the packed RHS, more rows from a decoded panel): the §5.2
    recipe from +0, bit for bit, at partial groups, panels and row tiles."""
    check_neon(np.random.default_rng(m * 1000 + n + k), m, n, k, geometry)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 12),
    n=st.integers(1, 200),
    nb=st.integers(1, 9),
    geometry=st.sampled_from(NEON_GEOMETRIES),
    seed=st.integers(0, 2**31),
)
def test_neon_random_shapes(m: int, n: int, nb: int, geometry: tuple[int, int, int], seed: int) -> None:
    check_neon(np.random.default_rng(seed), m, n, 32 * nb, geometry)


def test_neon_matches_portable_jit_and_golden(golden_dir) -> None:  # noqa: ANN001
    """Every NEON Q4_0 golden run (KleidiAI's own dst) and the portable jit loops on the same bytes."""
    from kleidipy.kernels.qsi8d32p_qsi4c32p import jit
    from kleidipy.tools.golden import _clamp_values

    gold, runs = _golden_runs(golden_dir, NEON_RHS_PACKER)
    assert len(runs) >= 10
    for case, run in runs:
        m, n, k, p, lhs, rhs, want = _golden_operands(gold, case, run)
        portable = jit.matmul_qsi8d32p_qsi4c32pscalef16(m, n, k, p["mr"], p["nr"], p["kr"], p["sr"], lhs, rhs)
        lo, hi = _clamp_values(p)
        for isa in ISAS:
            got = vn.compute_neon(m, n, k, p["mr"], p["nr"], p["kr"], p["sr"], lhs, rhs, isa)
            assert bits_equal(got, portable), (run["dir"], run["variant"], isa)
            assert bits_equal(clamp_f32(got, lo, hi), want), (run["dir"], run["variant"], run.get("clamped"), isa)


def test_neon_bad_input() -> None:
    lhs, rhs = np.zeros(34 * 4, np.uint8), np.zeros(4 * 18, np.uint8)
    with pytest.raises(KernelShapeError):
        vn.compute_neon(1, 4, 48, 4, 4, 16, 2, lhs, rhs)
    with pytest.raises(KernelShapeError):
        vn.compute_neon(1, 4, 32, 4, 8, 16, 2, lhs, rhs)
    with pytest.raises(KernelShapeError):
        vn.compute_neon(1, 4, 32, 4, 4, 4, 1, lhs, rhs)
    with pytest.raises(BufferSizeError):
        vn.compute_neon(5, 4, 32, 4, 4, 16, 2, lhs, rhs)
    with pytest.raises(BufferSizeError):
        vn.compute_neon(1, 5, 32, 4, 4, 16, 2, lhs, rhs)
    with pytest.raises(DTypeError):
        vn.compute_neon(1, 4, 32, 4, 4, 16, 2, lhs.view(np.int8), rhs)
