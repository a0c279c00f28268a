"""A timed run of the compiled plan told as the runtime's observers hear the op-by-op path: the per-node,
per-thread monotonic ns stamps that :func:`~kleidipy.graph.walk.run_plan` records (its ``prof`` array, as
ggml's graph profiling does) turned into :class:`~kleidipy.observer.NodeRun` events, and a MUL_MAT node
into the :class:`~kleidipy.observer.KernelCall` that `kleidipy trace` shows.
"""

from __future__ import annotations

import numpy as np

from kleidipy.graph.plan import OP_ATTENTION, OP_KEEP, OP_MATMUL, OP_NAMES, OP_STORE_KV, Plan
from kleidipy.observer import KernelCall, NodeRun


def node_runs(plan: Plan, prof: np.ndarray, m: int, kept: int, offset: float) -> list[NodeRun]:
    """The nodes of a timed run of m tokens keeping ``kept`` rows (``prof`` [threads, nodes, 3]), their monotonic ns
    stamps turned into perf_counter seconds (``offset`` apart)."""
    out, rows = [], m
    for i, node in enumerate(plan.nodes):
        op = int(node[0])
        if not prof[:, i, 2].any():  # not run (a MUL_MAT of no rows: stamped at its start, never at an end)
            continue
        if op == OP_MATMUL:
            label = plan.weights[int(node[3])].name
        else:
            label = f"layer {int(node[3])}" if op in (OP_STORE_KV, OP_ATTENTION) else ""
        threads = [
            (t0 / 1e9 + offset, t1 / 1e9 + offset if t1 else None, t2 / 1e9 + offset)
            for t0, t1, t2 in prof[:, i].tolist()
        ]
        out.append(NodeRun(i, OP_NAMES[op], label, rows, threads))
        if op == OP_KEEP:
            rows = kept
    return out


def kernel_call(plan: Plan, node: NodeRun, gemv: bool = False) -> KernelCall:
    """A MUL_MAT node's run as the eager path reports one: the LHS pack from the first thread's start to the last
    thread's pack end, the kernel (after the barrier) from there to the last thread's end (``gemv``: the run took
    every matmul's GEMV)."""
    weight = plan.weights[int(plan.nodes[node.index, 3])]
    run, code = (weight.linear.gemv, weight.gemv) if node.rows == 1 or gemv else (weight.linear.gemm, weight.gemm)
    start = min(t[0] for t in node.threads)
    packed = max(t[1] for t in node.threads)
    end = max(t[2] for t in node.threads)
    lhs_bytes = code.lhs_bytes(node.rows)
    call = KernelCall(weight.name, run.kernel, node.rows, weight.n, weight.k, lhs_bytes, int(weight.rhs.nbytes))
    call.lhs_seconds, call.matmul_seconds, call.start = packed - start, end - packed, start
    call.lhs_shared = plan.nodes[node.index, 4] == 1
    return call
