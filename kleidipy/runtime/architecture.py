"""What an architecture module declares (:class:`Architecture`): its name, RoPE pairing, which biases it has, the
tensors it reads with the shapes its hyper-parameters imply, and how to build the model from a validated file
(:class:`ValidatedFile`: what a model reads of it).

:mod:`kleidipy.runtime.architectures` collects the records; :mod:`kleidipy.runtime.model_file` validates a file
against its architecture's record before anything is loaded (the architectures build from it without importing it:
it imports their records).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kleidipy.runtime.gguf_file import GGUFMetadataError, Tensor
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.kv_cache import check_context_size
from kleidipy.runtime.weights import Linear, LinearFactory

#: context size when none is given (capped by the training context), as llama.cpp's CLI default
DEFAULT_N_CTX = 4096
#: name -> (shape in ggml order, required)
TensorSchema = dict[str, tuple[tuple[int, ...], bool]]
#: what an architecture reads, by field: (GGUF name, shape in ggml order, required); a block's names follow "blk.{i}."
TensorTable = dict[str, tuple[str, tuple[int, ...], bool]]


class ValidatedFile(Protocol):
    """What an architecture's model reads of its validated GGUF file (:class:`~kleidipy.runtime.model_file.ModelFile`
    is one): the architecture's name, the hyper-parameters, metadata, tensors, and 2-D weights through a factory
    (whole, or split by rows: a fused weight)."""

    path: Path
    architecture: str
    hparams: HyperParameters

    tensors: dict[str, Tensor]

    def get_int(self, key: str, default: Any = ...) -> int: ...

    def get_float(self, key: str, default: Any = ...) -> float: ...

    def metadata(self, prefix: str | tuple[str, ...] = "") -> dict[str, Any]: ...

    def tensor(self, name: str) -> Tensor: ...

    def linear(self, name: str, factory: LinearFactory) -> Linear: ...

    def split_linear(self, name: str, factory: LinearFactory, rows: Sequence[int]) -> list[Linear]: ...

    def vector(self, name: str) -> np.ndarray | None: ...


def sliding_layers(model: ValidatedFile, n_pattern: int) -> tuple[bool, ...]:
    """Which layers attend through the sliding window, as llama.cpp's ``load_swa_pattern`` reads it: the file's
    ``attention.sliding_window_pattern`` as a bool per layer (an array) or as n (layer il slides when
    il % n < n − 1; 0: every layer); without the key, ``n_pattern``."""
    n_layer, key = model.hparams.n_layer, f"{model.architecture}.attention.sliding_window_pattern"
    value = model.metadata(key).get(key, n_pattern)
    if isinstance(value, list) and len(value) == n_layer and all(isinstance(v, bool) for v in value):
        return tuple(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GGUFMetadataError(
            f"{model.path}: {key} = {str(value)[:60]} must be an integer >= 0 or {n_layer} bools (one per layer)"
        )
    return tuple(value == 0 or layer % value < value - 1 for layer in range(n_layer))


@dataclass(frozen=True)
class Architecture:
    """One decoder-only architecture (a row of the registry; a variant that differs by flags is another row)."""

    name: str
    rope_type: RopeType
    qkv_bias: bool  #: q/k/v projections have biases (required); otherwise they are optional
    output_bias: bool  #: an optional attn_output bias is accepted
    #: (hparams) -> the tensors the architecture reads, the model's and each block's: the one place their names are
    tensors: Callable[[Architecture, HyperParameters], tuple[TensorTable, TensorTable]]
    #: (validated model file, linear factory, ...) -> the CausalLM
    build: Callable[..., Any]


def context_size(hp: HyperParameters, n_ctx: int | None, kv_dtype: type) -> int:
    """The context a model is built for: ``n_ctx``, else the training context capped at DEFAULT_N_CTX; checked
    (positive, its KV cache fits in memory) before any weight is repacked."""
    n_ctx = min(hp.n_ctx_train, DEFAULT_N_CTX) if n_ctx is None else n_ctx
    return check_context_size(n_ctx, hp.n_layer, hp.n_head_kv, hp.head_dim, kv_dtype)


def tensor_schema(arch: Architecture, hp: HyperParameters) -> TensorSchema:
    """Every tensor ``arch`` reads (its tables, each block's under ``blk.{i}.``): name -> (shape, required)."""
    model, block = arch.tensors(arch, hp)
    schema = {name: (shape, required) for name, shape, required in model.values()}
    for i in range(hp.n_layer):
        schema.update({f"blk.{i}.{name}": (shape, required) for name, shape, required in block.values()})
    return schema


def read_tensors(
    model: ValidatedFile, table: TensorTable, linear: LinearFactory, layer: int | None = None
) -> dict[str, Any]:
    """The tensors of ``table`` by field (block ``layer``'s when given: its names follow ``blk.{layer}.``): 2-D
    weights through ``linear`` (the matmul backend), 1-D ones as float32 vectors (None when optional and absent)."""
    prefix = "" if layer is None else f"blk.{layer}."
    out: dict[str, Any] = {}
    for field, (name, shape, _) in table.items():  # (a loop, not a comprehension: one frame in a trace's call stack)
        out[field] = model.linear(prefix + name, linear) if len(shape) == 2 else model.vector(prefix + name)
    return out
