"""The compiled walk over a plan's node list: every worker thread runs :func:`run_plan`, as ggml-cpu's
``ggml_graph_compute_thread`` does, taking its share of each node by thread index with a barrier between nodes. Also
:func:`serve_plan`, :func:`run_alone`, :func:`lead_plan`, :func:`decode_run` and the layouts they read (rows ``A_*``,
slots ``RUN_*``, ``STATUS_*``).

Hand-written because the executor must call the kernels and ops from compiled code on persistent threads; no
maintained library runs a numba graph that way.

Entry points and each node's share: docs/compiled-plan-execution.md."""

from __future__ import annotations

import numba
import numpy as np

from kleidipy.core.pointers import bool_at, f32_at, f64_at, i64_at, u8_at
from kleidipy.formats.rows import get_rows
from kleidipy.graph import matmul as mm
from kleidipy.graph.atomics import monotonic_ns
from kleidipy.graph.plan import (
    OP_ADD,
    OP_ADD_ROW,
    OP_ATTENTION,
    OP_GEGLU,
    OP_KEEP,
    OP_MATMUL,
    OP_RMS_NORM,
    OP_ROPE,
    OP_SCALE,
    OP_STORE_KV,
    OP_SWIGLU,
)
from kleidipy.graph.views import f32_1d, f32_2d, like_4d, u8_1d
from kleidipy.graph.workers import SYNC_FIRST_FREE, barrier, next_run, pool_arrays, post_again, share, wait_done
from kleidipy.ops import attention, elementwise

#: status slots the run reports through: [0] 1 when a MUL_MAT input held NaN/Inf, [1] that node; [2], [3] thread 0's
#: monotonic ns at the start and the end of its walk; [4] 1 when a token id was out of the embedding's range (nothing
#: ran) — cleared before each run; [5] the ns of every walk so far, thread 0's (the time inside compiled code, dispatch
#: excluded), kept
STATUS_NONFINITE, STATUS_NODE, STATUS_START, STATUS_END, STATUS_BAD_TOKEN, STATUS_INSIDE = range(6)
#: the status slots cleared before each run
STATUS_PER_RUN = STATUS_INSIDE
#: slots of a run's table: the ubatch's token count, and the address (and size) of each array that changes from run
#: to run: the profile [threads (0: untimed), nodes, 3], the segments [n, 4], the rows kept, the logits
#: [rows kept, n_vocab] (the caller's array: the LM head writes into it) and the token ids
RUN_M, RUN_PROF, RUN_PROF_THREADS, RUN_SEGS, RUN_N_SEGS, RUN_KEEP, RUN_N_KEEP = range(7)
RUN_LOGITS, RUN_N_VOCAB, RUN_IDS = 7, 8, 9
#: a decoded token's id, in the table itself (a decode run's ``ids`` is this slot)
RUN_TOKEN = 10
RUN_SLOTS = 11
#: the decode template's slot past a run table's: the address of the first KV cache's token record
#: (:attr:`~kleidipy.runtime.kv_cache.KVCache.tokens`), where a decoded token writes its id
DECODE_TOKENS = RUN_SLOTS
DECODE_SLOTS = DECODE_TOKENS + 1


#: rows of the table of the arrays run_plan reads (:func:`~kleidipy.graph.views.address_table` of any dtype): the
#: plan's nodes and float parameters; the address tables of the activation buffers, the packed weights, their sizes,
#: their kernels' parameter records (:mod:`kleidipy.core.node`), the norm vectors, the RoPE cos/sin tables, whether
#: each RoPE is NeoX; the GELU table;
#: the address tables of the K and V caches; the packed-LHS scratch, attention's scratch [threads, n], the status,
#: the embedding's bytes, the run table and a decoded token's run table (:func:`decode_run`). The table's address is
#: the one argument instead of twenty arrays: numba unboxes every array argument of a call (a reference-counted
#: MemInfo: a malloc, a free, Python reference counts), ~4 µs each when the call runs cold, after the plan streamed the
#: weights through the caches; an int costs nothing.
A_NODES, A_FPARAMS, A_BUFFERS, A_RHS, A_SIZES, A_PARAMS, A_VECTORS, A_COS, A_SIN, A_NEOX = range(10)
A_GELU, A_KCACHES, A_VCACHES, A_LHS, A_SCRATCH, A_STATUS, A_EMBD_ROWS, A_RUN, A_DECODE = range(10, 19)
A_SLOTS = A_DECODE + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _i64_2d(arrays, i):  # pragma: no cover - compiled
    return i64_at(arrays[i, 0], (arrays[i, 1], arrays[i, 2]))


@numba.njit(cache=True, nogil=True)
def run_plan(ith, nth, sync, table, cell, f16, logits_buffer, embd_code, embd_scale):  # pragma: no cover - compiled
    """Thread ith's walk over the plan for a ubatch of m tokens in segments ``segs`` [n, 4] (cache index, first
    position, first row, last row + 1: rows of one sequence, whose KV cache is row ``cache index`` of the address
    tables kcaches/vcaches, of the type of the scalar ``cell``), keeping the rows ``keep`` at the KEEP
    node (see docs/compiled-plan-execution.md); the MUL_MAT into buffer ``logits_buffer`` writes into ``logits`` instead
    (the caller's own array: no copy out). With a non-empty ``prof`` [threads, nodes, 3] the thread records per
    node the monotonic ns of its start, of the end of its share of a MUL_MAT's LHS pack (0 for other nodes) and
    of its end (each before the barrier that follows). With ``embd_code`` >= 0 the run first embeds the tokens ``ids``
    into buffer 0 (GET_ROWS of the embedding's bytes ``embd_rows``, :func:`kleidipy.formats.rows.get_rows`, times
    ``embd_scale`` in f32 unless it is 0), each thread its share of the rows. ``m``, ``segs``, ``keep``, ``ids`` and
    ``prof`` come by address and size in the int64 table ``run`` (slots ``RUN_*``), so that the arguments stay the
    same objects from run to run (until the buffers grow or other KV caches come) and the workers can take the next
    run in :func:`serve_plan`, without Python; the LM head writes the logits [keep.size, run[RUN_N_VOCAB]] at the
    address ``run[RUN_LOGITS]``. Every array comes through the table at address ``table`` (rows ``A_*``); ``cell``
    gives the KV caches' dtype. Returns 1 when the run stopped on an error (``status`` says which), else 0."""
    arrays = i64_at(table, (A_SLOTS, 5))
    nodes, buffers, rhs = _i64_2d(arrays, A_NODES), _i64_2d(arrays, A_BUFFERS), _i64_2d(arrays, A_RHS)
    fparams = f64_at(arrays[A_FPARAMS, 0], arrays[A_FPARAMS, 1])
    sizes, params = _i64_2d(arrays, A_SIZES), _i64_2d(arrays, A_PARAMS)
    vectors, cos, sin = _i64_2d(arrays, A_VECTORS), _i64_2d(arrays, A_COS), _i64_2d(arrays, A_SIN)
    neox = bool_at(arrays[A_NEOX, 0], arrays[A_NEOX, 1])
    gelu_table = f32_at(arrays[A_GELU, 0], arrays[A_GELU, 1])
    kcaches, vcaches = _i64_2d(arrays, A_KCACHES), _i64_2d(arrays, A_VCACHES)
    lhs = u8_at(arrays[A_LHS, 0], arrays[A_LHS, 1])
    scratch = f32_at(arrays[A_SCRATCH, 0], (arrays[A_SCRATCH, 1], arrays[A_SCRATCH, 2]))
    status = i64_at(arrays[A_STATUS, 0], arrays[A_STATUS, 1])
    embd_rows = u8_at(arrays[A_EMBD_ROWS, 0], (arrays[A_EMBD_ROWS, 1], arrays[A_EMBD_ROWS, 2]))
    run = i64_at(arrays[A_RUN, 0], arrays[A_RUN, 1])
    m = run[RUN_M]
    prof = i64_at(run[RUN_PROF], (run[RUN_PROF_THREADS], nodes.shape[0], 3))
    segs = i64_at(run[RUN_SEGS], (run[RUN_N_SEGS], 4))
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
        a, b, c, d, e = nodes[i, 1], nodes[i, 2], nodes[i, 3], nodes[i, 4], nodes[i, 5]
        if op == OP_MATMUL:
            if rows == 0:
                continue
            kind = 0 if rows == 1 else 1
            prm, n, w = params[2 * c + kind], sizes[c, 0], u8_1d(rhs, c)
            x = f32_2d(buffers, a)
            out = f32_at(run[RUN_LOGITS], (keep.size, run[RUN_N_VOCAB])) if b == logits_buffer else f32_2d(buffers, b)
            if d == 1:  # the previous MUL_MAT packed this input so: no pack, no barrier
                if timed:
                    prof[ith, i, 1] = prof[ith, i, 0]
                mm.matmul(prm, rows, n, lhs, w, out, ith, nth)
            elif not mm.mul_mat(ith, nth, sync, prm, x, rows, lhs, w, out, n, status, prof, i):
                status[STATUS_NODE] = i  # (status[STATUS_NONFINITE] is set) every thread stops here
                return 1
        elif op == OP_RMS_NORM:
            x, out = f32_2d(buffers, a), f32_2d(buffers, b)
            if d > 0:  # per head: rows of head_dim values
                per = x.shape[1] // d
                x = x.reshape(x.shape[0] * per, d)
                out = out.reshape(out.shape[0] * per, d)
                lo, hi = share(rows * per, ith, nth)
            else:
                lo, hi = share(rows, ith, nth)
            elementwise.rms_norm(x, f32_1d(vectors, c), np.float32(fparams[i]), out, lo, hi)
        elif op == OP_ADD:
            lo, hi = share(rows, ith, nth)
            elementwise.add(f32_2d(buffers, a), f32_2d(buffers, b), f32_2d(buffers, c), lo, hi)
        elif op == OP_ADD_ROW:
            lo, hi = share(rows, ith, nth)
            elementwise.add_row(f32_2d(buffers, a), f32_1d(vectors, b), lo, hi)
        elif op == OP_SCALE:
            lo, hi = share(rows, ith, nth)
            elementwise.scale(f32_2d(buffers, a), np.float32(fparams[i]), lo, hi)
        elif op == OP_ROPE:
            x = f32_2d(buffers, a)
            heads = x.reshape(x.shape[0], b, x.shape[1] // b)
            lo, hi = share(b, ith, nth)
            for s in range(segs.shape[0]):
                elementwise.rope(
                    heads[segs[s, 2] : segs[s, 3]], f32_2d(cos, c), f32_2d(sin, c), segs[s, 1], neox[c], lo, hi
                )
        elif op == OP_STORE_KV:
            lo, hi = share(kcaches[0, 2], ith, nth)
            for s in range(segs.shape[0]):
                seq, start, r0, r1 = segs[s, 0], segs[s, 1], segs[s, 2], segs[s, 3]
                kc, vc = like_4d(kcaches, seq, cell)[c], like_4d(vcaches, seq, cell)[c]
                attention.store_kv(f32_2d(buffers, a)[r0:r1], f32_2d(buffers, b)[r0:r1], kc, vc, start, r1 - r0, lo, hi)
        elif op == OP_ATTENTION:
            q = f32_2d(buffers, a)
            heads = q.reshape(q.shape[0], d, q.shape[1] // d)
            for s in range(segs.shape[0]):
                seq, start, r0, r1 = segs[s, 0], segs[s, 1], segs[s, 2], segs[s, 3]
                # heads split when they go evenly (or the rows are few), else all heads, every nth group of rows
                even = d % nth == 0 or r1 - r0 < nth * attention.ROWS
                lo, hi, g0, gstep = (*share(d, ith, nth), 0, 1) if even else (0, d, ith, nth)
                attention.attention(
                    heads[r0:r1],
                    like_4d(kcaches, seq, cell)[c],
                    like_4d(vcaches, seq, cell)[c],
                    start,
                    r1 - r0,
                    start + r1 - r0,
                    np.float32(fparams[i]),
                    e,
                    f16,
                    f32_2d(buffers, b)[r0:r1],
                    scratch[ith],
                    lo,
                    hi,
                    g0,
                    gstep,
                )
        elif op == OP_SWIGLU:
            lo, hi = share(rows, ith, nth)
            elementwise.swiglu(f32_2d(buffers, a), f32_2d(buffers, b), f32_2d(buffers, c), lo, hi)
        elif op == OP_GEGLU:
            lo, hi = share(rows, ith, nth)
            elementwise.geglu(f32_2d(buffers, a), f32_2d(buffers, b), gelu_table, f32_2d(buffers, c), lo, hi)
        elif op == OP_KEEP:
            if ith == 0:
                for buf in (a, b):
                    if buf >= 0:
                        x = f32_2d(buffers, buf)
                        for r in range(keep.size):
                            if keep[r] != r:
                                x[r, :] = x[keep[r], :]
            rows = keep.size
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
    arrays = i64_at(table, (A_SLOTS, 5))
    run = i64_at(arrays[A_RUN, 0], arrays[A_RUN, 1])
    template = i64_at(arrays[A_DECODE, 0], DECODE_SLOTS)
    run[:] = template[:RUN_SLOTS]
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
