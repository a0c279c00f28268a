"""kleidipy.tools.quantize against llama.cpp's llama-quantize: the --pure SmolLM2 Q4_0 / Q8_0 files reproduce the
reference outputs byte for byte (whole-file and per-tensor sha256 from models.json), metadata and tensor order
as llama-quantize writes them, the non-pure mixture rule, tiny models of every source type, and bad inputs."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf_writer import tiny_model
from model_files import SMOLLM2, model_file, reference_entry, requantized, sha256_file

from kleidipy import formats
from kleidipy.runtime.gguf_file import GGUFFormatError, GGUFOpenError
from kleidipy.runtime.model_file import ModelFile
from kleidipy.tools import quantize
from kleidipy.tools.quantize import (
    OutputPathError,
    QuantizeError,
    UnsupportedQuantTypeError,
    quantize_gguf,
    target_type,
    tensor_order_key,
)


@cache
def opened(path: Path) -> ModelFile:
    """A GGUF file opened once per session (parsing SmolLM2's vocabulary takes seconds)."""
    return ModelFile(path)


# ---------------------------------------------------------------------------------------------------------------
# exactness: SmolLM2 --pure against llama-quantize


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0"])
def test_pure_smollm2_is_llama_quantize_byte_for_byte(qtype: str) -> None:
    """Every tensor's type, shape, offset and sha256 as models.json records them, and the whole file identical."""
    ref = reference_entry("smollm2", qtype)
    path = requantized(SMOLLM2, qtype)
    out = opened(path)
    assert list(out.tensors) == [t["name"] for t in sorted(ref["tensors"], key=lambda t: t["data_offset_in_file"])]
    for t in ref["tensors"]:
        mine = out.tensors[t["name"]]
        assert (mine.ggml_type.name, list(mine.shape), mine.offset) == (
            t["ggml_type"],
            t["ne"],
            t["data_offset_in_file"],
        )
        assert mine.data.nbytes == t["n_bytes"]
        assert hashlib.sha256(mine.data).hexdigest() == t["sha256"], t["name"]
    assert out.get_int("general.file_type") == ref["general.file_type"]
    assert out.get_int("general.quantization_version") == ref["general.quantization_version"]
    assert path.stat().st_size == ref["size_bytes"]
    assert sha256_file(path) == ref["sha256"]


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0"])
def test_report_actions_match_llama_quantize(qtype: str) -> None:
    """The per-tensor plan (target type; copied or dequantized+requantized) is models.json's ``action``."""
    ref = {t["name"]: t for t in reference_entry("smollm2", qtype)["tensors"]}
    src = opened(model_file(SMOLLM2))
    qt = quantize.quant_type(qtype)[0]
    for t in src.tensors.values():
        new, message = target_type(t, qt, pure=True, tied=src.hparams.tied_embeddings)
        assert message is None
        result = quantize.TensorResult(t.name, t.shape, t.ggml_type, new, 0)
        assert (new.name, result.action) == (ref[t.name]["ggml_type"], ref[t.name]["action"])


def test_metadata_copied_in_order_with_file_type_last() -> None:
    """Every input key and value, in input order; general.quantization_version and general.file_type moved to the
    end (ggml's gguf_set_val_* removes a key and appends it), file_type = MOSTLY_Q4_0 (2)."""
    src = opened(model_file(SMOLLM2))
    out = opened(requantized(SMOLLM2, "q4_0"))
    moved = ["general.quantization_version", "general.file_type"]
    src_keys, out_keys = list(src.fields), list(out.fields)
    assert out_keys == [k for k in src_keys if k not in moved] + moved
    for key in src_keys:
        a, b = src.fields[key], out.fields[key]
        assert a.types == b.types, key
        if key == "general.file_type":
            assert (a.contents(), b.contents()) == (3, 2)  # MOSTLY_Q4_1 -> MOSTLY_Q4_0
        else:
            assert len(a.parts) == len(b.parts) and all(
                np.array_equal(x, y) for x, y in zip(a.parts, b.parts, strict=True)
            ), key


def test_tensor_order_is_llama_loaders() -> None:
    names = ["blk.10.attn_q.weight", "token_embd.weight", "blk.2.ffn_up.weight", "output.weight", "blk.2.attn_k.bias"]
    assert sorted(names, key=tensor_order_key) == [
        "output.weight",
        "token_embd.weight",
        "blk.2.attn_k.bias",
        "blk.2.ffn_up.weight",
        "blk.10.attn_q.weight",
    ]


# ---------------------------------------------------------------------------------------------------------------
# llama-quantize's mixture (no --pure)


def test_mixture_real_models_head_falls_back_to_q8_0() -> None:
    """SmolLM2 (tied, n_embd 576): token_embd gets Q6_K, and Q8_0 as 576 % 256 != 0 (its Q8_0 bytes are kept);
    every other weight gets the requested type. With Q8_0 requested the head stays Q8_0."""
    src = opened(model_file(SMOLLM2))
    for t in src.tensors.values():
        for qt in (T.Q4_0, T.Q8_0):
            new, message = target_type(t, qt, pure=False, tied=True)
            assert message is None
            if len(t.shape) == 1:
                assert new == t.ggml_type == T.F32
            elif t.name == "token_embd.weight":
                assert new == T.Q8_0
            else:
                assert new == qt


@pytest.mark.parametrize("tied", [True, False])
def test_mixture_q6_k_head_falls_back_to_requested_type_with_notice(tmp_path: Path, tied: bool) -> None:
    """n_embd 256: llama-quantize would make the head Q6_K; kleidipy says so once and uses Q4_0. The other
    weights are exactly the --pure ones."""
    src = tiny_model(tmp_path, "llama" if tied else "qwen2", n_embd=256, n_ff=256, n_vocab=64, tied=tied)
    notices: list[str] = []
    report = quantize_gguf(src, tmp_path / "mix.gguf", "q4_0", pure=False, progress=False, notice=notices.append)
    head = "token_embd.weight" if tied else "output.weight"
    assert len(notices) == 1 and head in notices[0] and "Q6_K" in notices[0] and "Q4_0" in notices[0]
    assert report.notices == notices
    pure = quantize_gguf(src, tmp_path / "pure.gguf", "q4_0", pure=True, progress=False, notice=notices.append)
    assert len(notices) == 1
    assert (tmp_path / "mix.gguf").read_bytes() == (tmp_path / "pure.gguf").read_bytes()
    assert [t.dst_type for t in report.tensors] == [t.dst_type for t in pure.tensors]


# ---------------------------------------------------------------------------------------------------------------
# tiny models: every source type, values as ggml's reference quantizer gives them


@pytest.mark.parametrize("src_type", [T.F32, T.F16, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_0], ids=lambda t: t.name)
@pytest.mark.parametrize("qtype", ["q4_0", "q8_0"])
def test_tiny_model_every_source_type(tmp_path: Path, src_type: T, qtype: str) -> None:
    """2-D weights: dequantized, then formats.quantize (or copied when already that type); 1-D tensors copied.
    (K-quant sources, which gguf-py cannot write, are covered by the Qwen2.5 file in test_runtime_reference.)"""
    src = tiny_model(tmp_path, "qwen2", types={"*": src_type}, n_embd=256, n_ff=256, n_vocab=64)
    dst = tmp_path / "out.gguf"
    report = quantize_gguf(src, dst, qtype, pure=True, progress=False)
    a, b = ModelFile(src), ModelFile(dst)
    want_type = T.Q4_0 if qtype == "q4_0" else T.Q8_0
    assert report.size_out == dst.stat().st_size and report.pure and report.file_type in (2, 7)
    for name, t in a.tensors.items():
        o = b.tensors[name]
        if len(t.shape) == 1:
            assert o.ggml_type == t.ggml_type and np.array_equal(o.data, t.data)
            continue
        assert o.ggml_type == want_type and o.shape == t.shape
        if t.ggml_type == want_type:
            assert np.array_equal(o.data, t.data)
        else:
            values = formats.dequantize(t.data, t.ggml_type, t.n_rows, t.shape[0])
            assert np.array_equal(o.data.reshape(-1), formats.quantize(values, want_type).reshape(-1))
    assert [t.name for t in report.tensors] == list(b.tensors)


# ---------------------------------------------------------------------------------------------------------------
# bad inputs


@pytest.mark.parametrize("qtype", ["q4_k", "f16", "Q5_0", "bogus", ""])
def test_unsupported_type(tmp_path: Path, qtype: str) -> None:
    with pytest.raises(UnsupportedQuantTypeError, match="q4_0, q8_0"):
        quantize_gguf(tmp_path / "missing.gguf", tmp_path / "out.gguf", qtype, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_type_names_are_case_insensitive(tmp_path: Path) -> None:
    src = tiny_model(tmp_path)
    report = quantize_gguf(src, tmp_path / "o.gguf", "Q8_0", pure=True, progress=False)
    assert report.qtype == "q8_0" and report.file_type == 7


def test_unreadable_inputs(tmp_path: Path) -> None:
    with pytest.raises(GGUFOpenError):
        quantize_gguf(tmp_path / "missing.gguf", tmp_path / "out.gguf", "q4_0", progress=False)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(GGUFFormatError):
        quantize_gguf(bad, tmp_path / "out.gguf", "q4_0", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_bad_output_paths(tmp_path: Path) -> None:
    src = tiny_model(tmp_path)
    with pytest.raises(OutputPathError, match="does not exist"):
        quantize_gguf(src, tmp_path / "nope" / "out.gguf", "q4_0", progress=False)
    with pytest.raises(OutputPathError, match="is a directory"):
        quantize_gguf(src, tmp_path, "q4_0", progress=False)
    with pytest.raises(OutputPathError, match="is the input"):
        quantize_gguf(src, src, "q4_0", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


@pytest.mark.parametrize("exc", [KeyboardInterrupt, MemoryError])
def test_failure_mid_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: type) -> None:
    """An error (or Ctrl-C) while tensors are written leaves neither OUT nor a temporary file; an existing OUT is
    left as it was."""
    src = tiny_model(tmp_path)
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"old")
    calls = []

    def failing(t, new):  # noqa: ANN001, ANN202
        calls.append(t.name)
        if len(calls) == 5:
            raise exc()
        return real(t, new)

    real = quantize.requantize
    monkeypatch.setattr(quantize, "requantize", failing)
    with pytest.raises(exc):
        quantize_gguf(src, dst, "q4_0", progress=False)
    assert dst.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf", "tiny.gguf"]


def test_rows_that_do_not_split_into_blocks(tmp_path: Path) -> None:
    """A weight whose rows are not a multiple of 32 (here an F32 model with n_embd 48) cannot be Q4_0."""
    src = tiny_model(tmp_path, n_embd=48, n_head=2, n_head_kv=1)
    with pytest.raises(QuantizeError, match="rows of 48 values do not split into Q4_0 blocks of 32"):
        quantize_gguf(src, tmp_path / "out.gguf", "q4_0", pure=True, progress=False)
    with pytest.raises(QuantizeError, match="'token_embd.weight' rows of 48 values do not split into Q8_0 blocks"):
        quantize_gguf(src, tmp_path / "out.gguf", "q4_0", progress=False)  # the head's Q6_K -> Q8_0 fallback
    assert not (tmp_path / "out.gguf").exists()


def test_non_finite_weights(tmp_path: Path) -> None:
    """ggml's quantizers are undefined for NaN/Inf (llama-quantize's row validation rejects the result)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    w[3, 7] = np.nan
    src = tiny_model(tmp_path, extra={"blk.0.attn_q.weight": w})
    with pytest.raises(QuantizeError, match="blk.0.attn_q.weight"):
        quantize_gguf(src, tmp_path / "out.gguf", "q8_0", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]
