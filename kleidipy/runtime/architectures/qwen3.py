"""Qwen3 (Yang et al., 2025) as llama.cpp runs it (``llama_model_qwen3``): the llama block with NEOX RoPE and a
per-head RMSNorm of Q and of K before RoPE; no biases required (q/k/v biases are read when the file has them, as
llama.cpp's ``create_tensor_qkv`` does), no ``rope_freqs``.

The block and what Qwen3 changes: docs/architectures.md."""

from __future__ import annotations

from typing import Any

from kleidipy.runtime.architecture import Architecture, TensorTable, ValidatedFile
from kleidipy.runtime.architectures.llama import Llama, check_whole_heads_rotated, llama_tensors
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.layers import RMSNorm, SelfAttention


class Qwen3(Llama):
    """A qwen3-architecture model from a validated model file."""

    def prepare(self, model: ValidatedFile, top: TensorTable) -> None:
        check_whole_heads_rotated(model)
        super().prepare(model, top)

    def attention(self, layer: int, t: dict[str, Any]) -> SelfAttention:
        eps = self.hparams.rms_eps
        qk_norm = {"q_norm": RMSNorm(t["q_norm"], eps), "k_norm": RMSNorm(t["k_norm"], eps)}
        return SelfAttention.from_tensors(layer, t, self.rope_tables, self.hparams, **qk_norm)


def qwen3_tensors(arch: Architecture, hp: HyperParameters) -> tuple[TensorTable, TensorTable]:
    """The llama tables without ``rope_freqs``, plus the per-head Q and K norms (head_dim values each)."""
    model, block = llama_tensors(arch, hp)
    del model["rope_freqs"]
    block["q_norm"] = ("attn_q_norm.weight", (hp.head_dim,), True)
    block["k_norm"] = ("attn_k_norm.weight", (hp.head_dim,), True)
    return model, block


ROWS = Qwen3.rows = (Architecture("qwen3", RopeType.NEOX, False, False, qwen3_tensors, Qwen3),)
