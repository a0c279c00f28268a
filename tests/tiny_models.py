"""Tiny complete models for the hardening tests and fuzzers: a llama with a SentencePiece vocabulary and a qwen2 with
a byte-level BPE one, both with a chat template, written in a few milliseconds (metadata and tensors can be
overridden to write a model that lies)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf_writer import tiny_kv, tiny_tensors, write_gguf

from kleidipy.runtime.tokenizer import _BYTE_TO_CHAR

SHAPE = dict(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_ctx=256)
#: smollm3 with a layer without RoPE (every fourth); gemma2 with a sliding and a global layer
ARCH_SHAPE = {"smollm3": dict(n_layer=4), "gemma2": dict(n_layer=2)}
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA2 = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"


def spm_vocab() -> dict:
    """A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then a few pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "h", "i", "▁h", "▁hi", "e"]
    types = [2, 3, 3] + [6] * 256 + [1] * 6
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": [0.0] * 259 + [-1.0, -2.0, -2.0, -1.5, -0.5, -2.0],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.chat_template": LLAMA2,
    }


def bpe_vocab() -> dict:
    """A byte-level BPE vocabulary (token id b = byte b), two merges and ChatML's special tokens."""
    tokens = [*_BYTE_TO_CHAR, "Ġh", "he", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 3) + [3, 3, 3],
        "tokenizer.ggml.merges": ["Ġ h", "h e"],
        "tokenizer.ggml.bos_token_id": len(tokens) - 3,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


def model_parts(arch: str = "llama", seed: int = 0) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, float32 tensors) of a tiny model: llama and phi3 with the SPM vocabulary, the others with the BPE
    one."""
    vocab = spm_vocab() if arch in ("llama", "phi3", "gemma2") else bpe_vocab()
    shape = {**SHAPE, **ARCH_SHAPE.get(arch, {}), "n_vocab": len(vocab["tokenizer.ggml.tokens"])}
    return {**tiny_kv(arch, **shape), **vocab}, tiny_tensors(arch, seed=seed, **shape)


def write_model(path: Path, arch: str = "llama", weights: T = T.Q4_0, kv: dict | None = None,
                tensors: dict[str, np.ndarray] | None = None, drop: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """Write a tiny model with 2-D weights of type ``weights``; ``kv`` / ``tensors`` replace (a value of None
    removes) metadata keys / tensors, ``drop`` removes metadata keys."""
    meta, arrays = model_parts(arch)
    meta = {k: v for k, v in {**meta, **(kv or {})}.items() if v is not None and k not in drop}
    arrays = {k: v for k, v in {**arrays, **(tensors or {})}.items() if v is not None}
    return write_gguf(path, arch, meta, arrays, {"*": weights})
