"""llama.cpp's SME/NEON hybrid (``sme_threads=N``, ``--sme-threads N``): which kernel computes which columns of a
MUL_MAT (against a numpy oracle made of the two kernels' own outputs), the compiled plan bit for bit with the op-by-op
path at the same thread count, today's bits when N covers every thread, and the bad values refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from tiny_models import write_model

from kleidipy import formats
from kleidipy.cli import main
from kleidipy.errors import TargetError
from kleidipy.graph.execute import compile_model
from kleidipy.observer import KernelCall, Observer
from kleidipy.runtime.backend import KleidiBackend
from kleidipy.runtime.layers import CausalLM
from kleidipy.runtime.model_file import ModelFile
from kleidipy.target import fallback_kernels, parse_target, select_kernels

HYBRID = "sme2:svl=512,sme_threads=1"


def _linear(ggml_type: T, n: int, k: int, threads: int, spec: str = HYBRID):
    values = np.random.default_rng(3).standard_normal((n, k)).astype(np.float32)
    backend = KleidiBackend(parse_target(spec), threads=threads, min_split_macs=0, notice=lambda msg: None)
    return backend("w", ggml_type, (k, n), formats.quantize(values, ggml_type))


def test_the_neon_pair_is_the_i8mm_targets() -> None:
    """llama.cpp's kernel chain: behind SME2 the selection for the CPU's features without SME (I8MM + DotProd)."""
    target = parse_target(HYBRID)
    for wtype in ("q4_0", "q8_0"):
        fallback, i8mm = fallback_kernels(wtype, target), select_kernels(wtype, parse_target("i8mm"))
        assert (fallback.gemm.name, fallback.gemv.name) == (i8mm.gemm.name, i8mm.gemv.name)
    assert fallback_kernels("f16", target) is None  # (llama.cpp chains no NEON kernel behind the F16 one)
    assert fallback_kernels("q4_0", parse_target("sme2:svl=512")) is None


@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0])
@pytest.mark.parametrize("m", [1, 5, 127, 128, 130])
def test_columns_come_from_the_kernel_llama_cpp_gives_them(ggml_type: T, m: int) -> None:
    """n = 302 (no multiple of either kernel's step) on 2 threads, SME on 1: under 128 rows every column from the
    NEON kernel; from 128 rows, chunks of align_up(ceil(302 / 2), lcm(64, 4)) = 192 columns, chunk 0 (thread 0: SME)
    [0, 192), chunk 1 (thread 1: NEON) [192, 302)."""
    n, k = 302, 64
    lin = _linear(ggml_type, n, k, threads=2)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    run = (lambda pair: pair.gemv) if m == 1 else (lambda pair: pair.gemm)
    sme = run(lin.pair).run(m, n, k, run(lin.pair).pack_lhs(x), lin.packed)
    neon = run(lin.fallback.pair).run(m, n, k, run(lin.fallback.pair).pack_lhs(x), lin.fallback.packed)
    cols = 192 if m >= 128 else 0
    want = np.concatenate([sme[:, :cols], neon[:, cols:]], axis=1)
    np.testing.assert_array_equal(lin(x).view(np.uint32), want.view(np.uint32))
    assert lin.sme_columns(m, 2) == cols
    if ggml_type == T.Q4_0 and m > 1:  # (the oracle tells the GEMMs apart: F16 LHS and int8 LHS round apart)
        assert not np.array_equal(sme.view(np.uint32), neon.view(np.uint32))


@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0])
def test_sme_on_every_thread_gives_todays_bits(ggml_type: T) -> None:
    """N >= the thread count: the SME kernels alone, as without the option."""
    x = np.random.default_rng(0).standard_normal((130, 64)).astype(np.float32)
    today = _linear(ggml_type, 302, 64, threads=2, spec="sme2:svl=512")(x)
    for spec in ("sme2:svl=512,sme_threads=2", "sme2:svl=512,sme_threads=3"):
        got = _linear(ggml_type, 302, 64, threads=2, spec=spec)(x)
        np.testing.assert_array_equal(got.view(np.uint32), today.view(np.uint32))


def _build(path: Path, spec: str, threads: int, observers: list[Observer] | None = None) -> CausalLM:
    model = ModelFile(path)
    backend = KleidiBackend(parse_target(spec), threads=threads, notice=lambda msg: None, observers=observers or [])
    return model.arch.build(model, linear=backend, n_ctx=192, n_ubatch=512)


def _run(lm: CausalLM, prompt: np.ndarray) -> list[np.ndarray]:
    """All logits of a prompt of more than 128 tokens (hybrid MUL_MATs), a short one (NEON only) and decode steps."""
    cache = lm.new_cache()
    out = [
        lm.forward(prompt, all_logits=True, cache=cache),
        lm.forward(prompt[:5], all_logits=True, cache=lm.new_cache()),
    ]
    return out + [lm.forward([t], cache=cache) for t in (17, 200, 256)]


@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0])
def test_the_plan_runs_the_hybrid_bit_for_bit(tmp_path: Path, ggml_type: T) -> None:
    """At 2 threads with SME on 1 the compiled plan gives the op-by-op path's bits (and, for Q4_0, other bits than
    SME on every thread: the hybrid ran)."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", ggml_type), HYBRID, threads=2)
    prompt = np.arange(1, 151, dtype=np.int64) % 260
    want = _run(lm, prompt)
    assert compile_model(lm, 2, adaptive=False)
    got = _run(lm, prompt)
    lm.compiled.close()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    if ggml_type == T.Q4_0:
        plain = _run(_build(write_model(tmp_path / "p.gguf", "llama", ggml_type), "sme2:svl=512", threads=2), prompt)
        assert not np.array_equal(plain[0].view(np.uint32), want[0].view(np.uint32))


def test_a_trace_names_both_kernels(tmp_path: Path) -> None:
    """The hybrid MUL_MATs are told as one call per kernel, op by op and in the plan: the SME2 GEMM on its columns,
    the I8MM GEMM on the others."""
    calls: list[KernelCall] = []

    class Calls(Observer):
        wants_matmuls = True

        def on_matmul(self, call: KernelCall) -> None:
            calls.append(call)

    observers: list[Observer] = [Calls()]
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), HYBRID, 2, observers)
    prompt = np.arange(1, 151, dtype=np.int64) % 260
    lm.forward(prompt, all_logits=True, cache=lm.new_cache())
    eager = {(c.weight, c.kernel.name, c.n) for c in calls}
    calls.clear()
    observers.clear()
    assert compile_model(lm, 2, adaptive=False)
    lm.observers.append(Calls())
    lm.forward(prompt, all_logits=True, cache=lm.new_cache())
    lm.compiled.close()
    assert {(c.weight, c.kernel.name, c.n) for c in calls} == eager
    names = {c.kernel.name for c in calls}
    assert "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa" in names
    assert "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm" in names


@pytest.mark.parametrize(
    "spec", ["sme2:sme_threads=-1", "sme2:sme_threads=x", "sme2:sme_threads=0", "i8mm:sme_threads=1"]
)
def test_bad_sme_threads_are_refused(spec: str) -> None:
    with pytest.raises(TargetError):
        parse_target(spec)


@pytest.mark.parametrize(
    "args", [["--sme-threads", "-1"], ["--sme-threads", "1.5"], ["--target", "i8mm", "--sme-threads", "1"]]
)
def test_bad_sme_threads_are_one_line_cli_errors(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-m", "nowhere.gguf", *args, "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kleidipy: error: sme_threads=")


def test_the_plans_clock_books_a_decoded_token_to_the_neon_gemv(tmp_path: Path) -> None:
    """The server's Inside view (the plan's clock): with SME on fewer threads than the plan's, a row alone runs the
    NEON GEMV, and the clock says so."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), HYBRID, threads=2)
    assert compile_model(lm, 2, adaptive=False)
    clock = lm.compiled.start_clock()
    cache = lm.new_cache()
    lm.forward([1, 2, 3], cache=cache)
    lm.forward([4], cache=cache)
    lm.compiled.close()
    _, calls, _ = clock.take()
    names = {group.name for group, count in zip(clock.groups, calls, strict=True) if count}
    assert "kai_run_matmul_clamp_f32_qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod" in names
    assert "kai_run_matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot" not in names
