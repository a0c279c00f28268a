"""Random-weight Q4_0 GGUF files of real models' shapes (TinyLlama-1.1B, Qwen3-0.6B, Gemma-2-2B, Phi-3-mini,
SmolLM3-3B), for benchmarks: complete models llama.cpp and kleidipy both load, in llama.cpp's tensor names and
metadata keys for each architecture, with a small SentencePiece vocabulary (<unk>, <s>, </s>, the 256 byte tokens,
then filler pieces) padded to the model's vocabulary size.

The Q4_0 blocks are random bytes (uniform 4-bit codes, an f16 scale per block near σ / 4.6, so that the weights'
standard deviation is near σ), written directly: quantizing billions of normal floats would take minutes and tens of
GB for files whose numbers only their speed is measured on. Written to a temp file and renamed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GGMLType

#: bytes of a Q4_0 block (an f16 scale, 16 bytes of two 4-bit codes each) and its values
_Q4_0_BYTES, _Q4_0_VALUES = 18, 32


@dataclass(frozen=True)
class ModelShape:
    """A model's architecture and hyper-parameters (llama.cpp's metadata keys)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    head_dim: int = 0  #: 0: n_embd / n_head
    tied: bool = False  #: no output.weight (the LM head is the embedding)
    rope_base: float = 10000.0
    eps: float = 1e-5
    n_ctx: int = 4096
    kv: tuple[tuple[str, int | float], ...] = ()  #: further ``{arch}.`` keys (uint32 or float32)

    @property
    def dim(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def n_params(self) -> int:
        q, kv = self.n_head * self.dim, self.n_head_kv * self.dim
        attn = 2 * self.n_embd * q + 2 * self.n_embd * kv
        embeddings = (1 if self.tied else 2) * self.n_vocab * self.n_embd
        return self.n_layer * (attn + 3 * self.n_embd * self.n_ff) + embeddings


#: real models' shapes (their config.json), one per architecture the benchmarks run
TINYLLAMA_1_1B = ModelShape("llama", 22, 2048, 32, 4, 5632, 32000)
QWEN3_0_6B = ModelShape("qwen3", 28, 1024, 16, 8, 3072, 151936, head_dim=128, tied=True, rope_base=1e6, eps=1e-6)
GEMMA2_2B = ModelShape(
    "gemma2", 26, 2304, 8, 4, 9216, 256000, head_dim=256, tied=True, eps=1e-6,
    kv=(("attention.sliding_window", 4096), ("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)),
)  # fmt: skip
PHI3_MINI_3_8B = ModelShape("phi3", 32, 3072, 32, 32, 8192, 32064)
SMOLLM3_3B = ModelShape("smollm3", 36, 2048, 16, 4, 11008, 128256, tied=True, rope_base=5e6, eps=1e-6)


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256
    filler = n_vocab - len(tokens)
    tokens += [f"\u2581w{i}" for i in range(filler)]
    types += [T.NORMAL] * filler
    scores = [0.0] * 259 + [-float(i) for i in range(filler)]
    return tokens, scores, [int(t) for t in types]


def _q4_0(rng: np.random.Generator, n: int, k: int, sigma: float) -> np.ndarray:
    """Random Q4_0 blocks [n, k / 32 · 18] (module docstring)."""
    blocks = np.empty((n, k // _Q4_0_VALUES, _Q4_0_BYTES), np.uint8)
    scale = (sigma / 4.6) * (0.5 + rng.random(blocks.shape[:2], dtype=np.float32))
    blocks[..., :2] = scale.astype("<f2").view(np.uint8).reshape(*blocks.shape[:2], 2)
    blocks[..., 2:] = rng.integers(0, 256, (*blocks.shape[:2], 16), dtype=np.uint8)
    return blocks.reshape(n, -1)


def _tensors(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """Each tensor's name and (rows, columns) — 1 column: a norm vector — in llama.cpp's names for the architecture
    (phi3: fused attn_qkv and gate-up ffn_up; qwen3: per-head Q/K norms; gemma2: post-attention/post-FFN norms)."""
    e, q, kv, ff = shape.n_embd, shape.n_head * shape.dim, shape.n_head_kv * shape.dim, shape.n_ff
    t = {"token_embd.weight": (shape.n_vocab, e)}
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = (e, 1)
        if shape.arch == "phi3":
            t[p + "attn_qkv.weight"] = (q + 2 * kv, e)
        else:
            t.update({p + "attn_q.weight": (q, e), p + "attn_k.weight": (kv, e), p + "attn_v.weight": (kv, e)})
        if shape.arch == "qwen3":
            t.update({p + "attn_q_norm.weight": (shape.dim, 1), p + "attn_k_norm.weight": (shape.dim, 1)})
        t[p + "attn_output.weight"] = (e, q)
        t[p + "ffn_norm.weight"] = (e, 1)
        if shape.arch == "phi3":
            t[p + "ffn_up.weight"] = (2 * ff, e)
        else:
            t.update({p + "ffn_gate.weight": (ff, e), p + "ffn_up.weight": (ff, e)})
        t[p + "ffn_down.weight"] = (e, ff)
        if shape.arch == "gemma2":
            t.update({p + "post_attention_norm.weight": (e, 1), p + "post_ffw_norm.weight": (e, 1)})
    t["output_norm.weight"] = (e, 1)
    if not shape.tied:
        t["output.weight"] = (shape.n_vocab, e)
    return t


def write_random_model(path: str | os.PathLike[str], shape: ModelShape, seed: int = 0, sigma: float = 0.02) -> Path:
    """Write a random-weight GGUF of ``shape``: every matrix Q4_0, every norm vector ones."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    a = shape.arch
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), a)
    # (not the architecture's name: llama.cpp gives a model named "phi3" special-token rules its vocabulary lacks)
    w.add_name(f"kleidipy random {shape.n_params / 1e9:.2f}B")
    for key, value in {
        "context_length": shape.n_ctx,
        "embedding_length": shape.n_embd,
        "block_count": shape.n_layer,
        "feed_forward_length": shape.n_ff,
        "attention.head_count": shape.n_head,
        "attention.head_count_kv": shape.n_head_kv,
        "attention.key_length": shape.dim,
        "attention.value_length": shape.dim,
        "rope.dimension_count": shape.dim,
    }.items():
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.rope.freq_base", shape.rope_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", shape.eps)
    for key, value in shape.kv:
        (w.add_uint32 if isinstance(value, int) else w.add_float32)(f"{a}.{key}", value)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_0))
    tokens, scores, types = _vocab(shape.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    for name, (n, k) in _tensors(shape).items():
        if k == 1:
            w.add_tensor(name, np.ones(n, dtype=np.float32))
        else:
            blocks = _q4_0(rng, n, k, sigma)
            w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=GGMLType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path
