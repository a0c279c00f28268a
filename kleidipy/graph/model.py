"""The model as the compiled plan sees it: the :class:`typing.Protocol` s that the runtime's objects satisfy -- a
causal LM (:class:`PlannedModel`), its KV caches (:class:`KVCells`), the segments of a ubatch
(:class:`UbatchSegment`), its norms, RoPE tables and repacked weights. The runtime (:mod:`kleidipy.runtime`) sits
above the graph, as llama.cpp's model code sits above ggml: it hands these objects in, and the graph imports nothing
of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from kleidipy.core.matmul import PreparedMatmul
from kleidipy.core.node import NodeKernel
from kleidipy.observer import Observer


@runtime_checkable
class RepackedWeight(Protocol):
    """A weight the plan can multiply by: repacked for a KleidiAI kernel pair, prepared for m == 1 (``gemv``) and
    m > 1 (``gemm``) (:class:`~kleidipy.runtime.backend.RepackedLinear`); with a ``fallback`` (the weight repacked
    for the NEON pair), llama.cpp's SME/NEON hybrid with the SME kernels on ``sme_threads`` threads."""

    name: str
    n: int
    k: int
    gemv: PreparedMatmul
    gemm: PreparedMatmul
    fallback: RepackedWeight | None
    sme_threads: int


class Norm(Protocol):
    """An RMSNorm: its weight [n] and eps."""

    weight: np.ndarray
    eps: float


class RopeTables(Protocol):
    """A RoPE: its cos and sin tables [n_ctx, n_rot/2] and its pairing (NEOX halves, else adjacent pairs)."""

    cos: np.ndarray
    sin: np.ndarray
    neox: bool


class KVCells(Protocol):
    """One sequence's KV cache: K and V of every layer in :mod:`kleidipy.ops.attention`'s layout (float16, then
    ``f16``, or float32) and the token id at each cell (a decoded token's run writes it)."""

    k: np.ndarray
    v: np.ndarray
    f16: bool
    tokens: np.ndarray


class UbatchSegment(Protocol):
    """Rows lo..hi-1 of a ubatch: tokens of one sequence at positions start.., whose KV cache is ``cache``."""

    cache: KVCells
    start: int
    lo: int
    hi: int


class ModelSizes(Protocol):
    """The hyper-parameters the plan reads."""

    n_embd: int
    head_dim: int


T = TypeVar("T")


class Ops(Protocol[T]):
    """What a block describes itself to (``forward(ops, x, keep)``, once per architecture): the ops of a forward
    pass over values ``T``. The compiled plan's :class:`~kleidipy.graph.plan.PlanBuilder` records them as nodes
    over buffer ids; the runtime's ``EagerOps`` runs each at once on arrays (the op-by-op execution). Each returns
    the value it wrote (some write in place: use what they return)."""

    def rms_norm(self, src: T, norm: Norm, name: str, head_dim: int = 0) -> T: ...
    def matmul(self, linear: object, src: T, name: str, bias: np.ndarray | None = None) -> T: ...
    def add(self, a: T, b: T, name: str) -> T: ...
    def scale(self, buf: T, factor: float) -> T: ...
    def rope(self, buf: T, n_heads: int, rope: RopeTables) -> T: ...
    def store_kv(self, layer: int, k: T, v: T) -> None: ...
    def attention(
        self, layer: int, q: T, n_head: int, scale: float, window: int | None, name: str, cap: float = 0.0
    ) -> T: ...
    def softcap(self, buf: T, cap: float) -> T: ...
    def glu(self, gelu: bool, gate: T, up: T, name: str) -> T: ...
    def keep(self, *values: T) -> tuple[T, ...]: ...


class PlannedModel(Protocol):
    """A causal LM the plan runs: the embedding (optionally with a compiled GET_ROWS, ``compiled_rows()``), the
    blocks (each describing itself once, ``forward(ops, x, keep)``: :class:`Ops`), the final norm and the LM head,
    the KV-cache GEMM of its kernel table; its observers, and the compiled forward pass it then runs
    (:func:`~kleidipy.graph.execute.compile_model` sets it)."""

    hparams: ModelSizes
    n_ctx: int
    final_softcap: float | None  #: the logits' soft-cap (Gemma 2's final_logit_softcapping), or None
    embedding: Callable[[np.ndarray], np.ndarray]
    blocks: Sequence[object]
    output_norm: Norm
    lm_head: object
    observers: list[Observer]
    compiled: Any
    kv_gemm: NodeKernel | None  #: the GEMM of attention's KQV over an F16 cache for more than one token, or None

    def new_cache(self, n_ctx: int | None = None) -> KVCells: ...
