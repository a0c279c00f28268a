"""The compiled walk over a plan's node list: every worker thread runs :func:`run_plan`, as ggml-cpu's
``ggml_graph_compute_thread`` does, taking its share of each node by thread index with a barrier between nodes. Also
:func:`serve_plan`, :func:`run_alone`, :func:`lead_plan`, :func:`decode_run` and the status they report through
(``STATUS_*``; the tables they read: :mod:`kleidipy.graph.tables`).

Hand-written because the executor must call the kernels and ops from compiled code on persistent threads; no
maintained library runs a numba graph that way.

Entry points and each node's share: docs/compiled-plan-execution.md."""

from __future__ import annotations

import numba

from kleidipy.core.node import P_N_STEP, copy
from kleidipy.core.pointers import i64_at, u8_at
from kleidipy.core.threads import sme_columns
from kleidipy.formats.rows import get_rows
from kleidipy.graph import matmul as mm
from kleidipy.graph.atomics import monotonic_ns
from kleidipy.graph.nodes import call_routine
from kleidipy.graph.plan import OP_KEEP, OP_MATMUL
from kleidipy.graph.tables import (
    A_BUFFERS,
    A_DECODE,
    A_EMBD_ROWS,
    A_LHS,
    A_NODES,
    A_PARAMS,
    A_RHS,
    A_ROUTINES,
    A_RUN,
    A_SIZES,
    A_STATUS,
    DECODE_SLOTS,
    DECODE_TOKENS,
    RUN_GEMV,
    RUN_IDS,
    RUN_KEEP,
    RUN_LOGITS,
    RUN_M,
    RUN_N_KEEP,
    RUN_PROF,
    RUN_PROF_THREADS,
    RUN_SEGS,
    RUN_SLOTS,
    RUN_TOKEN,
    arrays_at,
    i64_2d,
    logits_2d,
)
from kleidipy.graph.views import f32_2d, u8_1d
from kleidipy.graph.workers import SYNC_FIRST_FREE, barrier, next_run, pool_arrays, post_again, share, wait_done
from kleidipy.ops import elementwise

#: status slots the run reports through: [0] 1 when a MUL_MAT input held NaN/Inf, [1] that node; [2], [3] thread 0's
#: monotonic ns at the start and the end of its walk; [4] 1 when a token id was out of the embedding's range (nothing
#: ran) — cleared before each run; [5] the ns of every walk so far, thread 0's (the time inside compiled code, dispatch
#: excluded), kept
STATUS_NONFINITE, STATUS_NODE, STATUS_START, STATUS_END, STATUS_BAD_TOKEN, STATUS_INSIDE = range(6)
#: the status slots cleared before each run
STATUS_PER_RUN = STATUS_INSIDE


@numba.njit(cache=True, nogil=True)
def run_plan(ith, nth, sync, table, logits_buffer, embd_code, embd_scale):  # pragma: no cover - compiled
    """Thread ith's walk over the plan for a ubatch of m tokens in segments ``segs`` [n, 4] (cache index, first
    position, first row, last row + 1: rows of one sequence, whose KV cache is row ``cache index`` of the address tables
    kcaches/vcaches), keeping the rows ``keep`` at the KEEP node, each node but MUL_MAT and KEEP by its routine
    (:mod:`kleidipy.graph.nodes`; see docs/compiled-plan-execution.md); the MUL_MAT into buffer ``logits_buffer`` writes
    into ``logits`` instead (the caller's own array: no copy out). With a non-empty ``prof`` [threads, nodes, 3] the
    thread records per node the monotonic ns of its start, of the end of its share of a MUL_MAT's LHS pack (0 for other
    nodes) and of its end (each before the barrier that follows). With ``embd_code`` >= 0 the run first embeds the
    tokens ``ids`` into buffer 0 (GET_ROWS of the embedding's bytes ``embd_rows``,
    :func:`kleidipy.formats.rows.get_rows`, times ``embd_scale`` in f32 unless it is 0), each thread its share of the
    rows. ``m``, ``segs``, ``keep``, ``ids`` and ``prof`` come by address and size in the int64 table ``run`` (slots
    ``RUN_*``), so that the arguments stay the same objects from run to run (until the buffers grow or other KV caches
    come) and the workers can take the next run in :func:`serve_plan`, without Python; the LM head writes the logits
    [keep.size, run[RUN_N_VOCAB]] at the address ``run[RUN_LOGITS]``. Every array comes through the table at address
    ``table`` (rows ``A_*``). Returns 1 when the run stopped on an error (``status`` says which), else 0."""
    arrays = arrays_at(table)
    nodes, routines = i64_2d(arrays, A_NODES), i64_at(arrays[A_ROUTINES, 0], arrays[A_ROUTINES, 1])
    buffers, rhs = i64_2d(arrays, A_BUFFERS), i64_2d(arrays, A_RHS)
    sizes, params = i64_2d(arrays, A_SIZES), i64_2d(arrays, A_PARAMS)
    lhs = u8_at(arrays[A_LHS, 0], arrays[A_LHS, 1])
    status = i64_at(arrays[A_STATUS, 0], arrays[A_STATUS, 1])
    embd_rows = u8_at(arrays[A_EMBD_ROWS, 0], (arrays[A_EMBD_ROWS, 1], arrays[A_EMBD_ROWS, 2]))
    run = i64_at(arrays[A_RUN, 0], arrays[A_RUN, 1])
    m = run[RUN_M]
    prof = i64_at(run[RUN_PROF], (run[RUN_PROF_THREADS], nodes.shape[0], 3))
    keep = i64_at(run[RUN_KEEP], run[RUN_N_KEEP])
    ids = i64_at(run[RUN_IDS], m)
    if ith == 0:
        status[STATUS_START] = monotonic_ns()
    if embd_code >= 0:
        lo, hi = share(m, ith, nth)
        for r in range(lo, hi):
            if ids[r] < 0 or ids[r] >= embd_rows.shape[0]:
                status[STATUS_BAD_TOKEN] = 1
        if status[STATUS_BAD_TOKEN] == 0 and lo < hi:
            x = f32_2d(buffers, 0)
            get_rows(embd_code, embd_rows, ids[lo:hi], x[lo:hi])
            if embd_scale != 0:
                elementwise.scale(x, embd_scale, lo, hi)
        barrier(sync, nth)
        if status[STATUS_BAD_TOKEN] != 0:
            return 1
    rows = m
    timed = prof.shape[0] > 0
    for i in range(nodes.shape[0]):
        if timed:
            prof[ith, i, 0] = monotonic_ns()
        op = nodes[i, 0]
        a, b, c, d = nodes[i, 1], nodes[i, 2], nodes[i, 3], nodes[i, 4]
        if op == OP_MATMUL:
            if rows == 0:
                continue
            kind = 0 if rows == 1 or run[RUN_GEMV] != 0 else 1
            n, e, cols = sizes[c, 0], nodes[i, 5], sizes[c, 0]
            if e >= 0:  # llama.cpp's SME/NEON hybrid: the SME kernel's columns, the fallback's (e) the others
                steps = params[2 * c + 1, P_N_STEP], params[2 * e + 1, P_N_STEP]
                cols = sme_columns(1 if kind == 0 else rows, n, sizes[c, 2], sizes[c, 3], steps[0], steps[1])
                c = c if cols else e
            prm, w = params[2 * c + kind], u8_1d(rhs, c)
            x = f32_2d(buffers, a)
            out = logits_2d(arrays) if b == logits_buffer else f32_2d(buffers, b)
            if d == 1:  # the previous MUL_MAT packed this input so: no pack, no barrier
                if timed:
                    prof[ith, i, 1] = prof[ith, i, 0]
                mm.matmul(prm, rows, n, lhs, w, out, ith, nth)
            elif 0 < cols < n:
                prm2, w2 = params[2 * e + kind], u8_1d(rhs, e)
                if not mm.mul_mat_hybrid(ith, nth, sync, prm, prm2, x, rows, lhs, w, w2, out, n, cols, status, prof, i):
                    status[STATUS_NODE] = i
                    return 1
            elif not mm.mul_mat(ith, nth, sync, prm, x, rows, lhs, w, out, n, status, prof, i):
                status[STATUS_NODE] = i  # (status[STATUS_NONFINITE] is set) every thread stops here
                return 1
        elif op == OP_KEEP:
            if ith == 0:
                for buf in (a, b):
                    if buf >= 0:
                        x = f32_2d(buffers, buf)
                        for r in range(keep.size):
                            if keep[r] != r:
                                copy(x[keep[r]], x[r])
            rows = keep.size
        else:
            call_routine(routines[i], table, i, rows, ith, nth)
        if timed:
            prof[ith, i, 2] = monotonic_ns()
        barrier(sync, nth)
    if ith == 0:
        status[STATUS_END] = monotonic_ns()
        status[STATUS_INSIDE] += status[STATUS_END] - status[STATUS_START]
    return 0


@numba.njit(cache=True, nogil=True)
def decode_run(table, token, position, logits):  # pragma: no cover - compiled
    """Set the run table (in the table at address ``table``, row ``A_RUN``) to a decoded token's: ``token`` at
    ``position`` of the first KV cache, its logits at address ``logits`` [n_vocab] — a copy of the decode template (row
    ``A_DECODE``) with those three in their slots —, ``token`` into that cache's token record at ``position`` (the
    caller counts the position in once the run succeeded), and clear the status of the last run: what Python would do
    in numpy steps, each run cold after the plan streamed the weights through the caches (every argument an int: an
    array argument costs ~4 µs cold to unbox). The entry points run it for a ``token`` >= 0; called alone before
    the first runs of new arguments on the workers."""
    arrays = arrays_at(table)
    run = i64_at(arrays[A_RUN, 0], arrays[A_RUN, 1])
    template = i64_at(arrays[A_DECODE, 0], DECODE_SLOTS)
    copy(template[:RUN_SLOTS], run)
    i64_at(template[DECODE_TOKENS], position + 1)[position] = token
    run[RUN_TOKEN] = token
    run[RUN_LOGITS] = logits
    i64_at(run[RUN_SEGS], (1, 4))[0, 1] = position
    i64_at(arrays[A_STATUS, 0], STATUS_PER_RUN)[:] = 0


@numba.njit(cache=True, nogil=True)
def serve_plan(ith, nth, sync, ctl, seq, spin_ns, *args):  # pragma: no cover - compiled
    """Thread ith (> 0) of a multi-thread run: :func:`run_plan` ``(ith, nth, sync, *args)`` for job ``seq`` and for
    every next run of the same arguments (:meth:`Workers.run`'s ``serve`` loop); returns the last job it ran."""
    while True:
        run_plan(ith, nth, sync, *args)
        nxt = next_run(ctl, seq, spin_ns)
        if nxt < 0:
            return seq
        seq = nxt


@numba.njit(cache=True, nogil=True)
def run_alone(sync_addr, args, token, position, logits):  # pragma: no cover - compiled
    """:func:`run_plan` ``(0, 1, sync at sync_addr, *args)``: a run on the calling thread alone (no barrier waits);
    with ``token`` >= 0 a decoded token's (:func:`decode_run` ``(args[0], token, position, logits)`` first)."""
    if token >= 0:
        decode_run(args[0], token, position, logits)
    return run_plan(0, 1, i64_at(sync_addr, SYNC_FIRST_FREE), *args)


@numba.njit(cache=True, nogil=True)
def lead_plan(nth, ctl_addr, seq, args, token, position, logits):  # pragma: no cover - compiled
    """Thread 0 of a run of the previous run's arguments ``args`` (:meth:`Workers.run`'s ``lead``): a decoded
    token's run table for ``token`` >= 0 (:func:`decode_run`), job ``seq`` published, :func:`run_plan` ``(0, nth,
    sync, *args)``, the workers' end awaited; None (published, not run) when a worker sleeps."""
    if token >= 0:
        decode_run(args[0], token, position, logits)
    ctl, sync = pool_arrays(ctl_addr)
    if not post_again(ctl, sync, seq):
        return None
    failed = run_plan(0, nth, sync, *args)
    wait_done(ctl, nth - 1)
    return failed
