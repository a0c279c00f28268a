"""The backend: weights of every GGUF type repacked once for the target, MUL_MAT = GEMV at m == 1 else GEMM."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from test_gguf_file import tiny_model

from kleidipy import backend
from kleidipy.backend import KleidiBackend
from kleidipy.errors import DTypeError, NonFiniteInputError
from kleidipy.model.gguf_file import GGUFFile
from kleidipy.model.llama import Llama
from kleidipy.model.weights import FloatLinear
from kleidipy.target import parse_target

TARGETS = ["sme2:svl=512", "sme2:svl=128", "i8mm", "dotprod"]
TYPES = [T.Q4_0, T.Q8_0, T.Q4_1, T.F16, T.F32, T.Q5_0]


def _weight(tmp_path, ggml_type):
    g = GGUFFile(tiny_model(tmp_path, types={"*": ggml_type}))
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
    tol = {T.F16: 2e-2, T.F32: 2e-2}.get(ggml_type, 6e-2)  # bf16 operands / 8-bit activations (+ Q5_0 -> Q8_0)
    assert np.abs(y - ref(x)).max() <= tol * np.abs(ref(x)).max()
    assert np.array_equal(lin(x[2:3]), y[2:3]) or ggml_type in (T.F16, T.F32)  # GEMV == GEMM row for int kernels
    assert bool(notices) == (ggml_type == T.Q5_0) and (not notices or "Q5_0" in notices[0] and "Q8_0" in notices[0])


def test_gemv_exactly_when_m_is_1(tmp_path, monkeypatch):
    _, t = _weight(tmp_path, T.Q4_0)
    lin = KleidiBackend(parse_target("sme2:svl=512"))(t.name, t.ggml_type, t.shape, t.data)
    calls = []
    monkeypatch.setattr(backend, "TRACE_HOOK", calls.append)
    x = np.ones((3, lin.k), np.float32)
    lin(x), lin(x[:1])
    assert [(c.m, c.kernel.kind) for c in calls] == [(3, "gemm"), (1, "gemv")]
    assert calls[0].kernel.name.endswith("sme2_mopa") and calls[1].kernel.name.endswith("sme2_sdot")


def test_threads_give_identical_logits(tmp_path):
    path = tiny_model(tmp_path, types={"*": T.Q4_0}, n_ff=192, n_embd=128, n_head=4)
    out = []
    for threads in (1, 2):
        lm = Llama(GGUFFile(path), linear=KleidiBackend(parse_target("i8mm"), threads=threads))
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
