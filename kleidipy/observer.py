"""Watching the runtime and its compiled plan: one :class:`Observer` interface receives their events
(:class:`RepackCall`, :class:`KernelCall`, :class:`NodeRun`, forward passes); ``kleidipy trace`` and the load
progress bar are observers. The module sits below the runtime and the graph, importing neither.

Details: docs/tracing.md."""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.matmul import MatmulKernel
from kleidipy.target import KernelPair


@dataclass
class KernelCall:
    """What one MUL_MAT ran (an observer's ``on_matmul`` event)."""

    weight: str
    kernel: MatmulKernel
    m: int
    n: int
    k: int
    lhs_bytes: int
    rhs_bytes: int
    lhs_seconds: float = 0.0
    matmul_seconds: float = 0.0
    start: float = 0.0  # perf_counter() when the LHS pack began
    lhs_shared: bool = False  # no pack ran: the previous MUL_MAT's packed LHS (same input, same packing) served


@dataclass
class NodeRun:
    """One node of a compiled plan's run (an observer's ``on_node`` event): per thread, the perf_counter seconds of
    its start, of the end of a MUL_MAT's LHS pack (None for other ops) and of its end (before the barrier)."""

    index: int
    op: str  # MUL_MAT, RMS_NORM, ATTENTION, ... (kleidipy.graph.plan.OP_NAMES)
    label: str  # the weight of a MUL_MAT, the layer of a KV store or attention, else ""
    rows: int
    threads: list[tuple[float, float | None, float]]


@dataclass
class RepackCall:
    """What one weight's repack at load did (an observer's ``on_repack`` event)."""

    weight: str
    ggml_type: GGMLType
    pair: KernelPair
    n: int
    k: int
    raw_bytes: int
    packed_bytes: int
    start: float  # perf_counter() when the repack (conversion + pack) began
    seconds: float
    pack_start: float  # the kai_run_rhs_pack_ call alone
    pack_seconds: float
    cached: bool = False  # read from the repack cache: no conversion, no pack (pack_seconds 0)


class Observer:
    """Receives the runtime's events; every method is a no-op here, so an observer overrides what it needs."""

    #: MUL_MAT events cost a timer and a record per matmul: the backend only makes them for observers that say so
    wants_matmuls: bool = False

    def on_repack(self, call: RepackCall) -> None:
        """A weight was repacked at load."""

    def on_matmul(self, call: KernelCall) -> None:
        """A MUL_MAT ran (only for observers with ``wants_matmuls``)."""

    def on_node(self, node: NodeRun) -> None:
        """A node of the compiled plan ran, timed inside the plan (only for observers with ``wants_matmuls``; its
        MUL_MATs are also told to ``on_matmul``)."""

    def on_forward_start(self, n_tokens: int, n_past: int) -> None:
        """A forward pass of ``n_tokens`` tokens starts after ``n_past`` cached positions."""

    def on_forward_end(self, n_tokens: int, n_past: int) -> None:
        """That forward pass ended (also when it raised)."""
