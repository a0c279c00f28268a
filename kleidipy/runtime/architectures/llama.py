"""Llama (Touvron et al., 2023) and Qwen2 (Yang et al., 2024) as llama.cpp runs them: pre-norm decoder blocks with
GQA self-attention and SwiGLU. Qwen2 is a row of this module (q/k/v biases, NEOX RoPE).

The block and what Qwen2 changes: docs/architectures.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kleidipy.runtime.architecture import Architecture, TensorTable, ValidatedFile, context_size, read_tensors
from kleidipy.runtime.gguf_file import UnsupportedArchitectureError
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.layers import CausalLM, GatedFFN, RMSNorm, RoPE, SelfAttention, T
from kleidipy.runtime.weights import EmbeddingFactory, FloatLinear, LinearFactory, RowEmbedding

if TYPE_CHECKING:
    from kleidipy.graph.model import Ops


class LlamaBlock:
    """One pre-norm decoder block: attention and feed-forward, each around a residual connection."""

    def __init__(self, attn_norm: RMSNorm, attention: SelfAttention, ffn_norm: RMSNorm, ffn: GatedFFN) -> None:
        self.attn_norm, self.attention, self.ffn_norm, self.ffn = attn_norm, attention, ffn_norm, ffn

    def forward(self, ops: Ops[T], x: T, keep: bool) -> T:
        """Buffer in, buffer out; the last block (``keep``) goes on with only the rows whose logits are wanted."""
        h = ops.add(x, self.attention.forward(ops, ops.rms_norm(x, self.attn_norm, "norm")), "h")
        if keep:
            (h,) = ops.keep(h)
        return ops.add(h, self.ffn.forward(ops, ops.rms_norm(h, self.ffn_norm, "norm")), "x")


class Llama(CausalLM):
    """A llama- or qwen2-architecture model from a validated model file; weights go through ``linear`` (the matmul
    backend)."""

    def __init__(
        self,
        model: ValidatedFile,
        linear: LinearFactory = FloatLinear.from_gguf,
        embedding: EmbeddingFactory = RowEmbedding.from_gguf,
        n_ctx: int | None = None,
        kv_dtype: type = np.float16,
        n_ubatch: int = 512,
    ) -> None:
        if model.architecture not in (row.name for row in ROWS):
            raise UnsupportedArchitectureError(f"{model.path}: architecture '{model.architecture}' is not llama's")
        hp = model.hparams
        n_ctx = context_size(hp, n_ctx, kv_dtype)

        arch = next(row for row in ROWS if row.name == model.architecture)
        top, block_table = llama_tensors(arch, hp)
        vector = model.vector
        rope = RoPE(hp.n_rot, hp.rope_type, hp.rope_freq_base, hp.rope_freq_scale, n_ctx, vector(top["rope_freqs"][0]))
        blocks = []
        for i in range(hp.n_layer):
            t = read_tensors(model, block_table, linear, i)
            attention = SelfAttention(
                i,
                t["wq"],
                t["wk"],
                t["wv"],
                t["wo"],
                rope,
                hp.n_head,
                hp.n_head_kv,
                hp.head_dim,
                bq=t["bq"],
                bk=t["bk"],
                bv=t["bv"],
                bo=t.get("bo"),
            )
            ffn = GatedFFN(t["gate"], t["up"], t["down"])
            norms = RMSNorm(t["attn_norm"], hp.rms_eps), RMSNorm(t["ffn_norm"], hp.rms_eps)
            blocks.append(LlamaBlock(norms[0], attention, norms[1], ffn))
        embd = model.tensor(top["token_embd"][0])
        super().__init__(
            hparams=hp,
            embedding=embedding(top["token_embd"][0], embd.ggml_type, embd.shape, embd.data),
            blocks=blocks,
            output_norm=RMSNorm(vector(top["output_norm"][0]), hp.rms_eps),
            lm_head=read_tensors(model, {"head": top["token_embd" if hp.tied_embeddings else "output"]}, linear)[
                "head"
            ],
            n_ctx=n_ctx,
            kv_dtype=kv_dtype,
            n_ubatch=n_ubatch,
        )


def llama_tensors(arch: Architecture, hp: HyperParameters) -> tuple[TensorTable, TensorTable]:
    """The tensors llama and qwen2 read, the model's and each block's, by field: (GGUF name, shape, required)."""
    d, q, kv, ff, v = hp.n_embd, hp.n_embd_q, hp.n_embd_kv, hp.n_ff, hp.n_vocab
    model: TensorTable = {
        "token_embd": ("token_embd.weight", (d, v), True),
        "output_norm": ("output_norm.weight", (d,), True),
        "output": ("output.weight", (d, v), False),
        "rope_freqs": ("rope_freqs.weight", (hp.n_rot // 2,), False),
    }
    block: TensorTable = {
        "attn_norm": ("attn_norm.weight", (d,), True),
        "wq": ("attn_q.weight", (d, q), True),
        "wk": ("attn_k.weight", (d, kv), True),
        "wv": ("attn_v.weight", (d, kv), True),
        "wo": ("attn_output.weight", (q, d), True),
        "bq": ("attn_q.bias", (q,), arch.qkv_bias),
        "bk": ("attn_k.bias", (kv,), arch.qkv_bias),
        "bv": ("attn_v.bias", (kv,), arch.qkv_bias),
        "ffn_norm": ("ffn_norm.weight", (d,), True),
        "gate": ("ffn_gate.weight", (d, ff), True),
        "up": ("ffn_up.weight", (d, ff), True),
        "down": ("ffn_down.weight", (ff, d), True),
    }
    if arch.output_bias:
        block["bo"] = ("attn_output.bias", (d,), False)
    return model, block


ROWS = (
    Architecture("llama", RopeType.NORM, False, True, llama_tensors, Llama),
    Architecture("qwen2", RopeType.NEOX, True, False, llama_tensors, Llama),
)
