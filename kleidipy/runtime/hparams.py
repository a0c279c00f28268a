"""Hyper-parameters of a decoder-only model, as llama.cpp reads them from a GGUF file (``llama_hparams``), and the
RoPE pairing types. The keys are the llama family's (``{arch}.embedding_length``, ``{arch}.attention.head_count``…);
an architecture module passes its name and RoPE type."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from gguf import GGUFValueType

from kleidipy.runtime.gguf_file import MISSING, GGUFContainer, GGUFMetadataError, UnsupportedModelError


class RopeType(enum.IntEnum):
    """How RoPE pairs the dimensions of a head (llama.cpp's ``LLAMA_ROPE_TYPE_*`` values)."""

    NORM = 0  #: adjacent pairs (x[2i], x[2i+1]): llama
    NEOX = 2  #: halves (x[i], x[i + n_rot/2]): GPT-NeoX, qwen2


@dataclass(frozen=True)
class HyperParameters:
    """The model hyper-parameters of a GGUF file (llama.cpp's ``llama_hparams`` for the supported architectures)."""

    architecture: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  #: per-head size of Q, K and V (attention.key_length, default n_embd / n_head)
    n_ff: int
    n_rot: int  #: number of rotated dimensions per head (rope.dimension_count, default head_dim)
    rms_eps: float
    rope_type: RopeType
    rope_freq_base: float
    rope_freq_scale: float  #: 1 / rope.scaling.factor (linear scaling), 1.0 without scaling
    rope_scaling: str  #: "none", "linear" or (phi3, whose factors are tensors: as linear) "longrope"
    tied_embeddings: bool  #: no output.weight: the LM head is token_embd

    @property
    def n_group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_head // self.n_head_kv

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim


def read_hparams(g: GGUFContainer, arch: str, rope_type: RopeType) -> HyperParameters:
    """The hyper-parameters of a llama-family model (llama.cpp's ``llm_load_hparams`` for these keys), checked."""
    a = arch
    n_embd = g.get_int(f"{a}.embedding_length")
    n_head = _int_or_uniform_array(g, f"{a}.attention.head_count")
    n_layer = g.get_int(f"{a}.block_count")
    n_ctx_train = g.get_int(f"{a}.context_length")
    n_ff = _int_or_uniform_array(g, f"{a}.feed_forward_length")
    for key, value in (
        ("embedding_length", n_embd),
        ("attention.head_count", n_head),
        ("block_count", n_layer),
        ("context_length", n_ctx_train),
        ("feed_forward_length", n_ff),
    ):
        if value <= 0:
            raise GGUFMetadataError(f"{g.path}: {a}.{key} = {value} must be > 0")
    n_head_kv = _int_or_uniform_array(g, f"{a}.attention.head_count_kv", n_head)
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise GGUFMetadataError(
            f"{g.path}: {a}.attention.head_count_kv = {n_head_kv} must divide head_count = {n_head}"
        )
    if g.get_int(f"{a}.expert_count", 0) > 0:
        raise UnsupportedModelError(f"{g.path}: mixture-of-experts models are not supported")
    default_head_dim = n_embd // n_head if n_embd % n_head == 0 else MISSING
    if default_head_dim is MISSING and f"{a}.attention.key_length" not in g:
        raise GGUFMetadataError(f"{g.path}: {a}.embedding_length = {n_embd} is not a multiple of head_count = {n_head}")
    head_dim = g.get_int(f"{a}.attention.key_length", default_head_dim)
    head_dim_v = g.get_int(f"{a}.attention.value_length", head_dim)
    if head_dim <= 0 or head_dim % 2 or head_dim_v != head_dim:
        raise UnsupportedModelError(
            f"{g.path}: head sizes key={head_dim} value={head_dim_v} are not supported (need equal, even, > 0)"
        )
    n_rot = g.get_int(f"{a}.rope.dimension_count", head_dim)
    if n_rot <= 0 or n_rot % 2 or n_rot > head_dim:
        raise GGUFMetadataError(f"{g.path}: {a}.rope.dimension_count = {n_rot} must be even and in 2..{head_dim}")
    rms_eps = g.get_float(f"{a}.attention.layer_norm_rms_epsilon")
    freq_base = g.get_float(f"{a}.rope.freq_base", 10000.0)
    if not (rms_eps > 0 and math.isfinite(rms_eps)) or not (freq_base > 0 and math.isfinite(freq_base)):
        raise GGUFMetadataError(
            f"{g.path}: layer_norm_rms_epsilon = {rms_eps} and rope.freq_base = {freq_base} must be > 0"
        )
    scaling = g.get_str(f"{a}.rope.scaling.type", "none")
    factor = g.get_float(f"{a}.rope.scaling.factor", g.get_float(f"{a}.rope.scale_linear", 0.0))
    if scaling not in ("none", "linear") and (scaling, a) != ("longrope", "phi3"):
        raise UnsupportedModelError(
            f"{g.path}: rope scaling '{scaling}' is not supported (none, linear; longrope for phi3)"
        )
    if factor < 0 or not math.isfinite(factor):
        raise GGUFMetadataError(f"{g.path}: rope scaling factor {factor} must be >= 0")
    n_vocab = _n_vocab(g, a)
    return HyperParameters(
        architecture=a,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=n_ff,
        n_rot=n_rot,
        rms_eps=rms_eps,
        rope_type=rope_type,
        rope_freq_base=freq_base,
        rope_freq_scale=1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor,  # (llama.cpp: none never scales)
        rope_scaling=scaling,
        tied_embeddings="output.weight" not in g.tensors,
    )


def _n_vocab(g: GGUFContainer, a: str) -> int:
    """Vocabulary size: {arch}.vocab_size, else the tokenizer's token count, else token_embd's row count."""
    n_tokens = g.array_length("tokenizer.ggml.tokens")
    n_vocab = g.get_int(f"{a}.vocab_size", n_tokens)
    if n_vocab is None:
        embd = g.tensors.get("token_embd.weight")
        if embd is None or len(embd.shape) != 2:
            raise GGUFMetadataError(f"{g.path}: cannot tell the vocabulary size (no {a}.vocab_size)")
        n_vocab = embd.shape[1]
    if n_vocab <= 0 or (n_tokens is not None and n_tokens != n_vocab):
        raise GGUFMetadataError(f"{g.path}: vocabulary size {n_vocab} does not match the {n_tokens} tokenizer tokens")
    return n_vocab


def _int_or_uniform_array(g: GGUFContainer, key: str, default: Any = MISSING) -> int:
    """llama.cpp's get_key_or_arr for per-layer values: a scalar, or an array whose entries are all equal."""
    if g.value_type(key) != GGUFValueType.ARRAY:
        return g.get_int(key, default)
    values = g.get_array(key)
    if not values or any(v != values[0] for v in values) or not isinstance(values[0], int):
        raise UnsupportedModelError(f"{g.path}: per-layer values of '{key}' are not supported: {values[:8]}")
    return int(values[0])
