"""Llama (Touvron et al., 2023) and Qwen2 (Yang et al., 2024) as llama.cpp runs them: pre-norm decoder blocks with
GQA self-attention and SwiGLU. Qwen2 is a row of this module (q/k/v biases, NEOX RoPE).

The block and what Qwen2 changes: docs/architectures.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kleidipy.runtime.architecture import Architecture, TensorSchema, ValidatedFile, context_size
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

        def weight(name: str):
            return model.linear(name, linear)

        vector = model.vector
        rope = RoPE(hp.n_rot, hp.rope_type, hp.rope_freq_base, hp.rope_freq_scale, n_ctx, vector("rope_freqs.weight"))
        blocks = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            attention = SelfAttention(
                layer=i,
                wq=weight(p + "attn_q.weight"),
                wk=weight(p + "attn_k.weight"),
                wv=weight(p + "attn_v.weight"),
                wo=weight(p + "attn_output.weight"),
                rope=rope,
                n_head=hp.n_head,
                n_head_kv=hp.n_head_kv,
                head_dim=hp.head_dim,
                bq=vector(p + "attn_q.bias"),
                bk=vector(p + "attn_k.bias"),
                bv=vector(p + "attn_v.bias"),
                bo=vector(p + "attn_output.bias"),
            )
            ffn = GatedFFN(weight(p + "ffn_gate.weight"), weight(p + "ffn_up.weight"), weight(p + "ffn_down.weight"))
            blocks.append(
                LlamaBlock(
                    RMSNorm(vector(p + "attn_norm.weight"), hp.rms_eps),
                    attention,
                    RMSNorm(vector(p + "ffn_norm.weight"), hp.rms_eps),
                    ffn,
                )
            )
        embd = model.tensor("token_embd.weight")
        super().__init__(
            hparams=hp,
            embedding=embedding("token_embd.weight", embd.ggml_type, embd.shape, embd.data),
            blocks=blocks,
            output_norm=RMSNorm(vector("output_norm.weight"), hp.rms_eps),
            lm_head=weight("token_embd.weight" if hp.tied_embeddings else "output.weight"),
            n_ctx=n_ctx,
            kv_dtype=kv_dtype,
            n_ubatch=n_ubatch,
        )


def llama_tensor_schema(arch: Architecture, hp: HyperParameters) -> TensorSchema:
    """Every tensor the architecture reads: name -> (shape in ggml order, required)."""
    d, q, kv, ff, v = hp.n_embd, hp.n_embd_q, hp.n_embd_kv, hp.n_ff, hp.n_vocab
    schema: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((d, v), True),
        "output_norm.weight": ((d,), True),
        "output.weight": ((d, v), False),
        "rope_freqs.weight": ((hp.n_rot // 2,), False),
    }
    for i in range(hp.n_layer):
        schema.update(
            {
                f"blk.{i}.attn_norm.weight": ((d,), True),
                f"blk.{i}.attn_q.weight": ((d, q), True),
                f"blk.{i}.attn_k.weight": ((d, kv), True),
                f"blk.{i}.attn_v.weight": ((d, kv), True),
                f"blk.{i}.attn_output.weight": ((q, d), True),
                f"blk.{i}.attn_q.bias": ((q,), arch.qkv_bias),
                f"blk.{i}.attn_k.bias": ((kv,), arch.qkv_bias),
                f"blk.{i}.attn_v.bias": ((kv,), arch.qkv_bias),
                f"blk.{i}.ffn_norm.weight": ((d,), True),
                f"blk.{i}.ffn_gate.weight": ((d, ff), True),
                f"blk.{i}.ffn_up.weight": ((d, ff), True),
                f"blk.{i}.ffn_down.weight": ((ff, d), True),
            }
        )
        if arch.output_bias:
            schema[f"blk.{i}.attn_output.bias"] = ((d,), False)
    return schema


ROWS = (
    Architecture("llama", RopeType.NORM, False, True, llama_tensor_schema, Llama),
    Architecture("qwen2", RopeType.NEOX, True, False, llama_tensor_schema, Llama),
)
