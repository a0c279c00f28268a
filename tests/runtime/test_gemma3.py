"""Gemma 3's own pieces: ggml's F16-table GELU, the sliding-window mask, which layers slide, the attention scale,
and the real Gemma 3 270M with float weights against llama.cpp's logits (within llama.cpp's own spread)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import paths
import pytest
from model_files import GEMMA3, model_file
from tiny_models import write_model

from kleidipy.runtime.architectures.gemma3 import Gemma3, Gemma3Params
from kleidipy.runtime.gguf_file import GGUFMetadataError, UnsupportedArchitectureError
from kleidipy.runtime.kv_cache import KVCache
from kleidipy.runtime.layers import attention, geglu
from kleidipy.runtime.model_file import ModelFile

REFERENCE = paths.REFERENCE / "gemma3" / "logits"


def test_geglu_is_the_f16_table_gelu() -> None:
    gate = np.array([-12.0, -10.0, -3.3, -0.5, 0.0, 1e-3, 0.7, 2.5, 9.99, 10.0, 40.0], np.float32)
    up = np.linspace(0.5, 2.0, gate.size, dtype=np.float32)
    got = geglu(gate, up)
    x = gate.astype(np.float16).astype(np.float64)  # the table is indexed by the gate rounded to F16
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))
    want = gelu.astype(np.float16).astype(np.float32) * up
    want[gate <= -10], want[gate >= 10] = 0.0, (gate * up)[gate >= 10]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("m", "start"), [(1, 9), (7, 0), (5, 6)])
def test_sliding_window_masks_old_keys(m: int, start: int) -> None:
    rng = np.random.default_rng(m + start)
    n_kv, window, d = start + m, 4, 8
    q = rng.standard_normal((m, 2, d)).astype(np.float32)
    keys, values = (rng.standard_normal((1, n_kv, d)).astype(np.float32) for _ in range(2))
    cache = KVCache(1, 1, d, n_kv, np.float32)
    cache.store(0, 0, keys.transpose(1, 0, 2), values.transpose(1, 0, 2))
    got = attention(q, cache, 0, start, np.float32(0.5), window)
    for i in range(m):
        p = start + i
        visible = slice(max(0, p - window + 1), p + 1)  # key p0 is masked when p - p0 >= window
        s = q[i].astype(np.float64) @ keys[0, visible].T.astype(np.float64) * 0.5
        w = np.exp(s - s.max(axis=1, keepdims=True))
        want = (w / w.sum(axis=1, keepdims=True)) @ values[0, visible].astype(np.float64)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)


def test_every_sixth_layer_is_global() -> None:
    assert [i for i, slides in enumerate(Gemma3Params.read(_fake_model(512)).sliding) if not slides] == [5, 11, 17]


@pytest.mark.parametrize(
    ("kv", "want"),
    [
        ({}, (4, 2.0, 3.0, [True, False])),  # the tiny file's keys
        (
            {"gemma2.attention.sliding_window": None, "gemma2.attn_logit_softcapping": None,
             "gemma2.final_logit_softcapping": None},
            (4096, 50.0, 30.0, [True, False]),
        ),  # llama.cpp's defaults
        ({"gemma2.attention.sliding_window_pattern": [False, True]}, (None, 2.0, 3.0, [False, True])),  # per layer
        ({"gemma2.attention.sliding_window_pattern": 0}, (4, 2.0, 3.0, [True, True])),  # 0: every layer slides
    ],
)  # fmt: skip
def test_gemma2_window_on_even_layers_and_caps(tmp_path: Path, kv: dict, want: tuple) -> None:
    """gemma2: the window on the even layers (set_swa_pattern(2)), the caps as read or llama.cpp's defaults, the
    attention scale 1/sqrt(head_dim) on Q and 1 in the softmax."""
    model = ModelFile(write_model(tmp_path / "g.gguf", "gemma2", kv=kv))
    lm = model.arch.build(model, n_ctx=32)
    windows = [b.attention.window for b in lm.blocks]
    assert (windows[0], lm.blocks[0].attention.cap, lm.final_softcap, [w is not None for w in windows]) == want
    a = lm.blocks[1].attention
    assert (a.q_scale, a.scale, a.cap) == (np.float32(1 / 4), 1.0, want[1])


@pytest.mark.parametrize("pattern", [[True, False, True], [1, 0], True, "6"])
def test_gemma2_bad_window_pattern(tmp_path: Path, pattern: object) -> None:
    """A sliding_window_pattern that is neither a bool per layer nor an integer >= 0: one line naming the key."""
    model = ModelFile(
        write_model(tmp_path / "g.gguf", "gemma2", kv={"gemma2.attention.sliding_window_pattern": pattern})
    )
    with pytest.raises(GGUFMetadataError, match="sliding_window_pattern"):
        model.arch.build(model, n_ctx=32)


def _fake_model(window: int, n_layer: int = 18) -> SimpleNamespace:
    hp = SimpleNamespace(architecture="gemma3", n_embd=640, n_head=4, head_dim=256, n_layer=n_layer)
    return SimpleNamespace(
        hparams=hp, architecture="gemma3", path="m.gguf", get_int=lambda key: window, metadata=lambda prefix: {}
    )


def test_params_attention_scale_and_bad_window() -> None:
    assert Gemma3Params.read(_fake_model(512)) == Gemma3Params(512, 1 / 16, ((True,) * 5 + (False,)) * 3)
    assert Gemma3Params.read(_fake_model(512, n_layer=62)).attention_scale == pytest.approx(1 / np.sqrt(160))
    with pytest.raises(GGUFMetadataError, match="sliding_window = 0"):
        Gemma3Params.read(_fake_model(0))


@pytest.fixture(scope="module")
def gemma3_file() -> ModelFile:
    return ModelFile(model_file(GEMMA3))


def test_gemma3_file_is_read(gemma3_file: ModelFile) -> None:
    hp = gemma3_file.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab) == (18, 640, 4, 1, 256, 262144)
    assert hp.tied_embeddings and hp.rope_freq_base == 1e6


def test_gemma3_rejects_other_architectures(tmp_path: Path) -> None:
    from gguf_writer import tiny_model

    with pytest.raises(UnsupportedArchitectureError, match="not gemma3's"):
        Gemma3(ModelFile(tiny_model(tmp_path, "llama")))


#: measured last-logit max |Δ| of the float path (f32 weights and activations) to llama.cpp's default run, rounded
#: up: llama.cpp quantizes activations to Q8_0/Q8_K for its integer dot products, and its own flash-attention run is
#: 0.87 (short_fact) and 1.76 (code_python) away from its default one
FLOAT_PATH_BOUND = {"short_fact": 0.84, "code_python": 1.87}


def test_gemma3_float_weights_near_llama_cpp(gemma3_file: ModelFile) -> None:
    """Weights dequantized to f32 (no requantization): every prompt position's top-1 is llama.cpp's, and the last
    logits are within the measured bound (the network itself, apart from the matmul backend)."""
    lm = Gemma3(gemma3_file, n_ctx=512)
    for prompt, limit in FLOAT_PATH_BOUND.items():
        ref = json.loads((REFERENCE / f"gemma3-q4_k_m__{prompt}__default.json").read_text())
        last = np.load(REFERENCE / f"gemma3-q4_k_m__{prompt}__default.last_logits.npy")
        lm.reset()
        rows = lm.forward(ref["token_ids"], all_logits=True)
        assert float(np.abs(rows[-1] - last).max()) <= limit, prompt
        assert [int(np.argmax(r)) for r in rows] == [p["top10"][0][0] for p in ref["positions"]], prompt
