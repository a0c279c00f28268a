"""Random-weight llama GGUF files of any shape (e.g. TinyLlama-1.1B's), for benchmarks and tests.

The file is a complete model llama.cpp and kleidipy both load: llama architecture metadata, a small
SentencePiece vocabulary (<unk>, <s>, </s>, the 256 byte tokens, then filler pieces) and normal(0, σ) weights
quantized with ggml's reference quantizer. Written to a temp file and renamed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy import formats


@dataclass(frozen=True)
class LlamaShape:
    """Hyper-parameters of a llama-architecture model."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx: int = 2048

    @property
    def n_params(self) -> int:
        head_dim = self.n_embd // self.n_head
        attn = 2 * self.n_embd * self.n_embd + 2 * self.n_embd * self.n_head_kv * head_dim
        return self.n_layer * (attn + 3 * self.n_embd * self.n_ff + 2 * self.n_embd) + 2 * self.n_vocab * self.n_embd


#: TinyLlama-1.1B's shape (22 layers, 2048 wide, GQA 32/4 heads, 5632 FFN, 32000 vocabulary).
TINYLLAMA_1_1B = LlamaShape(n_layer=22, n_embd=2048, n_head=32, n_head_kv=4, n_ff=5632, n_vocab=32000)


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256
    filler = n_vocab - len(tokens)
    tokens += [f"\u2581w{i}" for i in range(filler)]
    types += [T.NORMAL] * filler
    scores = [0.0] * 259 + [-float(i) for i in range(filler)]
    return tokens, scores, [int(t) for t in types]


def write_random_llama(
    path: str | os.PathLike[str],
    shape: LlamaShape,
    weight_type: GGMLType = GGMLType.Q4_0,
    seed: int = 0,
    sigma: float = 0.02,
) -> Path:
    """Write a random-weight llama GGUF of ``shape`` with every 2-D weight in ``weight_type``."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = shape.n_embd // shape.n_head
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"random llama {shape.n_params / 1e9:.2f}B")
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_0 if weight_type == GGMLType.Q4_0 else gguf.LlamaFileType.ALL_F32))
    tokens, scores, types = _vocab(shape.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def weight(name: str, n: int, k: int) -> None:
        x = (rng.standard_normal((n, k), dtype=np.float32) * np.float32(sigma)).astype(np.float32)
        if weight_type == GGMLType.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, formats.quantize(x, weight_type).reshape(n, -1), raw_dtype=weight_type)

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(shape.n_embd, dtype=np.float32))

    weight("token_embd.weight", shape.n_vocab, shape.n_embd)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        weight(p + "attn_q.weight", shape.n_embd, shape.n_embd)
        weight(p + "attn_k.weight", shape.n_head_kv * head_dim, shape.n_embd)
        weight(p + "attn_v.weight", shape.n_head_kv * head_dim, shape.n_embd)
        weight(p + "attn_output.weight", shape.n_embd, shape.n_embd)
        norm(p + "ffn_norm.weight")
        weight(p + "ffn_gate.weight", shape.n_ff, shape.n_embd)
        weight(p + "ffn_up.weight", shape.n_ff, shape.n_embd)
        weight(p + "ffn_down.weight", shape.n_embd, shape.n_ff)
    norm("output_norm.weight")
    weight("output.weight", shape.n_vocab, shape.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path
