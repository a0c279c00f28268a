"""A GGUF file as a model: the container (:mod:`kleidipy.runtime.gguf_file`) of a supported architecture, its
hyper-parameters read and every tensor the architecture reads checked (name, shape implied by the
hyper-parameters, type) before anything is loaded, so a bad file fails at once with one line."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from kleidipy.runtime.architecture import Architecture, TensorSchema, tensor_schema
from kleidipy.runtime.architectures import ARCHITECTURES
from kleidipy.runtime.gguf_file import (
    VECTOR_TYPES,
    WEIGHT_TYPES,
    GGUFContainer,
    GGUFTensorError,
    UnsupportedArchitectureError,
)
from kleidipy.runtime.hparams import read_hparams
from kleidipy.runtime.weights import Linear, LinearFactory


class ModelFile(GGUFContainer):
    """A validated GGUF model file of a supported architecture; :attr:`hparams` holds the hyper-parameters and
    :attr:`arch` the architecture's record."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.architecture = self.get_str("general.architecture")
        if self.architecture not in ARCHITECTURES:
            known = ", ".join(sorted(ARCHITECTURES))
            raise UnsupportedArchitectureError(
                f"{self.path}: unsupported architecture '{self.architecture}' (supported: {known})"
            )
        self.arch: Architecture = ARCHITECTURES[self.architecture]
        self.hparams = read_hparams(self, self.architecture, self.arch.rope_type)
        self._check_tensors()

    def __repr__(self) -> str:
        return f"ModelFile({str(self.path)!r}, architecture={self.architecture!r}, tensors={len(self.tensors)})"

    def linear(self, name: str, factory: LinearFactory) -> Linear:
        """The Linear of 2-D weight ``name`` from ``factory`` (the matmul backend); the GGML bytes are released after,
        as the backend's copy replaces them (llama.cpp's repack buffer)."""
        t = self.tensor(name)
        out = factory(name, t.ggml_type, t.shape, t.data)
        self.release(name)
        return out

    def split_linear(self, name: str, factory: LinearFactory, rows: Sequence[int]) -> list[Linear]:
        """The Linears of consecutive row blocks of 2-D weight ``name`` (``rows`` output channels each, in order:
        a fused weight's parts), named ``name[lo:hi]``; exact, as each output channel is a row of its own (the
        quantization blocks run along it). The GGML bytes are released after, as by :meth:`linear`."""
        t = self.tensor(name)
        out, lo = [], 0
        for n in rows:
            out.append(factory(f"{name}[{lo}:{lo + n}]", t.ggml_type, (t.shape[0], n), t.data[lo : lo + n]))
            lo += n
        self.release(name)
        return out

    def vector(self, name: str) -> np.ndarray | None:
        """float32 values of 1-D tensor ``name`` (a norm weight or bias), None when the file has none."""
        return self.tensors[name].to_float() if name in self.tensors else None

    def tensor_schema(self) -> TensorSchema:
        """Every tensor the architecture reads: name -> (shape in ggml order, required)."""
        return tensor_schema(self.arch, self.hparams)

    def _check_tensors(self) -> None:
        arch = self.arch
        per_block = sum(required for _, _, required in arch.tensors(arch, self.hparams)[1].values())
        if per_block * self.hparams.n_layer > len(self.tensors):  # each block has its required tensors at least
            raise GGUFTensorError(
                f"{self.path}: {arch.name}.block_count = {self.hparams.n_layer} but the file has only "
                f"{len(self.tensors)} tensors"
            )
        schema = self.tensor_schema()
        for name in self.tensors:
            if name not in schema:
                raise GGUFTensorError(f"{self.path}: unexpected tensor '{name}' for architecture '{arch.name}'")
        for name, (shape, required) in schema.items():
            t = self.tensors.get(name)
            if t is None:
                if required:
                    raise GGUFTensorError(f"{self.path}: missing tensor '{name}'")
                continue
            if t.shape != shape:
                raise GGUFTensorError(
                    f"{self.path}: tensor '{name}' has shape {list(t.shape)}, expected {list(shape)} "
                    "from the hyper-parameters"
                )
            allowed = WEIGHT_TYPES if len(shape) == 2 else VECTOR_TYPES
            if t.ggml_type not in allowed:
                raise GGUFTensorError(f"{self.path}: tensor '{name}' has unsupported type {t.ggml_type.name}")
