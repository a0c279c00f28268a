"""The plan of one ubatch: the forward pass as an ordered node list over preallocated buffers, as ggml builds a
graph. :class:`PlanBuilder` is what an architecture's blocks describe themselves to (:class:`~kleidipy.graph.model.Ops`,
as nodes over buffer ids); :func:`build_plan` freezes a model's nodes into the tables the compiled executor reads.

The node and buffer layout: docs/compiled-plan-execution.md."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kleidipy.core.node import NodeKernel
from kleidipy.graph.matmul import node_kernel, same_lhs
from kleidipy.graph.model import Norm, PlannedModel, RepackedWeight, RopeTables

OP_RMS_NORM = 1  #: [op, src, dst, vector, width of a row (head_dim for per-head norms, else 0)]; fparam eps
#: [op, src, dst, weight, 1 when the previous MUL_MAT's packed LHS serves (same input, same packing), the weight's
#: NEON fallback (llama.cpp's SME/NEON hybrid: :func:`~kleidipy.core.threads.sme_columns`) or -1]
OP_MATMUL = 2
OP_ADD = 3  #: [op, a, b, dst]
OP_ADD_ROW = 4  #: [op, buffer, vector] (bias, in place)
OP_SCALE = 5  #: [op, buffer]; fparam the factor (in place)
OP_ROPE = 6  #: [op, buffer, n_heads, rope table]
OP_STORE_KV = 7  #: [op, k, v, layer]
OP_ATTENTION = 8  #: [op, q, dst, layer, n_head, window, soft-cap's f32 bits (0: none)]; fparam the softmax scale
OP_SWIGLU = 9  #: [op, gate, up, dst]
OP_GEGLU = 10  #: [op, gate, up, dst]
OP_KEEP = 11  #: [op, first buffer, second buffer or -1]: keep the rows the run names (moved to the top, in order)
OP_SOFTCAP = 12  #: [op, buffer, 1 when it is the logits' buffer]; fparam the cap (in place: tanhf(x / cap) * cap)
#: the ops' names (as a trace shows them)
OP_NAMES = {
    OP_RMS_NORM: "RMS_NORM",
    OP_MATMUL: "MUL_MAT",
    OP_ADD: "ADD",
    OP_ADD_ROW: "ADD_ROW",
    OP_SCALE: "SCALE",
    OP_ROPE: "ROPE",
    OP_STORE_KV: "STORE_KV",
    OP_ATTENTION: "ATTENTION",
    OP_SWIGLU: "SWIGLU",
    OP_GEGLU: "GEGLU",
    OP_KEEP: "KEEP",
    OP_SOFTCAP: "SOFTCAP",
}

NODE_WIDTH = 8


class NotPlannableError(Exception):
    """The model cannot run as a compiled plan (a weight that is not a jit-executed KleidiAI matmul, or a block
    that does not describe itself); the caller runs it eagerly."""


@dataclass
class MatmulWeight:
    """One repacked weight as the plan calls it: its packed bytes and the routine for m == 1 and m > 1 (``linear``:
    the weight as the runtime holds it, whose prepared kernels a trace names)."""

    name: str
    n: int
    k: int
    rhs: np.ndarray
    gemv: NodeKernel
    gemm: NodeKernel
    linear: RepackedWeight


def _written(row: list[int]) -> tuple[int, ...]:
    """The buffers a node writes (OP_* operand layouts)."""
    op = row[0]
    if op in (OP_RMS_NORM, OP_MATMUL, OP_ATTENTION):
        return (row[2],)
    if op in (OP_ADD, OP_SWIGLU, OP_GEGLU):
        return (row[3],)
    if op in (OP_ADD_ROW, OP_SCALE, OP_ROPE, OP_SOFTCAP):
        return (row[1],)
    return ()  # STORE_KV writes the cache; KEEP moves rows (handled apart)


@dataclass
class PlanBuilder:
    """Collects nodes, buffers, weights, vectors and RoPE tables (see docs/compiled-plan-execution.md)."""

    widths: list[int] = field(default_factory=list)
    nodes: list[list[int]] = field(default_factory=list)
    fparams: list[float] = field(default_factory=list)
    weights: list[MatmulWeight] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    ropes: list[RopeTables] = field(default_factory=list)
    _weight_ids: dict[int, int] = field(default_factory=dict)
    #: by id: the array given and its index (holding it keeps its id from being reused by another array)
    _vector_ids: dict[int, tuple[np.ndarray, int]] = field(default_factory=dict)
    _buffers: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (input buffer, weight) of the last MUL_MAT whose packed LHS is still that of its input, or None
    _packed: tuple[int, int] | None = None

    # --- operands -------------------------------------------------------------------------------
    def buffer(self, name: str, width: int) -> int:
        """A float32 buffer of ``width`` columns; the same name and width give the same buffer (buffers are reused
        from block to block, as ggml's allocator reuses tensors)."""
        key = (name, width)
        if key not in self._buffers:
            self._buffers[key] = len(self.widths)
            self.widths.append(width)
        return self._buffers[key]

    def _vector(self, v: np.ndarray) -> int:
        if id(v) not in self._vector_ids:
            self._vector_ids[id(v)] = (v, len(self.vectors))
            self.vectors.append(np.ascontiguousarray(v, dtype=np.float32))
        return self._vector_ids[id(v)][1]

    def _weight(self, linear: object) -> int:
        if not isinstance(linear, RepackedWeight):
            raise NotPlannableError(f"weight {getattr(linear, 'name', type(linear).__name__)} is not repacked")
        if id(linear) not in self._weight_ids:
            self._weight_ids[id(linear)] = len(self.weights)
            self.weights.append(
                MatmulWeight(
                    linear.name,
                    linear.n,
                    linear.k,
                    linear.gemm.rhs,
                    node_kernel(linear.gemv),
                    node_kernel(linear.gemm),
                    linear,
                )
            )
            if linear.fallback is not None:
                self._weight(linear.fallback)
        return self._weight_ids[id(linear)]

    def _rope(self, rope: RopeTables) -> int:
        for i, r in enumerate(self.ropes):
            if r is rope:
                return i
        self.ropes.append(rope)
        return len(self.ropes) - 1

    def _node(self, op: int, *operands: int, fparam: float = 0.0) -> None:
        row = [op, *operands]
        self.nodes.append(row + [-1] * (NODE_WIDTH - len(row)))
        self.fparams.append(float(fparam))
        if self._packed is not None and (op == OP_KEEP or self._packed[0] in _written(row)):
            self._packed = None  # its input changed (or its rows did)

    # --- nodes ------------------------------------------------------------------------------------
    def rms_norm(self, src: int, norm: Norm, name: str, head_dim: int = 0) -> int:
        """RMSNorm of the rows of ``src`` (of each head_dim slice when ``head_dim``) into buffer ``name``."""
        dst = src if head_dim else self.buffer(name, self.widths[src])
        self._node(OP_RMS_NORM, src, dst, self._vector(norm.weight), head_dim, fparam=norm.eps)
        return dst

    def matmul(self, linear: object, src: int, name: str, bias: np.ndarray | None = None) -> int:
        """``src @ Wᵀ`` (+ bias) into buffer ``name``."""
        w = self._weight(linear)
        weight = self.weights[w]
        if weight.k != self.widths[src]:
            raise NotPlannableError(f"weight of k={weight.k} applied to a buffer of {self.widths[src]} columns")
        dst = self.buffer(name, weight.n)
        prev = self.weights[self._packed[1]] if self._packed is not None and self._packed[0] == src else None
        shared = prev is not None and same_lhs(prev.gemv, weight.gemv) and same_lhs(prev.gemm, weight.gemm)
        fallback = -1 if weight.linear.fallback is None else self._weight_ids[id(weight.linear.fallback)]
        shared = shared and fallback < 0 and prev is not None and prev.linear.fallback is None  # (hybrids pack anew)
        self._node(OP_MATMUL, src, dst, w, int(shared), fallback)
        self._packed = (src, w) if dst != src else None  # (an in-place product changed its input)
        if bias is not None:
            self._node(OP_ADD_ROW, dst, self._vector(bias))
        return dst

    def add(self, a: int, b: int, name: str) -> int:
        dst = self.buffer(name, self.widths[a])
        self._node(OP_ADD, a, b, dst)
        return dst

    def scale(self, buf: int, factor: float) -> int:
        self._node(OP_SCALE, buf, fparam=factor)
        return buf

    def rope(self, buf: int, n_heads: int, rope: RopeTables) -> int:
        self._node(OP_ROPE, buf, n_heads, self._rope(rope))
        return buf

    def store_kv(self, layer: int, k: int, v: int) -> None:
        self._node(OP_STORE_KV, k, v, layer)

    def attention(
        self, layer: int, q: int, n_head: int, scale: float, window: int | None, name: str, cap: float = 0.0
    ) -> int:
        dst = self.buffer(name, self.widths[q])
        bits = int(np.float32(cap).view(np.uint32))
        self._node(OP_ATTENTION, q, dst, layer, n_head, window or 0, bits, fparam=scale)
        return dst

    def softcap(self, buf: int, cap: float, logits: bool = False) -> int:
        """tanhf(x / cap) * cap in place; ``logits``: ``buf`` is the plan's logits (the caller's array at run time)."""
        self._node(OP_SOFTCAP, buf, int(logits), fparam=cap)
        return buf

    def glu(self, gelu: bool, gate: int, up: int, name: str) -> int:
        """silu(gate) * up (SwiGLU), or gelu(gate) * up (GeGLU) into buffer ``name``."""
        dst = self.buffer(name, self.widths[gate])
        self._node(OP_GEGLU if gelu else OP_SWIGLU, gate, up, dst)
        return dst

    def keep(self, *buffers: int) -> tuple[int, ...]:
        """From here on only the rows whose logits are wanted live in the one or two ``buffers`` (the same ids)."""
        if not 1 <= len(buffers) <= 2:
            raise NotPlannableError(f"KEEP moves the rows of one or two buffers, not {len(buffers)}")
        self._node(OP_KEEP, buffers[0], buffers[1] if len(buffers) == 2 else -1)
        return buffers


@dataclass
class Plan:
    """A frozen plan: the node tables and operands the executor reads."""

    nodes: np.ndarray  #: int64 [n_nodes, NODE_WIDTH]
    fparams: np.ndarray  #: float64 [n_nodes]
    widths: list[int]
    weights: list[MatmulWeight]
    vectors: list[np.ndarray]
    ropes: list[RopeTables]
    logits: int  #: the buffer of the logits of the kept rows: the LM head's MUL_MAT (the last node but a final
    #: SOFTCAP) writes it (the executor has it write into the caller's array instead)
    #: the GEMM that takes attention's KQV over an F16 cache when a run has more than one token (the model's
    #: ``kv_gemm``: llama.cpp master's KleidiAI F16 route), or None
    kv_gemm: NodeKernel | None = None


def build_plan(lm: PlannedModel) -> Plan:
    """The plan of one ubatch of ``lm``: every block's own description, the final norm and the LM head.
    NotPlannableError when a block cannot describe itself or a weight is not a repacked jit matmul."""
    hp = lm.hparams
    b = PlanBuilder()
    x = b.buffer("x", hp.n_embd)  # buffer 0: the embedded tokens, written by the caller
    last = len(lm.blocks) - 1
    for i, block in enumerate(lm.blocks):
        describe = getattr(block, "forward", None)
        if describe is None:
            raise NotPlannableError(f"block {type(block).__name__} does not describe itself (forward(ops, x, keep))")
        x = describe(b, x, keep=i == last)
    logits = b.matmul(lm.lm_head, b.rms_norm(x, lm.output_norm, "out_norm"), "logits")
    if b.nodes[-1][0] != OP_MATMUL or b.nodes[-1][2] != logits:  # (a bias on the LM head would add a node)
        raise NotPlannableError("the LM head must be the plan's last node")
    if lm.final_softcap:  # (Gemma 2's final_logit_softcapping: in place, on the caller's logits)
        b.softcap(logits, lm.final_softcap, logits=True)
    return Plan(
        np.array(b.nodes, np.int64).reshape(-1, NODE_WIDTH),
        np.array(b.fparams, np.float64),
        b.widths,
        b.weights,
        b.vectors,
        b.ropes,
        logits,
        lm.kv_gemm,
    )
