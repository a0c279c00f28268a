"""The repacked-weight cache: a second load reads the packed weights back (bit-identical logits), a stale or
corrupt cache file is noticed and rebuilt, one file per target, and --no-repack-cache writes nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf_writer import tiny_kv, tiny_tensors, write_gguf
from tiny_models import bpe_vocab

from kleidipy.cli import main
from kleidipy.observer import Observer, RepackCall
from kleidipy.runtime import pull, repack_cache
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.pull import ModelSpec, cache_dir
from kleidipy.runtime.repack_cache import (
    RepackCacheError,
    cache_files,
    cache_path,
    read_key,
    remove_model_caches,
    repack_dir,
)
from kleidipy.target import parse_target

SHAPE = dict(n_layer=1, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_ctx=64)
#: one weight of every kind of load path: Q4_K by the Q4_1 family, Q6_K and Q5_0 by the exact-weight family, Q3_K
#: requantized to Q4_0, Q8_0 per channel (by the exact-weight family with exact weights), Q4_0 direct
TYPES = {
    "blk.0.attn_q.weight": T.Q4_K,
    "blk.0.ffn_down.weight": T.Q6_K,
    "blk.0.ffn_gate.weight": T.Q5_0,
    "blk.0.ffn_up.weight": T.Q3_K,
    "blk.0.attn_k.weight": T.Q8_0,
    "*": T.Q4_0,
}
IDS = [3, 70, 101, 5, 44]


def k_quant_blocks(rng: np.random.Generator, ggml_type: T, n: int, k: int) -> np.ndarray:
    """Random blocks of a K-quant weight [n, row_bytes] (gguf cannot quantize to K-quants) with small finite
    fp16 scales: Q4_K's d and dmin lead each 144-byte block, Q6_K's d ends each 210-byte block, Q3_K's each 110."""
    size = {T.Q4_K: 144, T.Q6_K: 210, T.Q3_K: 110}[ggml_type]
    blocks = rng.integers(0, 256, (n, k // 256, size), dtype=np.uint8)
    scales = rng.uniform(1e-4, 1e-3, (n, k // 256, 2)).astype(np.float16).view(np.uint8).reshape(n, k // 256, 4)
    if ggml_type == T.Q4_K:
        blocks[..., :4] = scales
    else:
        blocks[..., -2:] = scales[..., :2]
    return blocks.reshape(n, -1)


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny qwen2 with Q4_K, Q6_K, Q5_0, Q3_K, Q8_0 and Q4_0 weights, and a model cache of its own."""
    monkeypatch.setenv("KLEIDIPY_CACHE", str(tmp_path / "cache"))
    vocab = bpe_vocab()
    shape = {**SHAPE, "n_vocab": len(vocab["tokenizer.ggml.tokens"])}
    tensors = tiny_tensors("qwen2", **shape)
    rng = np.random.default_rng(7)
    for name, ggml_type in TYPES.items():
        if ggml_type in (T.Q4_K, T.Q6_K, T.Q3_K):
            n, k = tensors[name].shape
            tensors[name] = k_quant_blocks(rng, ggml_type, n, k)
    return write_gguf(tmp_path / "kquant.gguf", "qwen2", {**tiny_kv("qwen2", **shape), **vocab}, tensors, TYPES)


class Repacks(Observer):
    def __init__(self) -> None:
        self.calls: list[RepackCall] = []

    def on_repack(self, call: RepackCall) -> None:
        self.calls.append(call)


def load(path: Path, target: str = "sme2:svl=512", **kw) -> tuple[np.ndarray, list[str], list[RepackCall]]:
    """(logits of IDS at every position, notices, repack events) of one load."""
    notices: list[str] = []
    repacks = Repacks()
    engine = Engine(path, target=parse_target(target), progress=False, notice=notices.append, observers=[repacks], **kw)
    return engine.lm.forward(IDS, all_logits=True), notices, repacks.calls


def test_second_load_reads_the_cache_and_gives_identical_logits(model):
    fresh, notices, calls = load(model)
    assert not any(c.cached for c in calls) and cache_path(model, parse_target("sme2:svl=512"), "jit").is_file()
    cached, notices_again, calls_again = load(model)
    assert calls_again and all(c.cached and c.pack_seconds == 0 for c in calls_again)
    assert {c.ggml_type for c in calls_again} == {T.Q4_K, T.Q6_K, T.Q5_0, T.Q3_K, T.Q8_0, T.Q4_0}
    assert np.array_equal(cached, fresh)
    weights = lambda found: [n for n in found if "requantized" in n]  # noqa: E731 (not the compile-time notices)
    assert weights(notices_again) == weights(notices) != []  # (a requantized type is announced again, read back or not)
    uncached, _, calls_off = load(model, repack_cache=False)
    assert np.array_equal(uncached, fresh) and not any(c.cached for c in calls_off)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a cache")


@pytest.mark.parametrize("damage", [_flip_last_byte, _truncate, _garbage])
def test_corrupt_cache_is_noticed_and_rebuilt(model, damage):
    fresh, _, _ = load(model)
    damage(cache_path(model, parse_target("sme2:svl=512"), "jit"))
    logits, notices, calls = load(model)
    assert np.array_equal(logits, fresh) and not any(c.cached for c in calls)
    assert sum("repack cache" in n and "corrupt" in n for n in notices) == 1
    logits, notices, calls = load(model)  # rewritten: read back, no notice about it
    assert np.array_equal(logits, fresh) and all(c.cached for c in calls)
    assert not any("repack cache" in n for n in notices)


def test_stale_cache_is_noticed_and_rebuilt(model, monkeypatch):
    fresh, _, _ = load(model)
    os.utime(model, ns=(0, 10**18))  # the model file changed (its mtime): the cache was made for another file
    logits, notices, calls = load(model)
    assert np.array_equal(logits, fresh) and not any(c.cached for c in calls)
    assert [n for n in notices if "repack cache" in n and "stale (model changed)" in n]
    monkeypatch.setattr(repack_cache, "FORMAT_VERSION", repack_cache.FORMAT_VERSION + 1)
    _, notices, calls = load(model)
    assert [n for n in notices if "stale (format changed)" in n] and not any(c.cached for c in calls)
    assert len(list(repack_dir().iterdir())) == 1  # rewritten in place, nothing left behind


def test_a_weight_cached_as_another_kernel_type_is_a_miss(model):
    """A cache written by a load that packed a GGML type as another kernel weight type (here Q8_0: per-channel int8 by
    default, the exact-weight family with ``exact_weights``) is not read for that type: those weights are packed
    afresh, the others read back."""
    load(model)
    logits, _, calls = load(model, exact_weights=True)
    assert {c.ggml_type for c in calls if not c.cached} == {T.Q8_0}
    assert all(c.pair.weight_type == "qai8c16" for c in calls if not c.cached)
    assert np.array_equal(logits, load(model, repack_cache=False, exact_weights=True)[0])


def test_one_cache_file_per_target(model):
    targets = ["sme2:svl=512", "sme2:svl=256", "i8mm"]
    paths = {cache_path(model, parse_target(t), "jit") for t in targets}
    assert len(paths) == 3
    for t in targets:
        load(model, t)
    assert {p.name for p in repack_dir().iterdir()} == {p.name for p in paths}
    for t in targets:  # each target reads its own file and gets its own kernels' results
        _, _, calls = load(model, t)
        assert all(c.cached for c in calls)
    assert cache_path(model, parse_target("i8mm"), "reference") not in paths


def test_unwritable_cache_directory_is_a_notice(model):
    repack_dir().parent.mkdir(parents=True, exist_ok=True)
    repack_dir().write_text("a file where the directory should be")
    fresh, notices, _ = load(model)
    assert sum("could not write the repack cache" in n for n in notices) == 1
    assert np.array_equal(load(model, repack_cache=False)[0], fresh)


def test_cache_files_know_their_model_and_a_catalogue_model_s_files_are_removed(model, monkeypatch):
    """Each cache file's size and model (the catalogue sha256 it was made from, None for a GGUF file of the
    user's or an unreadable file); remove_model_caches deletes that model's files for every target, no other."""
    pulled = cache_dir() / "kquant-pulled.gguf"
    pulled.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, pulled)
    data = pulled.read_bytes()
    spec = ModelSpec("kquant", "tiny", pulled.name, len(data), hashlib.sha256(data).hexdigest(), ())
    monkeypatch.setitem(pull.CATALOGUE, spec.name, spec)
    load(model)
    load(pulled)
    load(pulled, "i8mm")
    (repack_dir() / "garbage.kpack").write_bytes(b"not a cache")
    files = cache_files()
    assert [file.size for file in files] == [file.path.stat().st_size for file in files]
    assert sorted(file.model_sha256 or "" for file in files) == ["", "", spec.sha256, spec.sha256]
    with pytest.raises(RepackCacheError, match="not a kleidipy repack cache file"):
        read_key(repack_dir() / "garbage.kpack")
    removed = remove_model_caches(spec.sha256)
    targets = ("sme2:svl=512", "i8mm")
    assert {file.path for file in removed} == {cache_path(pulled, parse_target(t), "jit") for t in targets}
    assert {file.path for file in cache_files()} == {cache_path(model, parse_target(targets[0]), "jit"),
                                                     repack_dir() / "garbage.kpack"}  # fmt: skip
    assert remove_model_caches(spec.sha256) == []


def test_cli_no_repack_cache_writes_nothing(model, capsys):
    args = ["run", "-m", str(model), "-p", "hi", "-n", "1", "--temp", "0", "-q", "--target", "i8mm"]
    assert main([*args, "--no-repack-cache"]) == 0
    assert not repack_dir().exists()
    assert main(args) == 0
    assert len(list(repack_dir().iterdir())) == 1
