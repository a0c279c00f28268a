"""SmolLM3 (Hugging Face, 2025) as llama.cpp runs it (``llama_model_smollm3``): the llama block with NORM RoPE,
except that every fourth layer (il + 1 divisible by 4: layers 3, 7, 11, ...) applies no RoPE at all (NoPE). The
interval is fixed in llama.cpp (``n_no_rope_layer_step = 4``), not a metadata key; the softmax scale is
1/sqrt(head_dim) (llama.cpp reads no ``attention.scale`` for smollm3); no ``rope_freqs``.

The block and what SmolLM3 changes: docs/architectures.md."""

from __future__ import annotations

from typing import Any

from kleidipy.runtime.architecture import Architecture, TensorTable, ValidatedFile
from kleidipy.runtime.architectures.llama import Llama, check_whole_heads_rotated, llama_tensors
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.layers import SelfAttention

NO_ROPE_LAYER_STEP = 4  #: llama.cpp's hparams.n_no_rope_layer_step for smollm3


class SmolLM3(Llama):
    """A smollm3-architecture model from a validated model file."""

    def prepare(self, model: ValidatedFile, top: TensorTable) -> None:
        check_whole_heads_rotated(model)
        super().prepare(model, top)

    def attention(self, layer: int, t: dict[str, Any]) -> SelfAttention:
        rope = None if (layer + 1) % NO_ROPE_LAYER_STEP == 0 else self.rope_tables
        return SelfAttention.from_tensors(layer, t, rope, self.hparams)


def smollm3_tensors(arch: Architecture, hp: HyperParameters) -> tuple[TensorTable, TensorTable]:
    """The llama tables without ``rope_freqs``."""
    model, block = llama_tensors(arch, hp)
    del model["rope_freqs"]
    return model, block


ROWS = SmolLM3.rows = (Architecture("smollm3", RopeType.NORM, False, False, smollm3_tensors, SmolLM3),)
