"""GGUF loading and validation: tiny llama/qwen2 files written with gguf.GGUFWriter, then corrupted; the header
parser against gguf.GGUFReader (every value type, SmolLM2) and on hand-made hostile headers."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf_writer import TINY, V, tiny_kv, tiny_model, tiny_tensors, write_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_files import SMOLLM2, model_file

from kleidipy.errors import KleidipyError
from kleidipy.runtime.gguf_file import (
    GGUFContainer,
    GGUFError,
    GGUFFormatError,
    GGUFMetadataError,
    GGUFOpenError,
    GGUFTensorError,
    UnsupportedArchitectureError,
    UnsupportedModelError,
)
from kleidipy.runtime.hparams import RopeType
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.tokenizer import gguf_metadata


def raises_one_line(exc: type[Exception], path: Path, *match: str):
    """Context manager: the error is ``exc`` (a KleidipyError), one line, naming the file and each ``match``."""

    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(exc)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *args):
            suppressed = self.ctx.__exit__(*args)
            msg = str(self.info.value)
            assert isinstance(self.info.value, KleidipyError)
            assert "\n" not in msg and str(path) in msg, msg
            for m in match:
                assert m in msg, (m, msg)
            return suppressed

    return _Check()


def tensor_info_offset(data: bytes, name: str) -> int:
    """Offset of the n_dims field of tensor ``name``'s info record."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.find(key, 24)
    assert at > 0
    return at + len(key)


# ---------------------------------------------------------------------------------------------------------------
# valid files


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_opens(tmp_path: Path, arch: str) -> None:
    path = tiny_model(tmp_path, arch, types={"*": T.Q8_0, "blk.0.ffn_up.weight": T.Q4_1, "output.weight": T.F16})
    g = ModelFile(path)
    hp = g.hparams
    assert g.version == 3 and g.alignment == 32 and g.architecture == arch
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_ff, hp.n_vocab, hp.n_ctx_train) == (
        2, 64, 4, 2, 96, 80, 64,
    )  # fmt: skip
    assert (hp.head_dim, hp.n_rot, hp.n_group, hp.n_embd_q, hp.n_embd_kv) == (16, 16, 2, 64, 32)
    assert hp.rope_type == (RopeType.NORM if arch == "llama" else RopeType.NEOX)
    assert hp.rope_freq_base == (10000.0 if arch == "llama" else 1e6)
    assert hp.rope_freq_scale == 1.0 and hp.rope_scaling == "none"
    assert hp.rms_eps == pytest.approx(1e-5)
    assert hp.tied_embeddings == (arch == "llama")
    assert len(g.tensors) == (20 if arch == "llama" else 27)
    q = g.tensor("blk.0.attn_q.weight")
    assert q.ggml_type == T.Q8_0 and q.shape == (64, 64) and q.data.shape == (64, 68) and q.data.dtype == np.uint8
    assert g.tensor("blk.0.ffn_up.weight").ggml_type == T.Q4_1
    assert g.tensor("output_norm.weight").data.shape == (1, 256)


def test_tensor_data_is_a_view_of_the_file(tmp_path: Path) -> None:
    path = tiny_model(tmp_path)
    g = ModelFile(path)
    raw = path.read_bytes()
    for t in g.tensors.values():
        assert not t.data.flags.owndata and not t.data.flags.writeable
        assert t.data.tobytes() == raw[t.offset : t.offset + t.data.size]
        assert t.offset % g.alignment == 0
    src = tiny_tensors("llama", **TINY)
    for name, arr in src.items():
        np.testing.assert_array_equal(g.tensor(name).to_float(), arr)


def test_metadata_accessors(tmp_path: Path) -> None:
    kv = {"general.name": "tiny", "test.flag": True, "test.list": ["a", "bé"], "test.ints": [1, 2, 3]}
    path = tiny_model(tmp_path, kv=kv)
    g = ModelFile(path)
    assert g.get_str("general.name") == "tiny"
    assert g.get_int("llama.block_count") == 2
    assert g.get_float("llama.rope.freq_base") == 10000.0
    assert g.get_bool("test.flag") is True
    assert g.get_array("test.list") == ["a", "bé"] and g.get_array("test.ints") == [1, 2, 3]
    assert g.array_length("test.ints") == 3 and g.array_length("absent") is None
    assert g.get_int("absent", 7) == 7 and g.get_str("absent", None) is None
    assert "general.name" in g and "absent" not in g and "general.architecture" in list(g.keys())
    assert g.value_type("test.list") == gguf.GGUFValueType.ARRAY and g.value_type("absent") is None
    with raises_one_line(GGUFMetadataError, path, "'llama.block_count'", "UINT32", "string"):
        g.get_str("llama.block_count")
    with raises_one_line(GGUFMetadataError, path, "'general.name'", "integer"):
        g.get_int("general.name")
    with raises_one_line(GGUFMetadataError, path, "missing metadata key 'absent'"):
        g.get_float("absent")
    with raises_one_line(GGUFTensorError, path, "missing tensor 'nope'"):
        g.tensor("nope")


def test_vocab_size_from_tokenizer_and_rope_options(tmp_path: Path) -> None:
    tokens = [f"t{i}" for i in range(TINY["n_vocab"])]
    kv = {
        "llama.vocab_size": None,
        "tokenizer.ggml.tokens": tokens,
        "llama.rope.dimension_count": 8,
        "llama.rope.scaling.type": "linear",
        "llama.rope.scaling.factor": 4.0,
        "llama.attention.head_count_kv": [2, 2],
    }
    path = tiny_model(tmp_path, kv=kv, extra={"rope_freqs.weight": np.ones(4, np.float32)})
    hp = ModelFile(path).hparams
    assert hp.n_vocab == 80 and hp.n_rot == 8 and hp.rope_freq_scale == 0.25 and hp.rope_scaling == "linear"
    assert hp.n_head_kv == 2


# ---------------------------------------------------------------------------------------------------------------
# bad files


def test_missing_and_unreadable(tmp_path: Path) -> None:
    with raises_one_line(GGUFOpenError, tmp_path / "absent.gguf", "cannot open"):
        ModelFile(tmp_path / "absent.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with raises_one_line(GGUFFormatError, empty, "truncated"):
        ModelFile(empty)


@pytest.mark.parametrize(
    ("head", "match"),
    [
        (b"GGUX", "bad magic"),
        (b"\x00\x00\x00\x00", "bad magic"),
        (b"GGUF" + struct.pack("<I", 1), "unsupported GGUF version 1"),
        (b"GGUF" + struct.pack("<I", 4), "unsupported GGUF version 4"),
        (b"GGUF" + struct.pack(">I", 3), "big-endian"),
        (b"GG", "truncated"),
        (b"GGUF\x03", "truncated"),
    ],
)
def test_bad_magic_and_version(tmp_path: Path, head: bytes, match: str) -> None:
    path = tiny_model(tmp_path)
    data = path.read_bytes()
    path.write_bytes(head + data[len(head) :] if len(head) >= 8 else head)
    with raises_one_line(GGUFFormatError, path, match):
        ModelFile(path)


def test_truncated_header(tmp_path: Path) -> None:
    path = tiny_model(tmp_path)
    g = ModelFile(path)
    data = path.read_bytes()
    header_end = min(t.offset for t in g.tensors.values())
    for cut in (8, 16, 23, 24, 40, 100, header_end // 2, header_end - 40):
        path.write_bytes(data[:cut])
        with raises_one_line(GGUFFormatError, path, "truncated"):
            ModelFile(path)


def test_tensor_past_end_of_file(tmp_path: Path) -> None:
    path = tiny_model(tmp_path)
    g = ModelFile(path)
    last = max(g.tensors.values(), key=lambda t: t.offset)
    data = path.read_bytes()
    path.write_bytes(data[: last.offset + 10])
    with raises_one_line(GGUFTensorError, path, f"tensor '{last.name}'", "past the end of the file", "truncated"):
        ModelFile(path)


def test_tensor_offset_past_end_and_misaligned(tmp_path: Path) -> None:
    path = tiny_model(tmp_path)
    data = bytearray(path.read_bytes())
    at = tensor_info_offset(bytes(data), "output_norm.weight")
    off_at = at + 4 + 8 * 1 + 4
    (offset,) = struct.unpack_from("<Q", data, off_at)
    struct.pack_into("<Q", data, off_at, offset + len(data))
    path.write_bytes(bytes(data))
    with raises_one_line(GGUFTensorError, path, "'output_norm.weight'", "past the end"):
        ModelFile(path)
    struct.pack_into("<Q", data, off_at, offset + 4)
    path.write_bytes(bytes(data))
    with raises_one_line(GGUFTensorError, path, "'output_norm.weight'", "alignment"):
        ModelFile(path)


def test_unknown_tensor_type_and_bad_dims(tmp_path: Path) -> None:
    path = tiny_model(tmp_path)
    good = path.read_bytes()
    data = bytearray(good)
    at = tensor_info_offset(good, "blk.1.ffn_up.weight")
    struct.pack_into("<I", data, at + 4 + 16, 99)
    path.write_bytes(bytes(data))
    with raises_one_line(GGUFTensorError, path, "'blk.1.ffn_up.weight'", "unknown ggml type 99"):
        ModelFile(path)
    data = bytearray(good)
    struct.pack_into("<I", data, at + 4 + 16, int(T.Q8_0))  # 64-wide rows of Q8_0 are fine, 96 would be too
    struct.pack_into("<Q", data, at + 4, 40)  # ne[0] = 40: not a multiple of 32
    path.write_bytes(bytes(data))
    with raises_one_line(GGUFTensorError, path, "'blk.1.ffn_up.weight'", "multiple of 32"):
        ModelFile(path)
    data = bytearray(good)
    struct.pack_into("<I", data, at, 7)  # 7 dims
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError):
        ModelFile(path)


def test_missing_unexpected_and_misshaped_tensors(tmp_path: Path) -> None:
    path = tiny_model(tmp_path, drop=("blk.1.ffn_gate.weight",))
    with raises_one_line(GGUFTensorError, path, "missing tensor 'blk.1.ffn_gate.weight'"):
        ModelFile(path)
    path = tiny_model(tmp_path, "qwen2", drop=("blk.0.attn_k.bias",))
    with raises_one_line(GGUFTensorError, path, "missing tensor 'blk.0.attn_k.bias'"):
        ModelFile(path)
    path = tiny_model(tmp_path, extra={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64), np.float32)})
    with raises_one_line(GGUFTensorError, path, "unexpected tensor 'blk.0.ffn_gate_inp.weight'"):
        ModelFile(path)
    path = tiny_model(tmp_path, extra={"blk.1.attn_k.weight": np.zeros((64, 64), np.float32)})
    with raises_one_line(GGUFTensorError, path, "'blk.1.attn_k.weight'", "[64, 64]", "[64, 32]"):
        ModelFile(path)
    path = tiny_model(tmp_path, extra={"token_embd.weight": np.zeros((81, 64), np.float32)})
    with raises_one_line(GGUFTensorError, path, "'token_embd.weight'", "[64, 81]"):
        ModelFile(path)
    path = tiny_model(tmp_path, types={"blk.0.attn_q.weight": T.I32})
    with raises_one_line(GGUFTensorError, path, "'blk.0.attn_q.weight'", "unsupported type I32"):
        ModelFile(path)
    path = tiny_model(tmp_path, types={"output_norm.weight": T.Q8_0}, extra={"output_norm.weight": np.ones(64)})
    with raises_one_line(GGUFTensorError, path, "'output_norm.weight'", "unsupported type Q8_0"):
        ModelFile(path)


def test_unknown_architecture(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "gpt2.gguf", "gpt2", tiny_kv("gpt2", **TINY), tiny_tensors("llama", **TINY))
    with raises_one_line(UnsupportedArchitectureError, path, "'gpt2'", "llama, phi3, qwen2"):
        ModelFile(path)
    w = gguf.GGUFWriter(tmp_path / "noarch.gguf", "llama")
    w.kv_data[0].pop("general.architecture")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with raises_one_line(GGUFMetadataError, tmp_path / "noarch.gguf", "missing metadata key 'general.architecture'"):
        ModelFile(tmp_path / "noarch.gguf")


@pytest.mark.parametrize(
    ("kv", "exc", "match"),
    [
        ({"llama.block_count": None}, GGUFMetadataError, "missing metadata key 'llama.block_count'"),
        ({"llama.block_count": "two"}, GGUFMetadataError, "'llama.block_count' has type STRING"),
        ({"llama.block_count": 0}, GGUFMetadataError, "block_count = 0"),
        ({"llama.attention.head_count_kv": 3}, GGUFMetadataError, "must divide head_count = 4"),
        ({"llama.attention.layer_norm_rms_epsilon": None}, GGUFMetadataError, "layer_norm_rms_epsilon"),
        ({"llama.rope.freq_base": -1.0}, GGUFMetadataError, "rope.freq_base"),
        ({"llama.rope.dimension_count": 17}, GGUFMetadataError, "rope.dimension_count = 17"),
        ({"llama.embedding_length": 66}, GGUFMetadataError, "not a multiple of head_count"),
        ({"llama.vocab_size": 81}, GGUFTensorError, "'token_embd.weight'"),
        ({"llama.rope.scaling.type": "yarn"}, UnsupportedModelError, "rope scaling 'yarn'"),
        ({"llama.rope.scaling.type": "longrope"}, UnsupportedModelError, "longrope for phi3"),
        ({"llama.expert_count": 8}, UnsupportedModelError, "mixture-of-experts"),
        ({"llama.attention.head_count_kv": [2, 1]}, UnsupportedModelError, "per-layer"),
        ({"llama.attention.key_length": 16, "llama.attention.value_length": 8}, UnsupportedModelError, "value=8"),
        ({"tokenizer.ggml.tokens": ["a", "b"]}, GGUFMetadataError, "does not match the 2 tokenizer tokens"),
        ({"general.alignment": 3}, GGUFFormatError, "general.alignment = 3 is not a power of two"),
        ({"general.alignment": 32.0}, GGUFFormatError, "general.alignment has type FLOAT32"),
    ],
)
def test_bad_hyper_parameters(tmp_path: Path, kv: dict, exc: type[GGUFError], match: str) -> None:
    path = tiny_model(tmp_path, kv=kv)
    with raises_one_line(exc, path, match):
        ModelFile(path)


PHI3_Q = np.zeros((64, 64), np.float32)  # an attn_q.weight of the tiny phi3


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        (
            {"extra": {"rope_factors_long.weight": np.ones(5, np.float32)}},
            GGUFTensorError,
            "has shape [5], expected [8]",
        ),
        ({"extra": {"rope_factors_short.weight": np.ones((2, 4), np.float32)}}, GGUFTensorError, "expected [8]"),
        ({"extra": {"rope_factors_long.weight": np.zeros(8, np.float32)}}, GGUFMetadataError, "LongRoPE factors"),
        ({"kv": {"phi3.rope.scaling.attn_factor": 0.0}}, GGUFMetadataError, "attn_factor = 0.0 must be > 0"),
        ({"kv": {"phi3.rope.scaling.original_context_length": 0}}, GGUFMetadataError, "original_context_length = 0"),
        ({"drop": ("blk.1.attn_qkv.weight",)}, GGUFTensorError, "block 1 needs attn_qkv.weight or attn_q/attn_k"),
        ({"extra": {"blk.0.attn_q.weight": PHI3_Q}}, GGUFTensorError, "block 0 needs attn_qkv.weight or attn_q/attn_k"),
        ({"drop": ("blk.0.ffn_up.weight",)}, GGUFTensorError, "missing tensor 'blk.0.ffn_up.weight'"),
    ],
)
def test_bad_phi3_files(tmp_path: Path, change: dict, exc: type[GGUFError], match: str) -> None:
    """A phi3 file whose LongRoPE factors, RoPE scaling keys or fused weights are wrong stops with one line, at
    validation (shapes) or before any weight is read (values, which of fused or separate Q/K/V)."""
    path = tiny_model(tmp_path, "phi3", **change)
    with raises_one_line(exc, path, match):
        model = ModelFile(path)
        model.arch.build(model)


def test_rope_scaling_types_as_llama_cpp_reads_them(tmp_path: Path) -> None:
    """A phi3 file's rope.scaling.type "longrope" (the converter writes it for Phi-3.5 / Phi-4-mini) runs as
    llama.cpp runs it: the factors' RoPE, no frequency scale; "none" never scales, whatever factor the file has."""
    base = ModelFile(tiny_model(tmp_path, "phi3", name="a.gguf")).hparams
    longrope = ModelFile(tiny_model(tmp_path, "phi3", name="b.gguf", kv={"phi3.rope.scaling.type": "longrope"}))
    assert (longrope.hparams.rope_freq_scale, longrope.hparams.rope_scaling) == (base.rope_freq_scale, "longrope")
    none = {"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 4.0}
    assert ModelFile(tiny_model(tmp_path, name="c.gguf", kv=none)).hparams.rope_freq_scale == 1.0
    linear = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    assert ModelFile(tiny_model(tmp_path, name="d.gguf", kv=linear)).hparams.rope_freq_scale == 0.25


def test_duplicate_key_and_tensor(tmp_path: Path) -> None:
    path = tiny_model(tmp_path, kv={"zz.aaa": 1, "zz.bbb": 2})
    ModelFile(path)
    path.write_bytes(path.read_bytes().replace(b"zz.bbb", b"zz.aaa"))
    with raises_one_line(GGUFFormatError, path, "corrupt GGUF header", "zz.aaa"):
        ModelFile(path)
    path = tiny_model(tmp_path)
    path.write_bytes(path.read_bytes().replace(b"blk.1.ffn_up.weight", b"blk.1.ffn_dn.weight", 1))
    with raises_one_line(GGUFTensorError, path, "unexpected tensor 'blk.1.ffn_dn.weight'"):
        ModelFile(path)
    path.write_bytes(path.read_bytes().replace(b"blk.1.ffn_dn.weight", b"blk.1.ffn_up.weight", 1))
    path.write_bytes(path.read_bytes().replace(b"blk.0.attn_v.weight", b"blk.0.attn_k.weight", 1))
    with raises_one_line(GGUFFormatError, path, "duplicated tensor", "blk.0.attn_k.weight"):
        ModelFile(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_files_raise_only_gguf_errors(tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / "fuzz_src.gguf"
    if not path.exists():  # with a small vocabulary, so that string and numeric arrays get corrupted too
        vocab = {
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(TINY["n_vocab"])],
            "tokenizer.ggml.scores": [0.5] * 80,
        }
        tiny_model(tmp_path, "qwen2", name="fuzz_src.gguf", n_layer=1, kv=vocab)
    raw = bytearray(path.read_bytes())
    header_end = min(t.offset for t in ModelFile(path).tensors.values())
    n = data.draw(st.integers(1, 6))
    for _ in range(n):
        i = data.draw(st.integers(0, header_end - 1))
        raw[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    fuzzed = tmp_path / "fuzzed.gguf"
    fuzzed.write_bytes(bytes(raw))
    try:
        ModelFile(fuzzed)
    except GGUFError as e:
        assert "\n" not in str(e) and str(fuzzed) in str(e)


# ---------------------------------------------------------------------------------------------------------------
# the header parser: same values as gguf.GGUFReader, hostile headers


def gguf_str(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    """One key/value record: key, value type, value bytes."""
    return gguf_str(key.encode() if isinstance(key, str) else key) + struct.pack("<I", vtype) + payload


def arr(item_type: int, n: int, items: bytes = b"") -> bytes:
    """An ARRAY value's bytes: item type, count, items."""
    return struct.pack("<IQ", item_type, n) + items


def raw_gguf(path: Path, *records: bytes, n_kv: int | None = None, n_tensors: int = 0) -> Path:
    n_kv = len(records) if n_kv is None else n_kv
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, n_kv) + b"".join(records))
    return path


SCALARS = [  # (value type, struct format, value)
    (V.UINT8, "B", 200),
    (V.INT8, "b", -5),
    (V.UINT16, "H", 65535),
    (V.INT16, "h", -300),
    (V.UINT32, "I", 2**32 - 1),
    (V.INT32, "i", -7),
    (V.FLOAT32, "f", 1.5),
    (V.BOOL, "?", True),
    (V.UINT64, "Q", 2**64 - 1),
    (V.INT64, "q", -(2**63)),
    (V.FLOAT64, "d", math.pi),
]
TEXTS = [b"a", b"\xc3", b"", "\u00e9\u4e2d".encode(), b"\xff\xfe ok", b"\xed\xa0\x80"]  # some not UTF-8


def every_value_type(path: Path) -> Path:
    records = [kv(f"s.{t.name}", t, struct.pack("<" + f, v)) for t, f, v in SCALARS]
    records += [kv(f"a.{t.name}", V.ARRAY, arr(t, 3, struct.pack(f"<3{f}", v, v, v))) for t, f, v in SCALARS]
    records += [
        kv("a.BOOL2", V.ARRAY, arr(V.BOOL, 3, b"\x01\x00\x01")),
        kv("str", V.STRING, gguf_str("tiny \u00e9".encode())),
        kv("str.bad", V.STRING, gguf_str(b"\xff\xfe")),
        kv("strs", V.ARRAY, arr(V.STRING, len(TEXTS), b"".join(gguf_str(t) for t in TEXTS))),
        kv("strs.good", V.ARRAY, arr(V.STRING, 2, gguf_str(b"x") + gguf_str("\u00e9".encode()))),
        kv("empty.u32", V.ARRAY, arr(V.UINT32, 0)),
        kv("empty.str", V.ARRAY, arr(V.STRING, 0)),
    ]
    return raw_gguf(path, *records)


def assert_same_as_gguf_reader(g: GGUFContainer, reader: gguf.GGUFReader) -> None:
    """metadata() equals the tokenizer's reading of the stock reader (value types too), fields equals the stock
    reader's records part by part, tensors are the same bytes at the same offsets."""
    expected = {k: v for k, v in gguf_metadata(reader, prefix="").items() if not k.startswith("GGUF.")}
    got = g.metadata()
    assert list(got) == list(expected)
    for key, value in got.items():
        assert value == expected[key] and type(value) is type(expected[key]), key
        if isinstance(value, list):
            assert [type(x) for x in value] == [type(x) for x in expected[key]], key
    stock = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    for key, f in g.fields.items():
        h = stock[key]
        assert (f.offset, f.name, f.data, f.types[: len(h.types)]) == (h.offset, h.name, h.data, h.types), key
        assert [(p.dtype, p.tolist()) for p in f.parts] == [(p.dtype, p.tolist()) for p in h.parts], key
    assert [t.name for t in reader.tensors] == list(g.tensors)
    for t in reader.tensors:
        mine = g.tensors[t.name]
        assert (mine.offset, mine.ggml_type, mine.shape) == (t.data_offset, t.tensor_type, tuple(t.shape.tolist()))
        assert mine.data.tobytes() == np.asarray(t.data).tobytes()


def test_every_value_type_as_gguf_reader_reads_it(tmp_path: Path) -> None:
    path = every_value_type(tmp_path / "values.gguf")
    g = GGUFContainer(path)
    assert_same_as_gguf_reader(g, gguf.GGUFReader(path))
    assert not g.tensors and g.alignment == 32 and g.version == 3
    for t, _, v in SCALARS:
        getter = {bool: g.get_bool, int: g.get_int, float: g.get_float}[type(v)]
        assert getter(f"s.{t.name}") == (v if t != V.FLOAT32 else np.float32(v))
        assert g.get_array(f"a.{t.name}") == [v] * 3 and g.value_type(f"a.{t.name}") == V.ARRAY
    assert g.get_array("a.BOOL2") == [True, False, True]
    assert g.get_str("str") == "tiny \u00e9" and g.get_array("strs.good") == ["x", "\u00e9"]
    assert [t.encode("utf-8", "surrogateescape") for t in g.metadata("strs")["strs"]] == TEXTS
    assert g.array_length("empty.str") == 0 and g.get_array("empty.u32") == []
    with raises_one_line(GGUFMetadataError, path, "'strs' is not valid UTF-8"):
        g.get_array("strs")
    with raises_one_line(GGUFMetadataError, path, "'str.bad' is not valid UTF-8"):
        g.get_str("str.bad")
    with raises_one_line(GGUFMetadataError, path, "'empty.str' has type ARRAY[STRING], expected a string"):
        g.get_str("empty.str")
    assert gguf_metadata(path, prefix="str") == gguf_metadata(g, prefix="str") == g.metadata("str")


def test_real_model_reads_as_gguf_reader() -> None:
    """SmolLM2 read by kleidipy's reader gives what gguf.GGUFReader gives (speed: benchmarks/load.py)."""
    path = model_file(SMOLLM2)
    g = ModelFile(path)
    assert g.array_length("tokenizer.ggml.tokens") == g.hparams.n_vocab == 49152
    assert_same_as_gguf_reader(g, gguf.GGUFReader(path))


def _tensor_info(name: bytes, dims: tuple[int, ...], n_dims: int | None = None) -> bytes:
    n = len(dims) if n_dims is None else n_dims
    return gguf_str(name) + struct.pack(f"<I{len(dims)}QIQ", n, *dims, int(T.F32), 0)


HOSTILE = {  # name: (records, keywords of raw_gguf, error type, message parts)
    "numeric array count": ([kv("k", V.ARRAY, arr(V.UINT32, 2**62))], {}, GGUFFormatError, ("truncated",)),
    "numeric array past end": ([kv("k", V.ARRAY, arr(V.UINT64, 2, b"x" * 15))], {}, GGUFFormatError, ("up to",)),
    "string array count": ([kv("k", V.ARRAY, arr(V.STRING, 2**62))], {}, GGUFFormatError, ("truncated",)),
    "string length": ([kv("k", V.STRING, struct.pack("<Q", 2**63))], {}, GGUFFormatError, ("truncated",)),
    "string runs past the end": (
        [kv("k", V.ARRAY, arr(V.STRING, 3, gguf_str(b"ab") + struct.pack("<Q", 9) + b"x" * 12))],
        {},
        GGUFFormatError,
        ("truncated", "needs bytes up to"),
    ),
    "string count past the end": (
        [kv("k", V.ARRAY, arr(V.STRING, 2, gguf_str(b"abcdefghijk")))],
        {},
        GGUFFormatError,
        ("truncated",),
    ),
    "key length": ([struct.pack("<Q", 2**64 - 1) + b"key"], {}, GGUFFormatError, ("truncated",)),
    "unknown value type": ([kv("k", 13, b"")], {}, GGUFFormatError, ("key 'k' has unknown value type 13",)),
    "unknown item type": ([kv("k", V.ARRAY, arr(99, 1))], {}, GGUFFormatError, ("unknown value type 99",)),
    "nested array": ([kv("k", V.ARRAY, arr(V.ARRAY, 1, arr(V.UINT8, 1, b"x")))], {}, GGUFFormatError, ("arrays",)),
    "key not UTF-8": ([kv(b"k\xff", V.UINT8, b"x")], {}, GGUFFormatError, ("key at offset 24 is not valid UTF-8",)),
    "duplicate key": ([kv("k", V.UINT8, b"x"), kv("k", V.UINT8, b"y")], {}, GGUFFormatError, ("duplicate key 'k'",)),
    "key count": ([kv("k", V.UINT8, b"x")], {"n_kv": 2**63}, GGUFFormatError, ("truncated",)),
    "tensor count": ([], {"n_tensors": 2**40}, GGUFFormatError, ("truncated",)),
    "alignment type": ([kv("general.alignment", V.STRING, gguf_str(b"32"))], {}, GGUFFormatError, ("STRING",)),
    "alignment zero": ([kv("general.alignment", V.UINT32, b"\0" * 4)], {}, GGUFFormatError, ("= 0 is not",)),
    "zero dims": ([_tensor_info(b"t", (), 0)], {"n_tensors": 1, "n_kv": 0}, GGUFTensorError, ("'t' has 0 dims",)),
    "many dims": ([_tensor_info(b"t", (), 2**32 - 1)], {"n_tensors": 1, "n_kv": 0}, GGUFTensorError, ("dims",)),
    "huge dims": ([_tensor_info(b"t", (2**63, 2**63))], {"n_tensors": 1, "n_kv": 0}, GGUFTensorError, ("past",)),
    "tensor name": ([_tensor_info(b"\xc0t", (4,))], {"n_tensors": 1, "n_kv": 0}, GGUFFormatError, ("UTF-8",)),
    "duplicate tensor": (
        [_tensor_info(b"t", (8,)), _tensor_info(b"t", (8,))],
        {"n_tensors": 2, "n_kv": 0},
        GGUFTensorError,
        ("duplicated tensor 't'",),
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_headers(tmp_path: Path, case: str) -> None:
    """Lengths and counts up to 2**64, bad types and names fail at once with a one-line error naming the file."""
    records, keywords, exc, match = HOSTILE[case]
    path = raw_gguf(tmp_path / "hostile.gguf", *records, **keywords)
    for opener in (GGUFContainer, ModelFile):
        with raises_one_line(exc, path, *match):
            opener(path)


def test_container_without_model(tmp_path: Path) -> None:
    """A vocabulary-only file (no tensors, no hyper-parameters) is a valid container but not a model."""
    path = raw_gguf(tmp_path / "vocab.gguf", kv("general.architecture", V.STRING, gguf_str(b"llama")))
    assert GGUFContainer(path).get_str("general.architecture") == "llama"
    with raises_one_line(GGUFMetadataError, path, "missing metadata key 'llama.embedding_length'"):
        ModelFile(path)
