"""What an architecture module declares (:class:`Architecture`): its name, RoPE pairing, which biases it has, the
tensors it reads with the shapes its hyper-parameters imply, and how to build the model from a validated file.

:mod:`kleidipy.runtime.architectures` collects the records; :mod:`kleidipy.runtime.model_file` validates a file
against its architecture's record before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kleidipy.runtime.hparams import HyperParameters, RopeType

#: name -> (shape in ggml order, required)
TensorSchema = dict[str, tuple[tuple[int, ...], bool]]


@dataclass(frozen=True)
class Architecture:
    """One decoder-only architecture (a row of the registry; a variant that differs by flags is another row)."""

    name: str
    rope_type: RopeType
    qkv_bias: bool  #: q/k/v projections have biases (required); otherwise they are optional
    output_bias: bool  #: an optional attn_output bias is accepted
    #: (hparams) -> every tensor the architecture reads
    tensor_schema: Callable[[Architecture, HyperParameters], TensorSchema]
    #: (validated model file, linear factory, ...) -> the CausalLM
    build: Callable[..., Any]
