"""Gemma 2 (Gemma Team, 2024) as llama.cpp runs it (``llama_model_gemma2``, flash attention off): Gemma 3's
sandwich-norm block with GeGLU and the embedding times sqrtf(n_embd), without per-head Q and K norms; a sliding
window on alternate layers (the even ones: set_swa_pattern(2)); the attention scores soft-capped before the softmax
(``attn_logit_softcapping``) and the logits after the LM head (``final_logit_softcapping``); the LM head is always
token_embd.

The block, the soft-caps and the layers: docs/architectures.md."""

from __future__ import annotations

from typing import Any

from kleidipy.runtime.architecture import Architecture, TensorTable, ValidatedFile, sliding_layers
from kleidipy.runtime.architectures.gemma3 import (
    Gemma3Block,
    ScaledEmbedding,
    attention_scale,
    gemma3_tensors,
    sandwich_block,
)
from kleidipy.runtime.gguf_file import GGUFMetadataError
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.layers import CausalLM, SelfAttention
from kleidipy.runtime.weights import Embedding

SWA_PATTERN = 2  #: llama.cpp's load_swa_pattern(ml, 2): layer il slides when il % 2 < 1
SLIDING_WINDOW = 4096  #: llama.cpp's n_swa when the file has no sliding_window
ATTN_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0  #: llama_hparams' defaults when the file has no soft-capping keys
N_LAYER_27B = 46  #: the one size whose attention scale is 1/sqrt(n_embd / n_head)


class Gemma2(CausalLM):
    """A gemma2-architecture model from a validated model file."""

    def prepare(self, model: ValidatedFile, top: TensorTable) -> None:
        hp, a = self.hparams, self.hparams.architecture
        self.window = model.get_int(f"{a}.attention.sliding_window", SLIDING_WINDOW)
        if self.window <= 0:
            raise GGUFMetadataError(f"{model.path}: {a}.attention.sliding_window = {self.window} must be > 0")
        self.sliding = sliding_layers(model, SWA_PATTERN)
        self.attn_softcap = model.get_float(f"{a}.attn_logit_softcapping", ATTN_SOFTCAP)
        self.final_softcap = model.get_float(f"{a}.final_logit_softcapping", FINAL_SOFTCAP)
        self.q_scale = attention_scale(hp, N_LAYER_27B)
        self.global_rope = self.rope(hp.rope_freq_base, hp.rope_freq_scale)
        base_swa = model.get_float(f"{a}.rope.freq_base_swa", hp.rope_freq_base)
        self.local_rope = self.global_rope if base_swa == hp.rope_freq_base else self.rope(base_swa, hp.rope_freq_scale)

    def block(self, layer: int, t: dict[str, Any]) -> Gemma3Block:
        hp = self.hparams
        sliding = self.sliding[layer]
        attention = SelfAttention.from_tensors(
            layer,
            t,
            self.local_rope if sliding else self.global_rope,
            hp,
            q_scale=self.q_scale,
            window=self.window if sliding else None,
            cap=self.attn_softcap,
        )
        return sandwich_block(t, hp.rms_eps, attention)

    def token_embedding(self, rows: Embedding) -> Embedding:
        return ScaledEmbedding(rows)


def gemma2_tensors(arch: Architecture, hp: HyperParameters) -> tuple[TensorTable, TensorTable]:
    """gemma3's tables without the per-head Q and K norms; the LM head is token_embd even when the file has
    output.weight (llama.cpp's TENSOR_DUPLICATED)."""
    model, block = gemma3_tensors(arch, hp)
    model["output"] = model["token_embd"]
    del block["q_norm"], block["k_norm"]
    return model, block


ROWS = Gemma2.rows = (Architecture("gemma2", RopeType.NEOX, False, False, gemma2_tensors, Gemma2),)
