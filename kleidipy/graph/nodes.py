"""The compiled plan's node routines: one C routine per op (ggml-cpu's ``ggml_compute_forward_<op>``), each thread's
share of a node, reached by address through the plan's table as the kernels are (:mod:`kleidipy.core.node`), so
that a first run compiles (or loads from numba's cache) only the routines its model's nodes use — attention's path
for its head_dim and KV cache type among them. MUL_MAT and KEEP run in the walk itself
(:mod:`kleidipy.graph.walk`).

Every routine is ``routine(table, node, rows, ith, nth)`` (:data:`ROUTINE`): the address of the run's arrays table
(:mod:`kleidipy.graph.tables`), the node's index, the rows live at that node, the thread and the thread count. The
shares: docs/compiled-plan-execution.md."""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from kleidipy.core.node import cfunc_address, indirect_call
from kleidipy.core.numerics import bits_f32
from kleidipy.core.pointers import bool_at, f32_at, f64_at, i64_at
from kleidipy.graph.plan import (
    OP_ADD,
    OP_ADD_ROW,
    OP_ATTENTION,
    OP_GEGLU,
    OP_RMS_NORM,
    OP_ROPE,
    OP_SCALE,
    OP_SOFTCAP,
    OP_STORE_KV,
    OP_SWIGLU,
    Plan,
)
from kleidipy.graph.tables import (
    A_BUFFERS,
    A_COS,
    A_FPARAMS,
    A_GELU,
    A_KCACHES,
    A_KV_GEMM,
    A_NEOX,
    A_NODES,
    A_SCRATCH,
    A_SIN,
    A_VCACHES,
    A_VECTORS,
    RUN_GEMV,
    RUN_M,
    arrays_at,
    i64_2d,
    logits_2d,
    run_table,
    segments,
)
from kleidipy.graph.views import f32_1d, f32_2d, like_4d
from kleidipy.graph.workers import share
from kleidipy.ops import attention, elementwise

#: ``routine(table, node, rows, ith, nth)``: thread ith of nth runs its share of node ``node`` over ``rows`` rows
ROUTINE = types.void(types.int64, types.int64, types.int64, types.int64, types.int64)


@intrinsic
def call_routine(typingctx, fn, table, node, rows, ith, nth):
    """``call_routine(address, table, node, rows, ith, nth)``: the :data:`ROUTINE` at ``address``."""
    return types.void(*([types.int64] * 6)), indirect_call


@numba.njit(cache=True, nogil=True, inline="always")
def _node(table, i):  # pragma: no cover - compiled
    """The arrays' table, node i's operands and the buffers' address table."""
    arrays = arrays_at(table)
    return arrays, i64_2d(arrays, A_NODES)[i], i64_2d(arrays, A_BUFFERS)


@numba.njit(cache=True, nogil=True, inline="always")
def _fparam(arrays, i):  # pragma: no cover - compiled
    return f64_at(arrays[A_FPARAMS, 0], arrays[A_FPARAMS, 1])[i]


def rms_norm(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """RMS_NORM (per head of ``d`` values when d > 0): a share of the rows."""
    arrays, node, buffers = _node(table, i)
    x, out, d = f32_2d(buffers, node[1]), f32_2d(buffers, node[2]), node[4]
    if d > 0:
        per = x.shape[1] // d
        x = x.reshape(x.shape[0] * per, d)
        out = out.reshape(out.shape[0] * per, d)
        lo, hi = share(rows * per, ith, nth)
    else:
        lo, hi = share(rows, ith, nth)
    norm = f32_1d(i64_2d(arrays, A_VECTORS), node[3])
    elementwise.rms_norm(x, norm, np.float32(_fparam(arrays, i)), out, lo, hi)


@numba.njit(cache=True, nogil=True, inline="always")
def _binary(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """Node i's operand buffers [a, b, dst] and thread ith's share of the rows (lo, hi)."""
    _, node, buffers = _node(table, i)
    lo, hi = share(rows, ith, nth)
    return f32_2d(buffers, node[1]), f32_2d(buffers, node[2]), f32_2d(buffers, node[3]), lo, hi


def add(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """ADD: a share of the rows."""
    elementwise.add(*_binary(table, i, rows, ith, nth))


def add_row(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """ADD_ROW (a bias, in place): a share of the rows."""
    arrays, node, buffers = _node(table, i)
    lo, hi = share(rows, ith, nth)
    elementwise.add_row(f32_2d(buffers, node[1]), f32_1d(i64_2d(arrays, A_VECTORS), node[2]), lo, hi)


def scale(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """SCALE (in place): a share of the rows."""
    arrays, node, buffers = _node(table, i)
    lo, hi = share(rows, ith, nth)
    elementwise.scale(f32_2d(buffers, node[1]), np.float32(_fparam(arrays, i)), lo, hi)


def softcap(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """SOFTCAP (in place; on the caller's logits array when the node's buffer is the logits'): a share of the
    elements of the rows."""
    arrays, node, buffers = _node(table, i)
    x = logits_2d(arrays) if node[2] else f32_2d(buffers, node[1])
    lo, hi = share(rows * x.shape[1], ith, nth)
    elementwise.softcap(x, _fparam(arrays, i), lo, hi)


def rope(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """ROPE: a share of the heads, in every segment at its positions."""
    arrays, node, buffers = _node(table, i)
    x, n_heads, c = f32_2d(buffers, node[1]), node[2], node[3]
    heads = x.reshape(x.shape[0], n_heads, x.shape[1] // n_heads)
    cos, sin = f32_2d(i64_2d(arrays, A_COS), c), f32_2d(i64_2d(arrays, A_SIN), c)
    neox = bool_at(arrays[A_NEOX, 0], arrays[A_NEOX, 1])[c]
    lo, hi = share(n_heads, ith, nth)
    segs = segments(arrays)
    for s in range(segs.shape[0]):
        elementwise.rope(heads[segs[s, 2] : segs[s, 3]], cos, sin, segs[s, 1], neox, lo, hi)


def swiglu(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """SWIGLU: a share of the rows."""
    elementwise.swiglu(*_binary(table, i, rows, ith, nth))


def geglu(table, i, rows, ith, nth):  # pragma: no cover - compiled
    """GEGLU: a share of the rows."""
    gate, up, out, lo, hi = _binary(table, i, rows, ith, nth)
    arrays = arrays_at(table)
    elementwise.geglu(gate, up, f32_at(arrays[A_GELU, 0], arrays[A_GELU, 1]), out, lo, hi)


@numba.njit(cache=True, nogil=True, inline="always")
def _store_kv_args(table, i, s, ith, nth, cell):  # pragma: no cover - compiled
    """:func:`~kleidipy.ops.attention.store_kv`'s arguments for segment s: a share of the KV heads."""
    arrays, node, buffers = _node(table, i)
    kcaches, vcaches = i64_2d(arrays, A_KCACHES), i64_2d(arrays, A_VCACHES)
    lo, hi = share(kcaches[0, 2], ith, nth)
    seg = segments(arrays)[s]
    seq, start, r0, r1 = seg[0], seg[1], seg[2], seg[3]
    kc, vc = like_4d(kcaches, seq, cell)[node[3]], like_4d(vcaches, seq, cell)[node[3]]
    return f32_2d(buffers, node[1])[r0:r1], f32_2d(buffers, node[2])[r0:r1], kc, vc, start, r1 - r0, lo, hi


@numba.njit(cache=True, nogil=True)
def _store_kv(table, i, ith, nth, cell):  # pragma: no cover - compiled
    """STORE_KV into a cache of the cells of the type of ``cell``, every segment."""
    for s in range(segments(arrays_at(table)).shape[0]):
        attention.store_kv(*_store_kv_args(table, i, s, ith, nth, cell))


@numba.njit(cache=True, nogil=True, inline="always")
def _attention_args(table, i, s, ith, nth, cell, f16):  # pragma: no cover - compiled
    """:func:`~kleidipy.ops.attention.attention`'s arguments for segment s: a share of the heads when they go evenly
    (or the rows are few), else all heads, every nth group of rows."""
    arrays, node, buffers = _node(table, i)
    q, n_head = f32_2d(buffers, node[1]), node[4]
    heads = q.reshape(q.shape[0], n_head, q.shape[1] // n_head)
    seg = segments(arrays)[s]
    seq, start, r0, r1 = seg[0], seg[1], seg[2], seg[3]
    even = n_head % nth == 0 or r1 - r0 < nth * attention.ROWS
    lo, hi, g0, gstep = (*share(n_head, ith, nth), 0, 1) if even else (0, n_head, ith, nth)
    kcaches, vcaches = i64_2d(arrays, A_KCACHES), i64_2d(arrays, A_VCACHES)
    scratch = f32_at(arrays[A_SCRATCH, 0], (arrays[A_SCRATCH, 1], arrays[A_SCRATCH, 2]))
    return (
        heads[r0:r1],
        like_4d(kcaches, seq, cell)[node[3]],
        like_4d(vcaches, seq, cell)[node[3]],
        start,
        r1 - r0,
        start + r1 - r0,
        np.float32(_fparam(arrays, i)),
        node[5],
        f16,
        f32_2d(buffers, node[2])[r0:r1],
        scratch[ith],
        lo,
        hi,
        g0,
        gstep,
        bits_f32(np.uint32(node[6])),
    )


@numba.njit(cache=True, nogil=True)
def _attention_tiled(table, i, ith, nth, cell, f16):  # pragma: no cover - compiled
    """ATTENTION for a head_dim that is a multiple of 16, every segment."""
    for s in range(segments(arrays_at(table)).shape[0]):
        attention.attention_tiled(*_attention_args(table, i, s, ith, nth, cell, f16))


@numba.njit(cache=True, nogil=True)
def _attention_rows(table, i, ith, nth, cell, f16):  # pragma: no cover - compiled
    """ATTENTION for any head_dim, every segment."""
    for s in range(segments(arrays_at(table)).shape[0]):
        attention.attention_rows(*_attention_args(table, i, s, ith, nth, cell, f16))


@numba.njit(cache=True, nogil=True)
def _attention_kv_gemm(table, i, ith, nth):  # pragma: no cover - compiled
    """ATTENTION over an F16 cache where the plan has a KV-cache GEMM: for a run of more than one token (each row not
    as a decoded token's) the KQV through it (:func:`~kleidipy.ops.attention.attention_kv_gemm`, a share of the
    heads), else :func:`~kleidipy.ops.attention.attention`."""
    arrays = arrays_at(table)
    run = run_table(arrays)
    gemm = run[RUN_M] > 1 and run[RUN_GEMV] == 0
    params = i64_at(arrays[A_KV_GEMM, 0], arrays[A_KV_GEMM, 1])
    for s in range(segments(arrays).shape[0]):
        args = _attention_args(table, i, s, ith, nth, np.uint16(0), True)
        if gemm:
            q, kc, vc, start, m, n_kv, scale, window, _, out = args[:10]
            lo, hi = share(q.shape[1], ith, nth)
            attention.attention_kv_gemm(q, kc, vc, start, m, n_kv, scale, window, out, lo, hi, params, args[15])
        else:
            attention.attention(*args)


# the routines of the ops that read or write the KV cache, one per cell type: F16 as uint16 bits, or float32
def store_kv_f16(table, i, rows, ith, nth):  # pragma: no cover - compiled
    _store_kv(table, i, ith, nth, np.uint16(0))


def store_kv_f32(table, i, rows, ith, nth):  # pragma: no cover - compiled
    _store_kv(table, i, ith, nth, np.float32(0))


def attention_tiled_f16(table, i, rows, ith, nth):  # pragma: no cover - compiled
    _attention_tiled(table, i, ith, nth, np.uint16(0), True)


def attention_tiled_f32(table, i, rows, ith, nth):  # pragma: no cover - compiled
    _attention_tiled(table, i, ith, nth, np.float32(0), False)


def attention_rows_f16(table, i, rows, ith, nth):  # pragma: no cover - compiled
    _attention_rows(table, i, ith, nth, np.uint16(0), True)


def attention_rows_f32(table, i, rows, ith, nth):  # pragma: no cover - compiled
    _attention_rows(table, i, ith, nth, np.float32(0), False)


def attention_kv_gemm_f16(table, i, rows, ith, nth):  # pragma: no cover - compiled
    _attention_kv_gemm(table, i, ith, nth)


#: each op's routine (the walk runs MUL_MAT and KEEP itself), those that touch the KV cache by whether its
#: cells are F16, and attention also by whether head_dim is a multiple of 16
#: (:func:`~kleidipy.ops.attention.attention`'s paths)
ROUTINES: dict[int, Callable] = {
    OP_RMS_NORM: rms_norm,
    OP_ADD: add,
    OP_ADD_ROW: add_row,
    OP_SCALE: scale,
    OP_ROPE: rope,
    OP_SOFTCAP: softcap,
    OP_SWIGLU: swiglu,
    OP_GEGLU: geglu,
}
STORE_KV: dict[bool, Callable] = {True: store_kv_f16, False: store_kv_f32}
ATTENTION: dict[tuple[bool, bool], Callable] = {
    (True, True): attention_tiled_f16,
    (False, True): attention_tiled_f32,
    (True, False): attention_rows_f16,
    (False, False): attention_rows_f32,
}


def routine_addresses(plan: Plan, f16: bool) -> np.ndarray:
    """int64 [n_nodes]: the address of each node's routine for a KV cache of F16 cells (``f16``) or F32, 0 for the
    nodes the walk runs itself (attention over F16 cells through the plan's KV-cache GEMM when it has one); compiles
    (or loads from numba's cache) each routine the plan uses at its first use."""
    out = np.zeros(len(plan.nodes), np.int64)
    for i, (op, a, _, _, n_head, *_) in enumerate(plan.nodes.tolist()):
        if op == OP_STORE_KV:
            fn = STORE_KV[f16]
        elif op == OP_ATTENTION and f16 and plan.kv_gemm is not None:
            fn = attention_kv_gemm_f16
        elif op == OP_ATTENTION:
            fn = ATTENTION[f16, plan.widths[a] // n_head % attention.LANES == 0]
        else:
            fn = ROUTINES.get(op)
        out[i] = 0 if fn is None else cfunc_address(fn, ROUTINE)
    return out
