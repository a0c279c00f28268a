"""Tiny GGUF model files written for tests: the metadata and tensors of a llama or qwen2 of any small shape
(``tiny_kv``, ``tiny_tensors``), written by gguf's own writer (``write_gguf``), and ``tiny_model`` for both."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

V = gguf.GGUFValueType

# ---------------------------------------------------------------------------------------------------------------
# tiny model files (also used by test_model_arch.py)

TINY = dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=80, n_ctx=64)


def tiny_kv(arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int, n_ctx: int):
    return {
        f"{arch}.block_count": n_layer,
        f"{arch}.context_length": n_ctx,
        f"{arch}.embedding_length": n_embd,
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.rope.freq_base": 10000.0 if arch == "llama" else 1000000.0,
        f"{arch}.vocab_size": n_vocab,
        **(longrope_kv(arch, n_ctx // 4) if arch == "phi3" else {}),
        **(gemma2_kv(arch) if arch == "gemma2" else {}),
    }


def gemma2_kv(arch: str) -> dict:
    """gemma2's keys: a window of 4 (layer 0 slides), soft-caps small enough that they cap."""
    return {
        f"{arch}.attention.sliding_window": 4,
        f"{arch}.attn_logit_softcapping": 2.0,
        f"{arch}.final_logit_softcapping": 3.0,
    }


def longrope_kv(arch: str, n_ctx_orig: int) -> dict:
    """phi3's LongRoPE keys as the converter writes them: the original context, the attention factor
    sqrt(1 + ln(scale) / ln(original)) of a context ``scale`` times longer (here 4)."""
    factor = float(np.sqrt(1.0 + np.log(4.0) / np.log(n_ctx_orig)))
    return {f"{arch}.rope.scaling.original_context_length": n_ctx_orig, f"{arch}.rope.scaling.attn_factor": factor}


def tiny_tensors(arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int,
                 seed: int = 0, tied: bool | None = None, head_dim: int | None = None,
                 **_: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Random float32 tensors in numpy order (reversed ggml shape); qwen2 gets biases and an output.weight, qwen3
    per-head Q/K norms (``head_dim``: when it is not n_embd / n_head)."""
    rng = np.random.default_rng(seed)
    hd = head_dim or n_embd // n_head
    tied = arch in ("llama", "gemma2") if tied is None else tied

    def mat(n: int, k: int) -> np.ndarray:
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd)).astype(np.float32)}
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(n_embd)
        t[p + "attn_q.weight"] = mat(n_head * hd, n_embd)
        t[p + "attn_k.weight"] = mat(n_head_kv * hd, n_embd)
        t[p + "attn_v.weight"] = mat(n_head_kv * hd, n_embd)
        t[p + "attn_output.weight"] = mat(n_embd, n_head * hd)
        if arch == "qwen2":
            t[p + "attn_q.bias"] = (0.1 * rng.standard_normal(n_head * hd)).astype(np.float32)
            t[p + "attn_k.bias"] = (0.1 * rng.standard_normal(n_head_kv * hd)).astype(np.float32)
            t[p + "attn_v.bias"] = (0.1 * rng.standard_normal(n_head_kv * hd)).astype(np.float32)
        if arch == "qwen3":
            t[p + "attn_q_norm.weight"] = norm(hd)
            t[p + "attn_k_norm.weight"] = norm(hd)
        t[p + "ffn_norm.weight"] = norm(n_embd)
        t[p + "ffn_gate.weight"] = mat(n_ff, n_embd)
        t[p + "ffn_up.weight"] = mat(n_ff, n_embd)
        t[p + "ffn_down.weight"] = mat(n_embd, n_ff)
        if arch == "gemma2":
            t[p + "post_attention_norm.weight"] = norm(n_embd)
            t[p + "post_ffw_norm.weight"] = norm(n_embd)
    t["output_norm.weight"] = norm(n_embd)
    if not tied:
        t["output.weight"] = mat(n_vocab, n_embd)
    if arch == "phi3":  # fused Q/K/V and gate/up (the gate first), LongRoPE's factors
        for i in range(n_layer):
            p = f"blk.{i}."
            t[p + "attn_qkv.weight"] = np.concatenate([t.pop(f"{p}attn_{x}.weight") for x in "qkv"])
            t[p + "ffn_up.weight"] = np.concatenate([t.pop(p + "ffn_gate.weight"), t.pop(p + "ffn_up.weight")])
        t["rope_factors_long.weight"] = np.geomspace(1.0, 40.0, hd // 2).astype(np.float32)
        t["rope_factors_short.weight"] = (1.0 + 0.1 * rng.random(hd // 2)).astype(np.float32)
    return t


def write_gguf(path: Path, arch: str, kv: dict, tensors: dict[str, np.ndarray], types: dict | None = None) -> Path:
    """Write a GGUF file: kv values typed as llama.cpp's converter does (uint32, float32, string, bool, arrays);
    tensors as F32 unless ``types`` maps a name (or "*" for every 2-D weight) to another ggml type (a uint8 array
    is taken as that type's blocks already, ``[rows, row_bytes]``: for types gguf cannot quantize to)."""
    types = types or {}
    w = gguf.GGUFWriter(path, arch)
    for key, value in kv.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    write_tensors(w, tensors, types)
    return path


def write_tensors(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], types: dict) -> None:
    """Add ``tensors`` to ``w`` — each of the type ``types`` gives by name, else ``types["*"]`` for 2-D ones, else
    F32; uint8 arrays are already quantized bytes — and write the file."""
    for name, arr in tensors.items():
        ty = types.get(name, types.get("*", T.F32) if arr.ndim == 2 else T.F32)
        if ty == T.F32:
            w.add_tensor(name, arr.astype(np.float32))
        elif ty == T.F16:
            w.add_tensor(name, arr.astype(np.float16))
        elif ty == T.I32:
            w.add_tensor(name, arr.astype(np.int32))
        else:
            q = arr if arr.dtype == np.uint8 else gguf.quants.quantize(arr, ty)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_model(tmp_path: Path, arch: str = "llama", name: str = "tiny.gguf", types: dict | None = None,
               kv: dict | None = None, drop: tuple[str, ...] = (), extra: dict | None = None,
               seed: int = 0, tied: bool | None = None, **hp: int) -> Path:  # fmt: skip
    """A tiny valid model file; ``kv`` overrides/adds metadata (value None removes a key), ``drop`` removes
    tensors, ``extra`` adds or replaces tensors."""
    h = {**TINY, **hp}
    meta = {**tiny_kv(arch, **h), **(kv or {})}
    meta = {k: v for k, v in meta.items() if v is not None}
    tensors = tiny_tensors(arch, seed=seed, tied=tied, **h)
    tensors = {k: v for k, v in tensors.items() if k not in drop}
    tensors.update(extra or {})
    return write_gguf(tmp_path / name, arch, meta, tensors, types)


# ---------------------------------------------------------------------------------------------------------------
# helpers
