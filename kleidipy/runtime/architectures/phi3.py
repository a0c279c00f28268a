"""Phi-3 and Phi-4 (Abdin et al., 2024) as llama.cpp runs them (``llama_model_phi3``, flash attention off): the
llama block (RMSNorm, GQA attention, SwiGLU) with NEOX RoPE, Q scaled by 1/sqrtf(head_dim) after RoPE (softmax
scale 1), fused weights and LongRoPE.

* Fused weights: ``attn_qkv`` holds Q, K and V's rows in that order (or the file has separate ``attn_q/k/v``, as
  llama.cpp's ``create_tensor_qkv`` accepts); ``ffn_up`` holds 2·n_ff rows, the gate first (ggml_swiglu of the
  fused product applies SiLU to its first half). They are split by rows at load into the Q/K/V and gate/up weights
  of the llama block: exact, as each output channel is a row of its own and the quantization blocks run along K,
  so every output value is the one the fused matmul gives.
* LongRoPE: ``rope_factors_long`` when the context (llama.cpp's n_ctx_seq) is past
  ``phi3.rope.scaling.original_context_length`` (default: the training context), else ``rope_factors_short``
  (each optional: none, no factors); both tables times ``phi3.rope.scaling.attn_factor`` (default 1) in f32.
  The file's ``rope.scaling.type`` is none/linear (the converter writes none: llama.cpp reads "linear"), so no
  YaRN ramp.
* ``phi3.attention.sliding_window`` is read by llama.cpp and then disabled (its "Phi SWA is currently disabled"):
  every layer attends to the whole context, here too.

The block and what Phi-3 changes: docs/architectures.md."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kleidipy.runtime.architecture import Architecture, TensorTable, ValidatedFile, read_tensors
from kleidipy.runtime.architectures.llama import Llama
from kleidipy.runtime.gguf_file import GGUFMetadataError, GGUFTensorError
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.layers import SelfAttention
from kleidipy.runtime.weights import LinearFactory

#: fused field -> the fields its row blocks become
FUSED = {"wqkv": ("wq", "wk", "wv"), "gate_up": ("gate", "up")}


class Phi3(Llama):
    """A phi3-architecture model from a validated model file."""

    def prepare(self, model: ValidatedFile, top: TensorTable) -> None:
        hp, a = self.hparams, self.hparams.architecture
        if hp.n_embd_q != hp.n_embd:
            raise GGUFMetadataError(
                f"{model.path}: {a}.attention.head_count * key_length = {hp.n_embd_q} must equal "
                f"embedding_length = {hp.n_embd}"
            )
        _check_qkv(model, phi3_tensors(self.rows[0], hp)[1], hp.n_layer)
        n_ctx_orig = model.get_int(f"{a}.rope.scaling.original_context_length", hp.n_ctx_train)
        attn_factor = model.get_float(f"{a}.rope.scaling.attn_factor", 1.0)
        if n_ctx_orig <= 0 or not (attn_factor > 0 and math.isfinite(attn_factor)):
            raise GGUFMetadataError(
                f"{model.path}: {a}.rope.scaling.original_context_length = {n_ctx_orig} and attn_factor = "
                f"{attn_factor} must be > 0"
            )
        factors = model.vector(top["rope_long" if self.n_ctx > n_ctx_orig else "rope_short"][0])
        if factors is not None and not (np.isfinite(factors).all() and (factors > 0).all()):
            raise GGUFMetadataError(f"{model.path}: the LongRoPE factors must be finite and > 0")
        self.rope_tables = self.rope(hp.rope_freq_base, hp.rope_freq_scale, factors, attn_factor)

    def read_block(self, model: ValidatedFile, table: TensorTable, linear: LinearFactory, layer: int) -> dict[str, Any]:
        """The block's tensors, the fused weights (and a fused Q/K/V bias) split by rows."""
        hp, prefix = self.hparams, f"blk.{layer}."
        rows = {"wqkv": (hp.n_embd, hp.n_embd_kv, hp.n_embd_kv), "gate_up": (hp.n_ff, hp.n_ff)}
        present = {f: e for f, e in table.items() if f not in rows and prefix + e[0] in model.tensors}
        t = read_tensors(model, present, linear, layer)
        for field, parts in FUSED.items():
            if prefix + table[field][0] in model.tensors:
                t.update(zip(parts, model.split_linear(prefix + table[field][0], linear, rows[field]), strict=True))
        biases = ("bq", "bk", "bv")
        if "bqkv" in t:
            t.update(zip(biases, np.split(t.pop("bqkv"), np.cumsum(rows["wqkv"])[:-1]), strict=True))
        elif prefix + table["wqkv"][0] in model.tensors and not all(b in t for b in biases):
            t.update(dict.fromkeys(biases))  # (llama.cpp adds separate biases to a fused product only all three)
        return t

    def attention(self, layer: int, t: dict[str, Any]) -> SelfAttention:
        q_scale = float(np.float32(1.0) / np.sqrt(np.float32(self.hparams.head_dim)))
        return SelfAttention.from_tensors(layer, t, self.rope_tables, self.hparams, q_scale=q_scale)


def _check_qkv(model: ValidatedFile, block: TensorTable, n_layer: int) -> None:
    """Each block has the fused Q/K/V weight or the three separate ones, not both: else one line."""
    for i in range(n_layer):
        have = [f"blk.{i}.{block[f][0]}" in model.tensors for f in ("wqkv", "wq", "wk", "wv")]
        if have[0] == any(have[1:]) or (not have[0] and not all(have[1:])):
            raise GGUFTensorError(
                f"{model.path}: block {i} needs attn_qkv.weight or attn_q/attn_k/attn_v.weight (one of the two)"
            )


def phi3_tensors(arch: Architecture, hp: HyperParameters) -> tuple[TensorTable, TensorTable]:
    """The tensors phi3 reads, the model's and each block's, by field: (GGUF name, shape, required); Q/K/V fused
    or separate (one of the two: :func:`_check_qkv`), with optional biases."""
    d, kv, ff, v = hp.n_embd, hp.n_embd_kv, hp.n_ff, hp.n_vocab
    model: TensorTable = {
        "token_embd": ("token_embd.weight", (d, v), True),
        "output_norm": ("output_norm.weight", (d,), True),
        "output": ("output.weight", (d, v), False),
        "rope_long": ("rope_factors_long.weight", (hp.n_rot // 2,), False),
        "rope_short": ("rope_factors_short.weight", (hp.n_rot // 2,), False),
    }
    block: TensorTable = {
        "attn_norm": ("attn_norm.weight", (d,), True),
        "wqkv": ("attn_qkv.weight", (d, d + 2 * kv), False),
        "bqkv": ("attn_qkv.bias", (d + 2 * kv,), False),
        "wq": ("attn_q.weight", (d, d), False),
        "wk": ("attn_k.weight", (d, kv), False),
        "wv": ("attn_v.weight", (d, kv), False),
        "bq": ("attn_q.bias", (d,), False),
        "bk": ("attn_k.bias", (kv,), False),
        "bv": ("attn_v.bias", (kv,), False),
        "wo": ("attn_output.weight", (d, d), True),
        "ffn_norm": ("ffn_norm.weight", (d,), True),
        "gate_up": ("ffn_up.weight", (d, 2 * ff), True),
        "down": ("ffn_down.weight", (ff, d), True),
    }
    return model, block


ROWS = Phi3.rows = (Architecture("phi3", RopeType.NEOX, False, False, phi3_tensors, Phi3),)
