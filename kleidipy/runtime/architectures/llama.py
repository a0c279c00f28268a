"""Llama (Touvron et al., 2023) and Qwen2 (Yang et al., 2024) as llama.cpp runs them: pre-norm decoder blocks with
GQA self-attention and SwiGLU. Qwen2 is a row of this module (q/k/v biases, NEOX RoPE).

The block and what Qwen2 changes: docs/architectures.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kleidipy.runtime.architecture import Architecture, TensorTable, ValidatedFile
from kleidipy.runtime.gguf_file import GGUFMetadataError
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.layers import CausalLM, GatedFFN, RMSNorm, SelfAttention, T

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
    """A llama- or qwen2-architecture model from a validated model file."""

    def prepare(self, model: ValidatedFile, top: TensorTable) -> None:
        hp = self.hparams
        freq_factors = model.vector(top["rope_freqs"][0]) if "rope_freqs" in top else None
        self.rope_tables = self.rope(hp.rope_freq_base, hp.rope_freq_scale, freq_factors)

    def attention(self, layer: int, t: dict[str, Any]) -> SelfAttention:
        """Block ``layer``'s attention (what qwen3 and smollm3 change of the block)."""
        return SelfAttention.from_tensors(layer, t, self.rope_tables, self.hparams)

    def block(self, layer: int, t: dict[str, Any]) -> LlamaBlock:
        hp = self.hparams
        norm = RMSNorm(t["attn_norm"], hp.rms_eps), RMSNorm(t["ffn_norm"], hp.rms_eps)
        return LlamaBlock(norm[0], self.attention(layer, t), norm[1], GatedFFN(t["gate"], t["up"], t["down"]))


def check_whole_heads_rotated(model: ValidatedFile) -> None:
    """llama.cpp asserts (aborts) for qwen3 and smollm3 when RoPE does not rotate whole heads (rope.dimension_count
    != head size): here a one-line error."""
    hp = model.hparams
    if hp.n_rot != hp.head_dim:
        raise GGUFMetadataError(
            f"{model.path}: {hp.architecture}.rope.dimension_count = {hp.n_rot} must equal the head size {hp.head_dim}"
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


ROWS = Llama.rows = (
    Architecture("llama", RopeType.NORM, False, True, llama_tensors, Llama),
    Architecture("qwen2", RopeType.NEOX, True, False, llama_tensors, Llama),
)
