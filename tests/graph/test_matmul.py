"""The compiled MUL_MAT routines against the prepared matmul the runtime calls, bit for bit: every kernel pair the
targets select (GEMM and GEMV), the LHS pack and the thread split (columns, or rows) at 1, 2 and 3 threads;
NaN/Inf activations; executions the compiled plan does not run."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from kleidipy import formats
from kleidipy.core.matmul import PreparedMatmul
from kleidipy.core.node import P_MR, P_N_STEP, NodeKernel
from kleidipy.graph import matmul as mm
from kleidipy.graph.workers import Workers
from kleidipy.kernels.catalogue import all_kernels, family_of, get_kernel
from kleidipy.runtime.backend import KleidiBackend, RepackedLinear
from kleidipy.target import parse_target

TARGETS = ["sme2:svl=512", "sme2:svl=256", "sme", "i8mm", "dotprod"]
TYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.F16]
#: n is not a multiple of any nr and leaves thread 2 of 3 without columns where n_step = 64
N, K = 200, 64
ROWS = (1, 2, 5, 17, 40)


def _linear(target: str, ggml_type: T, execution: str = "jit", seed: int = 0, n: int = N) -> RepackedLinear:
    w = np.random.default_rng(seed).standard_normal((n, K)).astype(np.float32)
    backend = KleidiBackend(parse_target(target), execution=execution, notice=lambda msg: None)
    return backend("w", ggml_type, (K, n), formats.quantize(w, ggml_type))


def _activations(m: int, seed: int) -> np.ndarray:
    """m rows of activations in a buffer of m + 3 rows whose extra rows are NaN (they must not be read)."""
    x = np.full((m + 3, K), np.nan, np.float32)
    x[:m] = np.random.default_rng(seed).standard_normal((m, K)).astype(np.float32) * 3
    return x


def _pack(nk: NodeKernel, x: np.ndarray, m: int, nth: int) -> tuple[np.ndarray, list[bool]]:
    """The packed LHS every thread's share writes (in a buffer of garbage), and what each returned."""
    buf = np.full(nk.lhs_bytes(m) + 5, 0xAB, np.uint8)
    return buf, [mm.pack_lhs(nk.params, x, m, buf, ith, nth) for ith in range(nth)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ggml_type", TYPES)
def test_pack_and_matmul_match_prepared_bit_for_bit(target, ggml_type):
    lin = _linear(target, ggml_type)
    for m in ROWS:
        prepared: PreparedMatmul = lin.gemv if m == 1 else lin.gemm
        nk = mm.node_kernel(prepared)
        x = _activations(m, seed=m)
        want_lhs = np.asarray(prepared.pack(x[:m])).view(np.uint8)
        want = prepared(x[:m])
        assert nk.lhs_bytes(m) == want_lhs.size
        for nth in (1, 2, 3):
            lhs, finite = _pack(nk, x, m, nth)
            assert all(finite)
            assert np.array_equal(lhs[: want_lhs.size], want_lhs), (prepared.kernel.name, m, nth)
            assert (lhs[want_lhs.size :] == 0xAB).all()
            out = np.full((m + 2, N), np.nan, np.float32)
            for ith in range(nth):
                mm.matmul(nk.params, m, N, lhs, prepared.rhs, out, ith, nth)
            assert np.array_equal(out[:m].view(np.uint32), want.view(np.uint32)), (prepared.kernel.name, m, nth)
            assert np.isnan(out[m:]).all()  # rows past m untouched


@pytest.mark.parametrize("target", ["sme2:svl=512", "i8mm"])
@pytest.mark.parametrize("ggml_type", TYPES)
def test_mul_mat_node_on_workers(target: str, ggml_type: T) -> None:
    """The whole node (each thread's share of the pack, a barrier, its share of the matmul) on 1-3 persistent
    workers: the bits of the prepared matmul, and False on every thread for a NaN input (in any thread's share)."""
    lin = _linear(target, ggml_type)
    for m in (1, 5):
        prepared = lin.gemv if m == 1 else lin.gemm
        nk = mm.node_kernel(prepared)
        x = _activations(m, seed=m)
        want = prepared(x[:m])
        for nth in (1, 2, 3):
            with Workers(nth) as workers:
                lhs = np.full(nk.lhs_bytes(m), 0xAB, np.uint8)
                out, status, prof = (
                    np.full((m, N), np.nan, np.float32),
                    np.zeros(1, np.int64),
                    np.zeros((0, 0, 3), np.int64),
                )
                args = (nk.params, x, m, lhs, prepared.rhs, out, N, status, prof, 0)
                assert workers.run(mm.mul_mat, args)
                assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (prepared.kernel.name, m, nth)
                bad = x.copy()
                bad[m - 1, 3] = np.nan
                assert not workers.run(mm.mul_mat, (nk.params, bad, *args[2:]))
                assert status[0] == 1


@pytest.mark.parametrize(
    ("m", "n", "mr", "n_step"),
    [(1, 576, 1, 64), (64, 192, 16, 64), (500, 576, 16, 64), (33, 200, 4, 8), (7, 64, 16, 64), (512, 1536, 16, 64)],
)
def test_split_covers_every_output_once(m: int, n: int, mr: int, n_step: int) -> None:
    """Every thread's block (columns in n_step chunks, or whole mr-row groups when those split better) tiles the
    m x n output exactly once, at 1..4 threads; each block's rows start on an mr-row group."""
    for nth in range(1, 5):
        seen = np.zeros((m, n), np.int64)
        for ith in range(nth):
            r0, r1, n0, n1 = mm.split(m, n, mr, n_step, ith, nth)
            assert r0 % mr == 0 and (n0 % n_step == 0 or n0 >= n)
            seen[r0:r1, n0:n1] += 1
        assert (seen == 1).all(), (m, n, nth)


@pytest.mark.parametrize("target", ["sme2:svl=512", "i8mm"])
@pytest.mark.parametrize("ggml_type", TYPES)
def test_row_split_matches_prepared_bit_for_bit(target: str, ggml_type: T) -> None:
    """A prefill (m = 64) whose columns make an odd count of n_step chunks (n = 192 = 3 x 64, 196 = 49 x 4,
    224 = 7 x 32): over 2 threads its rows split instead of its columns (for some n, every kernel), same bits."""
    m, rows_split = 64, False
    x = _activations(m, seed=7)
    for n in (192, 196, 224):
        lin = _linear(target, ggml_type, n=n)
        nk = mm.node_kernel(lin.gemm)
        want = lin.gemm(x[:m])
        for nth in (2, 3):
            blocks = [mm.split(m, n, nk.params[P_MR], nk.params[P_N_STEP], ith, nth) for ith in range(nth)]
            rows_split |= nth == 2 and all(blk[2:] == (0, n) for blk in blocks)
            lhs, _ = _pack(nk, x, m, nth)
            out = np.full((m, n), np.nan, np.float32)
            for ith in range(nth):
                mm.matmul(nk.params, m, n, lhs, lin.gemm.rhs, out, ith, nth)
            assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (lin.gemm.kernel.name, n, nth)
    assert rows_split


@pytest.mark.parametrize("target", ["sme2:svl=512,table=seeds", "sme2:svl=2048,table=seeds", "sme2:svl=512"])
def test_outputs_past_flt_max_are_clamped_where_they_are_stored(target: str) -> None:
    """Finite activations so large that outputs pass ±FLT_MAX: the matmuls that store into out themselves (the Q4_0
    SME2 layout on the host's tiles, the GEMV as the GEMMs) clamp there, whole panels and a last partial one (n =
    200), at 1-3 threads, the bits of the prepared matmul — master's F16-LHS GEMM too, whose LHS pack rounds such
    activations to ±inf (NaN outputs, the same NaNs)."""
    lin = _linear(target, T.Q4_0)
    for m in (1, 2, 17, 40):
        prepared = lin.gemv if m == 1 else lin.gemm
        nk = mm.node_kernel(prepared)
        x = _activations(m, seed=m)
        x[:m] *= np.float32(1e37)  # (|x| < 3.4e38 still: activations stay finite)
        want = prepared(x[:m])
        if m == 1 or "seeds" in target:  # (int8 activations; master's F16 LHS overflows to inf: NaN outputs)
            assert np.isin(want, [np.float32(-3.4028235e38), np.float32(3.4028235e38)]).any()  # (and NaN: inf - inf)
        for nth in (1, 2, 3):
            lhs, _ = _pack(nk, x, m, nth)
            out = np.full((m + 1, N), np.nan, np.float32)
            for ith in range(nth):
                mm.matmul(nk.params, m, N, lhs, prepared.rhs, out, ith, nth)
            assert np.array_equal(out[:m].view(np.uint32), want.view(np.uint32)), (m, nth)
            assert np.isnan(out[m:]).all()


@pytest.mark.parametrize(
    "name", [k.name for k in all_kernels() if k.family != "qai8dxp_qsi4cxp"], ids=lambda name: name[17:]
)
def test_every_kernel_of_the_families_the_runtime_uses(name):
    """Kernels the targets do not select too (SME1 tiers, other NEON tiles), SME ones at SVL 128 (nr = 16)."""
    kern = get_kernel(name).bind(128)
    w = np.random.default_rng(7).standard_normal((N, K)).astype(np.float32)
    rhs, kwargs = family_of(kern).from_float(w, kern.rhs_packer)
    prepared = kern.prepare(N, K, kern.pack_rhs(N, K, rhs, **kwargs))
    nk = mm.node_kernel(prepared)
    for m in (1,) if kern.kind == "gemv" else (3, 17):
        x = _activations(m, seed=m)
        want_lhs = np.asarray(prepared.pack(x[:m])).view(np.uint8)
        for nth in (1, 3):
            lhs, _ = _pack(nk, x, m, nth)
            assert np.array_equal(lhs[: want_lhs.size], want_lhs)
            out = np.empty((m, N), np.float32)
            for ith in range(nth):
                mm.matmul(nk.params, m, N, lhs, prepared.rhs, out, ith, nth)
            assert np.array_equal(out.view(np.uint32), prepared(x[:m]).view(np.uint32))


@pytest.mark.parametrize("ggml_type", TYPES)
def test_clamped_to_flt_max(ggml_type):
    """Activations large enough for ±inf sums come out as ±FLT_MAX, as the prepared matmul clamps them."""
    lin = _linear("i8mm", ggml_type)
    x = np.full((2, K), 3e38, np.float32)
    x[1] *= -1
    nk = mm.node_kernel(lin.gemm)
    lhs, _ = _pack(nk, x, 2, 1)
    out = np.empty((2, N), np.float32)
    mm.matmul(nk.params, 2, N, lhs, lin.gemm.rhs, out, 0, 1)
    assert np.array_equal(out.view(np.uint32), lin.gemm(x).view(np.uint32))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ggml_type", TYPES)
def test_nonfinite_activations_return_false(target, ggml_type):
    lin = _linear(target, ggml_type)
    for m, bad in ((1, np.nan), (17, np.inf), (40, -np.inf)):
        nk = mm.node_kernel(lin.gemv if m == 1 else lin.gemm)
        x = _activations(m, seed=3)
        x[m - 1, K // 2] = bad
        assert _pack(nk, x, m, 1)[1] == [False]
        finite = _pack(nk, x, m, 3)[1]
        assert finite[-1] is False and all(finite[:-1])  # the thread whose share holds row m - 1


@pytest.mark.parametrize("execution", ["reference", "isa"])
def test_other_executions_are_refused(execution):
    lin = _linear("sme2:svl=512", T.Q4_0, execution)
    with pytest.raises(mm.NotCompilableError, match="jit"):
        mm.node_kernel(lin.gemm)


def test_kernel_without_routine_is_refused():
    kern = get_kernel("matmul_clamp_f32_qai8dxp1x8_qsi4cxp4x8_1x4x32_neon_dotprod")
    prepared = kern.prepare(N, K, np.zeros(kern.rhs_packed_size(N, K), np.uint8))
    with pytest.raises(mm.NotCompilableError, match="no compiled routine"):
        mm.node_kernel(prepared)


def test_describing_a_node_compiles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's description (node_kernel, lhs_bytes, same_lhs: what plannable() does) compiles no routine: a first
    run that answers op by op must not pay for the plan's families; the parameters the plan reads do."""
    from kleidipy.core import node

    def refuse(py_func: object, signature: object) -> int:
        raise AssertionError(f"compiled {py_func}")

    monkeypatch.setattr(node, "cfunc_address", refuse)
    nk = mm.node_kernel(_linear("i8mm", T.Q4_1).gemm)
    assert nk.lhs_bytes(3) > 0 and mm.same_lhs(nk, nk)
    with pytest.raises(AssertionError, match="compiled"):
        _ = nk.params
