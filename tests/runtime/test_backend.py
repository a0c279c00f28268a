"""The backend: weights of every GGUF type repacked once for the target, MUL_MAT = GEMV at m == 1 else GEMM."""

from dataclasses import replace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf_writer import tiny_model
from kernel_helpers import MatmulRecorder

from kleidipy import formats
from kleidipy.errors import DTypeError, NonFiniteInputError, WeightsNotExactError
from kleidipy.kernels.catalogue import family_of
from kleidipy.runtime import backend
from kleidipy.runtime.architectures.llama import Llama
from kleidipy.runtime.backend import KleidiBackend, route
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.weights import FloatLinear
from kleidipy.target import parse_target
from kleidipy.tools.golden import GoldenSet

#: the seeds' table on SME2 (int8 LHS, as the golden sets and the float tolerance here; master's F16-LHS GEMM has
#: its own golden set, tests/kernels/f16p_qsi4c32p)
TARGETS = ["sme2:svl=512,table=seeds", "sme2:svl=128,table=seeds", "i8mm", "dotprod"]
TYPES = [T.Q4_0, T.Q8_0, T.Q4_1, T.F16, T.F32, T.Q5_0]


def _weight(tmp_path, ggml_type):
    g = ModelFile(tiny_model(tmp_path, types={"*": ggml_type}))
    return g, g.tensor("blk.0.ffn_up.weight")


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("ggml_type", TYPES)
def test_repacked_linear_matches_float_weights(tmp_path, spec, ggml_type):
    _, t = _weight(tmp_path, ggml_type)
    notices = []
    be = KleidiBackend(parse_target(spec), notice=notices.append)
    lin = be(t.name, t.ggml_type, t.shape, t.data)
    ref = FloatLinear.from_gguf(t.name, t.ggml_type, t.shape, t.data)
    x = np.random.default_rng(1).standard_normal((5, lin.k)).astype(np.float32)
    y = lin(x)
    tol = {T.F16: 2e-2, T.F32: 2e-2}.get(ggml_type, 6e-2)  # bf16 operands / 8-bit activations
    assert np.abs(y - ref(x)).max() <= tol * np.abs(ref(x)).max()
    assert np.array_equal(lin(x[2:3]), y[2:3]) or ggml_type in (T.F16, T.F32)  # GEMV == GEMM row for int kernels
    assert not notices  # (every type here has a kernel; Q5_0 the exact-weight family's)


@pytest.mark.parametrize("ggml_type", [T.Q5_0, T.Q6_K])
@pytest.mark.parametrize("spec", ["i8mm", "sme2:svl=512"])
def test_wider_types_multiply_the_files_weights(tmp_path, ggml_type, spec):
    """A type of 5 bits or more without a KleidiAI kernel goes to the exact-weight family, with or without
    --exact-weights: its packed weights read back as the file's values bit for bit, and no notice is given."""
    rng = np.random.default_rng(3)
    n, k = 64, 256
    raw = _random_blocks(rng, ggml_type, n, k)
    for exact_weights in (False, True):
        notices = []
        be = KleidiBackend(parse_target(spec), notice=notices.append, exact_weights=exact_weights)
        lin = be("w", ggml_type, (k, n), raw)
        assert lin.pair.weight_type == "qai8c16" and not notices
    got = family_of(lin.pair.gemm).get_rows(lin.pair.gemm, lin.packed, np.arange(n), n, k)
    assert np.array_equal(got.view(np.uint32), formats.dequantize(raw, ggml_type, n, k).view(np.uint32))
    x = rng.standard_normal((3, k)).astype(np.float32)
    ref = FloatLinear.from_gguf("w", ggml_type, (k, n), raw)(x)
    assert np.abs(lin(x) - ref).max() <= 3e-2 * np.abs(ref).max()


@pytest.mark.parametrize(
    ("ggml_type", "default", "exact"),
    [(T.Q8_0, "q8_0", "qai8c16"), (T.F16, "f16", "f32"), (T.F32, "f16", "f32"), (T.BF16, "f16", "f32")],
)
def test_exact_weights_routes(ggml_type, default, exact, monkeypatch):
    """Q8_0 takes llama.cpp-on-Arm's per-channel int8 unless exact weights are asked for (the backend's field,
    defaulting to KLEIDIPY_EXACT_WEIGHTS); floats then stay f32; BF16 is exact either way."""
    assert route(ggml_type) == default and route(ggml_type, exact_weights=True) == exact
    monkeypatch.setenv("KLEIDIPY_EXACT_WEIGHTS", "1")
    assert KleidiBackend(parse_target("i8mm")).exact_weights
    monkeypatch.setenv("KLEIDIPY_EXACT_WEIGHTS", "0")
    assert not KleidiBackend(parse_target("i8mm")).exact_weights


@pytest.mark.parametrize("exact_weights", [False, True])
def test_q8_0_and_bf16_weights_with_exact_weights(exact_weights):
    rng = np.random.default_rng(4)
    n, k = 24, 64
    values = rng.standard_normal((n, k)).astype(np.float32)
    be = KleidiBackend(parse_target("sme2:svl=512"), exact_weights=exact_weights)
    q8 = be("q", T.Q8_0, (k, n), formats.quantize(values, T.Q8_0))
    assert q8.pair.weight_type == ("qai8c16" if exact_weights else "q8_0")
    bf16 = gguf.quants.quantize(values, T.BF16)
    lin = be("b", T.BF16, (k, n), bf16)
    x = rng.standard_normal((2, k)).astype(np.float32)
    want = x @ formats.dequantize(bf16, T.BF16, n, k).T
    assert np.abs(lin(x) - want).max() <= 2e-2 * np.abs(want).max()


@pytest.mark.parametrize("spec", ["i8mm", "sme2:svl=512"])
@pytest.mark.parametrize("ggml_type", [T.F16, T.F32, T.BF16, T.Q8_0])
def test_exact_weights_multiply_the_files_values(spec, ggml_type):
    """Weight error 0 with --exact-weights for the types the default path rounds (Q8_0 per channel, F16/F32 to bf16
    on SME2): Q8_0's packed weights read back as the file's; a float weight times the identity is the file's matrix
    bit for bit (one exact product per output, whatever the kernel's layout)."""
    rng = np.random.default_rng(8)
    n, k = 40, 64
    raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), ggml_type)
    want = formats.dequantize(raw, ggml_type, n, k)
    lin = KleidiBackend(parse_target(spec), exact_weights=True)("w", ggml_type, (k, n), raw)
    if ggml_type == T.Q8_0:
        got = family_of(lin.pair.gemm).get_rows(lin.pair.gemm, lin.packed, np.arange(n), n, k)
    else:
        got = lin(np.eye(k, dtype=np.float32)).T
    assert np.array_equal(np.ascontiguousarray(got).view(np.uint32), want.view(np.uint32))


def test_narrow_types_requantized_with_a_notice():
    rng = np.random.default_rng(6)
    n, k = 8, 256
    raw = rng.integers(0, 256, (n, k // 256, 110), dtype=np.uint8)  # Q3_K, d (fp16 at the end) kept sane
    raw[..., 108:] = np.full((n, 1), 0.01, np.float16).view(np.uint8).reshape(n, 1, 2)
    notices = []
    lin = KleidiBackend(parse_target("i8mm"), notice=notices.append)("w", T.Q3_K, (k, n), raw)
    assert lin.pair.weight_type == "q4_0" and len(notices) == 1 and "Q3_K" in notices[0] and "Q4_0" in notices[0]


def test_load_check_reroutes_or_refuses_weights_that_are_not_the_files(monkeypatch):
    """The load-time check: a Q4_K weight the Q4_1 family would not hold exactly is packed by the exact-weight family
    (one notice); an exact-family weight that does not read back as the file's is a WeightsNotExactError."""
    rng = np.random.default_rng(7)
    n, k = 8, 256
    raw = _random_blocks(rng, T.Q6_K, n, k)
    q4_k = rng.integers(0, 256, (n, 1, 144), dtype=np.uint8)
    q4_k[..., :4] = np.full((n, 1, 2), 0.01, np.float16).view(np.uint8)
    spoil: dict[str, float] = {}  # family name -> the value its spoiled GET_ROWS reads back

    def family_spoiled(kernel):
        family = family_of(kernel)
        if kernel.family not in spoil:
            return family
        return replace(family, get_rows=lambda *a, **kw: np.full((a[2].size, k), spoil[kernel.family], np.float32))

    monkeypatch.setattr(backend, "family_of", family_spoiled)
    spoil["qsi8d32p_qai4c32p"] = np.nan
    notices = []
    lin = KleidiBackend(parse_target("i8mm"), notice=notices.append)("w", T.Q4_K, (k, n), q4_k)
    assert lin.pair.weight_type == "qai8c16" and len(notices) == 1 and "not exact" in notices[0]
    spoil.clear()
    spoil[lin.pair.gemm.family] = 0.0
    with pytest.raises(WeightsNotExactError):
        KleidiBackend(parse_target("i8mm"), exact_weights=True)("w", T.Q6_K, (k, n), raw)


def _random_blocks(rng: np.random.Generator, ggml_type: T, n: int, k: int) -> np.ndarray:
    """GGML bytes of an n x k weight: gguf's Q5_0 quantizer, or random Q6_K blocks (gguf has no Q6_K quantizer)
    whose f16 super-block scale d is set to a sane value."""
    if ggml_type == T.Q5_0:
        return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), T.Q5_0)
    blocks = rng.integers(0, 256, (n, k // 256, 210), dtype=np.uint8)
    blocks[..., 208:] = np.full((n, k // 256), 0.01, np.float16).view(np.uint8).reshape(n, k // 256, 2)
    return blocks.reshape(n, -1)


def test_gemv_exactly_when_m_is_1(tmp_path):
    _, t = _weight(tmp_path, T.Q4_0)
    recorder = MatmulRecorder()
    lin = KleidiBackend(parse_target("sme2:svl=512"), observers=[recorder])(t.name, t.ggml_type, t.shape, t.data)
    x = np.ones((3, lin.k), np.float32)
    lin(x), lin(x[:1])
    calls = recorder.calls
    assert [(c.m, c.kernel.kind) for c in calls] == [(3, "gemm"), (1, "gemv")]
    assert calls[0].kernel.name.endswith("sme2_mopa") and calls[1].kernel.name.endswith("sme2_sdot")


def test_threads_give_identical_logits(tmp_path):
    path = tiny_model(tmp_path, types={"*": T.Q4_0}, n_ff=192, n_embd=128, n_head=4)
    out = []
    for threads in (1, 2):
        lm = Llama(ModelFile(path), linear=KleidiBackend(parse_target("i8mm"), threads=threads, min_split_macs=0))
        out.append(lm.forward([1, 5, 7, 9], all_logits=True))
    assert np.array_equal(out[0], out[1])


def test_bad_activations(tmp_path):
    _, t = _weight(tmp_path, T.Q4_0)
    lin = KleidiBackend(parse_target("sme2"))(t.name, t.ggml_type, t.shape, t.data)
    x = np.ones((2, lin.k), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(NonFiniteInputError):
        lin(x)
    with pytest.raises(DTypeError):
        lin(np.ones((2, lin.k), np.float64))


# ---------------------------------------------------------------------------------------------------------------
# golden tensors through the runtime's own path (GGML bytes -> backend repack -> prepared MUL_MAT), bit for bit

#: the golden input holding each GGML weight type's raw blocks, as a GGUF file stores them
GOLDEN_WEIGHTS = {T.Q4_0: "rhs_q4_0", T.Q8_0: "rhs_q8_0", T.Q4_1: "rhs_q4_1", T.F16: "rhs_f16"}
#: the golden folder whose runs were made on each target's CPU
GOLDEN_DIRS = {
    "sme2:svl=128,table=seeds": "sme_svl16",
    "sme2:svl=256,table=seeds": "sme_svl32",
    "sme2:svl=512,table=seeds": "sme_svl64",
}
GOLDEN_DIRS |= {"i8mm": "neon", "dotprod": "neon"}


def _kai_run(name: str) -> str:
    return "kai_run_" + name.removeprefix("kai_").removeprefix("run_")


@pytest.mark.parametrize("spec", GOLDEN_DIRS)
@pytest.mark.parametrize("ggml_type", GOLDEN_WEIGHTS)
def test_golden_weights_through_backend_bit_for_bit(golden_dir, spec, ggml_type):
    """KleidiAI's own packed RHS and dst for the kernels the target selects, reproduced from the GGML bytes by
    the backend's conversion (Q8_0 per-channel requantization, Q4_1 offsets, F16 transpose) and its prepared
    GEMM/GEMV, in every golden shape."""
    golden = GoldenSet(golden_dir)
    backend_ = KleidiBackend(parse_target(spec))
    compared = 0
    for case in golden.manifest["cases"]:
        m, n, k, shape_dir = case["m"], case["n"], case["k"], f"m{case['m']}_n{case['n']}_k{case['k']}"
        raw = golden.array(case["inputs"][GOLDEN_WEIGHTS[ggml_type]]).reshape(-1)
        lin = backend_(f"blk.0.w{ggml_type.name}", ggml_type, (k, n), raw)
        kern = lin.pair.for_m(m)
        runs = [
            r
            for r in case["runs"]
            if r["status"] == "ok"
            and not r["clamped"]
            and r["dir"] == f"{shape_dir}/{GOLDEN_DIRS[spec]}"
            and r["kernels"]["matmul"] == _kai_run(kern.name)
            and r["kernels"]["rhs_pack"] == _kai_run(kern.rhs_packer.name)
        ]
        assert len(runs) == 1, (shape_dir, kern.name)
        files = runs[0]["files"]
        assert lin.packed.tobytes() == golden.read(files["rhs_packed"]), f"{shape_dir}: packed RHS differs"
        x = golden.array(case["inputs"]["lhs_f32"]).reshape(m, k)
        out = lin(np.ascontiguousarray(x))
        assert out.tobytes() == golden.read(files["dst"]), f"{shape_dir} {kern.name}: dst differs"
        compared += 1
    assert compared == len(golden.manifest["cases"])


def test_production_split_rule(monkeypatch):
    """With the default threshold a 2-thread backend splits a GEMM of >= MIN_SPLIT_MACS multiply-adds over n,
    keeps smaller ones and (below 64x that) GEMVs on one thread, and every split gives the 1-thread bits."""
    from kleidipy.core import matmul, threads

    n, k = 1024, 1024
    w = np.random.default_rng(5).standard_normal((n, k)).astype(np.float32)
    raw = formats.quantize(w, T.Q4_0)
    splits: list[int] = []
    pool_map = matmul.parallel_map

    def spy(fn, items, threads):
        splits.append(len(items))
        return pool_map(fn, items, threads)

    monkeypatch.setattr(matmul, "parallel_map", spy)
    lins = {t: KleidiBackend(parse_target("sme2:svl=512"), threads=t)("w", T.Q4_0, (k, n), raw) for t in (1, 2)}
    x = np.random.default_rng(6).standard_normal((4, k)).astype(np.float32)
    for m, split in ((1, False), (2, True), (4, True)):
        assert m * n * k >= threads.MIN_SPLIT_MACS or not split
        splits.clear()
        one = lins[1](x[:m])
        assert splits == []
        two = lins[2](x[:m])
        assert splits == ([2] if split else []), (m, splits)
        assert one.tobytes() == two.tobytes()
