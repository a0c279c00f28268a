"""llama.cpp's SME2 F32 kernels — the f32p_f32p MOPA GEMM and the f32_f32p MLA GEMV on one packing of the weights:
their golden sets (real KleidiAI v1.24.0) in every execution at SVL 128/256/512, random shapes with tails against the
reference in every execution, the packers, the bias start (+0 + bias for the MOPA) and the thread split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import bits_equal, exact_fma, mixed_f32, verify_family
from paths import F32_SME2_GOLDEN, F32P_GOLDEN

from kleidipy.core import native
from kleidipy.core.numerics import FLT_MAX
from kleidipy.errors import BufferSizeError, KernelShapeError
from kleidipy.kernels.catalogue import get_kernel, get_packer
from kleidipy.kernels.f32p_f32p import sme2
from kleidipy.kernels.f32p_f32p import ukernels as fam
from kleidipy.kernels.pack import f32p

GEMM = "matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa"
GEMV = "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla"
EXECUTIONS = ("reference", "jit", "isa")
SVLS = (128, 256, 512)
PROPERTY = settings(max_examples=12, deadline=None)


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_golden_runs_bit_exact(execution: str) -> None:
    """All 36 GEMM runs (6 shapes with tails in m, n and k × 3 SVLs × unclamped/clamped) and the GEMV's 18 (its 3
    m = 1 shapes), none skipped."""
    for golden, family, runs in ((F32P_GOLDEN, "f32p_f32p", 36), (F32_SME2_GOLDEN, "f32_f32p", 18)):
        count, failures = verify_family(golden, family, execution)
        assert count == runs
        assert not failures, "\n".join(failures)


def problem(seed: int, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LHS [m, k], weights N x K and biases of wide magnitudes (±0 and subnormals among them)."""
    rng = np.random.default_rng(seed)
    return (
        mixed_f32(rng, (m, k), 2.0**-20, 2.0**8),
        mixed_f32(rng, (n, k), 2.0**-20, 2.0**4),
        mixed_f32(rng, n, 1e-3, 4),
    )


def run(name: str, svl: int, m: int, n: int, k: int, lhs, rhs, bias, execution: str, threads: int = 1, clamp=None):
    kern = get_kernel(name, svl)
    packed = kern.pack_rhs(n, k, rhs, bias=bias, execution=execution)
    packed_lhs = kern.pack_lhs(lhs, execution=execution) if kern.lhs_packer else lhs
    lo, hi = clamp or (-FLT_MAX, FLT_MAX)
    return kern.run(m, n, k, packed_lhs, packed, None, None, lo, hi, execution=execution, threads=threads,
                    min_split_macs=0)  # fmt: skip


def fma_model(lhs: np.ndarray, rhs: np.ndarray, bias: np.ndarray, from_zero: bool) -> np.ndarray:
    """acc = bias (+0 for the MOPA), then acc = fma(lhs, rhs, acc) per k in order: exact rationals, one rounding a
    step."""
    out = np.empty((lhs.shape[0], rhs.shape[0]), np.float32)
    for i in range(lhs.shape[0]):
        for j in range(rhs.shape[0]):
            acc = np.float32(bias[j]) + np.float32(0) if from_zero else bias[j]
            for kk in range(lhs.shape[1]):
                acc = exact_fma(lhs[i, kk], rhs[j, kk], acc)
            out[i, j] = acc
    return out


@given(st.integers(0, 2**32 - 1), st.integers(1, 70), st.integers(1, 80), st.integers(1, 23), st.sampled_from(SVLS))
@PROPERTY
def test_gemm_executions_equal_reference_on_tails(seed: int, m: int, n: int, k: int, svl: int) -> None:
    lhs, rhs, bias = problem(seed, m, n, k)
    want = run(GEMM, svl, m, n, k, lhs, rhs, bias, "reference")
    for execution in ("jit", "isa"):
        assert bits_equal(run(GEMM, svl, m, n, k, lhs, rhs, bias, execution), want), execution
    assert bits_equal(run(GEMM, svl, m, n, k, lhs, rhs, bias, "jit", threads=2), want)


@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.integers(1, 23), st.sampled_from(SVLS))
@PROPERTY
def test_gemv_executions_equal_reference_and_the_gemm_row(seed: int, n: int, k: int, svl: int) -> None:
    """Every width of the GEMV's column chunks (1 to 4 groups of 4·VL) and K tails; a row of it is the GEMM's."""
    lhs, rhs, bias = problem(seed, 1, n, k)
    bias[bias == 0] = 1.0  # (a −0 bias starts the MOPA at +0: its one difference, test_negative_zero_bias)
    want = run(GEMV, svl, 1, n, k, lhs, rhs, bias, "reference")
    for execution in ("jit", "isa"):
        assert bits_equal(run(GEMV, svl, 1, n, k, lhs, rhs, bias, execution), want), execution
    assert bits_equal(run(GEMV, svl, 1, n, k, lhs, rhs, bias, "jit", threads=2), want)
    assert bits_equal(run(GEMM, svl, 1, n, k, lhs, rhs, bias, "jit"), want)


@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 9), st.integers(1, 9))
@settings(max_examples=10, deadline=None)
def test_reference_is_the_exact_fma_chain(seed: int, m: int, n: int, k: int) -> None:
    lhs, rhs, bias = problem(seed, m, n, k)
    assert bits_equal(run(GEMM, 256, m, n, k, lhs, rhs, bias, "reference"), fma_model(lhs, rhs, bias, True))
    assert bits_equal(run(GEMV, 256, 1, n, k, lhs[:1], rhs, bias, "reference"), fma_model(lhs[:1], rhs, bias, False))


def test_negative_zero_bias() -> None:
    """With a −0 bias and −0 products the MOPA (ZA zeroed, then 1.0 × bias) ends at +0, the GEMV (ZA loaded with the
    bias) at −0; llama.cpp's biases are +0, where they agree."""
    lhs, rhs, bias = np.zeros((1, 3), np.float32), -np.ones((2, 3), np.float32), np.float32([-0.0, 0.0])
    gemm = run(GEMM, 512, 1, 2, 3, lhs, rhs, bias, "isa")
    gemv = run(GEMV, 512, 1, 2, 3, lhs, rhs, bias, "isa")
    assert np.signbit(gemv).tolist() == [[True, False]] and np.signbit(gemm).tolist() == [[False, False]]


def test_packers_layouts_and_sharing() -> None:
    """One RHS packer (the GEMM's nr, kr, sr are the GEMV's) in both families; the LHS packer transposes groups of
    mr rows (padding rows 0) and reads back; the weights go as stored, N x K, with zero biases."""
    gemm, gemv = get_kernel(GEMM, 256), get_kernel(GEMV, 256)
    assert gemm.rhs_packer is gemv.rhs_packer is get_packer(f32p.RHS_F32P2VLX1BIASF32_SME.name)
    assert (gemm.nr, gemm.kr, gemm.sr) == (gemv.nr, gemv.kr, gemv.sr) == (16, 1, 1) and gemv.n_step == 128
    assert (gemm.mr, gemm.m_step, gemv.m_step) == (16, 16, 1)
    lhs = np.arange(3 * 5, dtype=np.float32).reshape(3, 5) + 1
    for execution in ("reference", "jit"):
        packed = np.asarray(gemm.pack_lhs(lhs, execution=execution)).view(np.float32).reshape(5, 16)
        assert np.array_equal(packed[:, :3], lhs.T) and not packed[:, 3:].any()
        assert np.array_equal(fam.LHS_F32P2VLX1_F32_SME.unpack(np.asarray(packed).view(np.uint8), 3, 5, 16), lhs)
    rhs, kw = f32p.from_ggml(None, np.ones((3, 5), np.float32), 3, 5, gemm.rhs_packer)
    assert rhs.shape == (3, 5) and not kw["bias"].any()


def test_bad_inputs_are_typed_errors() -> None:
    packer = f32p.RHS_F32P2VLX1BIASF32_SME
    with pytest.raises(KernelShapeError):
        packer.run(4, 3, 12, 1, 1, np.ones((4, 3), np.float32))  # nr = 2·VL
    with pytest.raises(BufferSizeError):
        packer.run(4, 3, 16, 1, 1, np.ones(5, np.float32))
    with pytest.raises(KernelShapeError):
        fam.LHS_F32P2VLX1_F32_SME.run(3, 5, 16, 1, 1, np.ones((3, 5), np.float32), m_idx_start=1)
    with pytest.raises(KernelShapeError):
        get_kernel(GEMV, 512).run(
            2, 4, 3, np.ones(6, np.float32), packer.run(4, 3, 32, 1, 1, np.ones((4, 3), np.float32))
        )


def test_native_tile_is_kleidiais_fmopa_sequence() -> None:
    """The SME2 tile (``kernels/f32p_f32p/sme2.py``, cross-compiled on any host; run under QEMU by
    ``../test_sme2_tiles_under_qemu.py``): eight float32 ``fmopa`` into ZA0.S-ZA3.S — four of 1.0 by the biases, four
    per k — as KleidiAI's kernel, and no other arithmetic."""
    text = native.assembly(sme2.tile_module(sme2.MOPA), native.ISAS["aarch64-sme2"])
    ops = [line.split(None, 1) for line in text.splitlines() if line.startswith("\t") and not line.startswith("\t.")]
    fmopa = [args for op, *args in ops if op == "fmopa"]
    assert len(fmopa) == 8 and all(".s" in a[0] and "za" in a[0] for a in fmopa)
    assert not {"fmla", "fadd", "fmul", "fmad"} & {op for op, *_ in ops}
    assert not sme2.AVAILABLE or sme2.HOST_ISA.name == "aarch64-sme2"
