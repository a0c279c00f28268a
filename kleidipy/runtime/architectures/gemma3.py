"""Gemma 3 (Gemma Team, 2025) as llama.cpp runs it (``llm_build_gemma3<iswa>``, flash attention off): pre- and
post-norm blocks with GeGLU, per-head Q and K norms, a sliding window on five layers of six. Matmuls go through the
same backend as the llama family.

The block, attention, layers and norms: docs/architectures.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kleidipy.runtime.architecture import Architecture, TensorTable, ValidatedFile, sliding_layers
from kleidipy.runtime.gguf_file import GGUFMetadataError
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.layers import CausalLM, GatedFFN, RMSNorm, SelfAttention, T
from kleidipy.runtime.weights import Embedding

if TYPE_CHECKING:
    from kleidipy.graph.model import Ops

SWA_PATTERN = 6  #: llama.cpp's load_swa_pattern(ml, 6): five sliding layers, then a global one
ROPE_FREQ_BASE_SWA = 10000.0  #: llama.cpp's rope_freq_base_train_swa for gemma3
N_LAYER_27B = 62  #: the one size whose attention scale is 1/sqrt(n_embd / n_head)


@dataclass(frozen=True)
class Gemma3Params:
    """What gemma3 reads beyond the llama family's keys, and what llama.cpp derives from them."""

    sliding_window: int
    attention_scale: float
    sliding: tuple[bool, ...]  #: per layer: whether it attends through the window

    @classmethod
    def read(cls, model: ValidatedFile) -> Gemma3Params:
        hp = model.hparams
        window = model.get_int(f"{hp.architecture}.attention.sliding_window")
        if window <= 0:
            raise GGUFMetadataError(f"{model.path}: {hp.architecture}.attention.sliding_window = {window} must be > 0")
        return cls(window, attention_scale(hp, N_LAYER_27B), sliding_layers(model, SWA_PATTERN))


def attention_scale(hp: HyperParameters, n_layer_27b: int) -> float:
    """Gemma's Q scale (llama.cpp's f_attention_scale): 1/sqrtf(n_embd / n_head) for the 27B (``n_layer_27b``
    layers), else 1/sqrtf(head_dim)."""
    size = hp.n_embd // hp.n_head if hp.n_layer == n_layer_27b else hp.head_dim
    return float(np.float32(1.0) / np.sqrt(np.float32(size)))


class ScaledEmbedding:
    """Embedding rows times sqrtf(n_embd) in f32 (Gemma's input scaling)."""

    def __init__(self, inner: Embedding) -> None:
        self.inner, self.n_embd, self.n_vocab = inner, inner.n_embd, inner.n_vocab
        self.scale = np.sqrt(np.float32(inner.n_embd))

    def __call__(self, token_ids: np.ndarray) -> np.ndarray:
        return self.inner(token_ids) * self.scale

    def compiled_rows(self) -> tuple[int, np.ndarray, np.float32] | None:
        """The inner embedding's compiled GET_ROWS with this scale (RowEmbedding.compiled_rows), or None."""
        inner = getattr(self.inner, "compiled_rows", lambda: None)()
        return None if inner is None else (inner[0], inner[1], self.scale)


class Gemma3Block:
    """One sandwich-norm decoder block: pre- and post-norm around attention and around the GeGLU feed-forward."""

    def __init__(
        self, norms: tuple[RMSNorm, RMSNorm, RMSNorm, RMSNorm], attention: SelfAttention, ffn: GatedFFN
    ) -> None:
        self.attn_norm, self.post_attn_norm, self.ffn_norm, self.post_ffw_norm = norms
        self.attention, self.ffn = attention, ffn

    def forward(self, ops: Ops[T], x: T, keep: bool) -> T:
        """Buffer in, buffer out; the last block (``keep``) goes on with only the rows whose logits are wanted."""
        a = self.attention.forward(ops, ops.rms_norm(x, self.attn_norm, "norm"))
        if keep:
            a, x = ops.keep(a, x)
        h = ops.add(ops.rms_norm(a, self.post_attn_norm, "post_norm"), x, "h")
        f = self.ffn.forward(ops, ops.rms_norm(h, self.ffn_norm, "norm"))
        return ops.add(ops.rms_norm(f, self.post_ffw_norm, "post_norm"), h, "x")


def sandwich_block(t: dict[str, Any], eps: float, attention: SelfAttention) -> Gemma3Block:
    """A block of Gemma's sandwich norms (from the block's tensors ``t``) and GeGLU around ``attention``."""
    norm = tuple(RMSNorm(t[f], eps) for f in ("attn_norm", "post_attn_norm", "ffn_norm", "post_ffw_norm"))
    return Gemma3Block(norm, attention, GatedFFN(t["gate"], t["up"], t["down"], gelu=True))


class Gemma3(CausalLM):
    """A gemma3-architecture model from a validated model file."""

    def prepare(self, model: ValidatedFile, top: TensorTable) -> None:
        hp = self.hparams
        self.params = Gemma3Params.read(model)
        self.global_rope = self.rope(hp.rope_freq_base, hp.rope_freq_scale)
        self.local_rope = self.rope(ROPE_FREQ_BASE_SWA, 1.0)

    def block(self, layer: int, t: dict[str, Any]) -> Gemma3Block:
        hp, g = self.hparams, self.params
        sliding = g.sliding[layer]
        attention = SelfAttention.from_tensors(
            layer,
            t,
            self.local_rope if sliding else self.global_rope,
            hp,
            q_norm=RMSNorm(t["q_norm"], hp.rms_eps),
            k_norm=RMSNorm(t["k_norm"], hp.rms_eps),
            q_scale=g.attention_scale,
            window=g.sliding_window if sliding else None,
        )
        return sandwich_block(t, hp.rms_eps, attention)

    def token_embedding(self, rows: Embedding) -> Embedding:
        return ScaledEmbedding(rows)


def gemma3_tensors(arch: Architecture, hp: HyperParameters) -> tuple[TensorTable, TensorTable]:
    """The tensors gemma3 reads, the model's and each block's, by field: (GGUF name, shape, required)."""
    d, q, kv, ff, v, hd = hp.n_embd, hp.n_embd_q, hp.n_embd_kv, hp.n_ff, hp.n_vocab, hp.head_dim
    model: TensorTable = {
        "token_embd": ("token_embd.weight", (d, v), True),
        "output_norm": ("output_norm.weight", (d,), True),
        "output": ("output.weight", (d, v), False),
    }
    block: TensorTable = {
        "attn_norm": ("attn_norm.weight", (d,), True),
        "wq": ("attn_q.weight", (d, q), True),
        "wk": ("attn_k.weight", (d, kv), True),
        "wv": ("attn_v.weight", (d, kv), True),
        "q_norm": ("attn_q_norm.weight", (hd,), True),
        "k_norm": ("attn_k_norm.weight", (hd,), True),
        "wo": ("attn_output.weight", (q, d), True),
        "post_attn_norm": ("post_attention_norm.weight", (d,), True),
        "ffn_norm": ("ffn_norm.weight", (d,), True),
        "gate": ("ffn_gate.weight", (d, ff), True),
        "up": ("ffn_up.weight", (d, ff), True),
        "down": ("ffn_down.weight", (ff, d), True),
        "post_ffw_norm": ("post_ffw_norm.weight", (d,), True),
    }
    return model, block


ROWS = Gemma3.rows = (Architecture("gemma3", RopeType.NEOX, False, False, gemma3_tensors, Gemma3),)
