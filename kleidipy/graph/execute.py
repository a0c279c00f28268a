"""The compiled executor: every worker thread walks the plan's node list in one numba function, as ggml-cpu's
``ggml_graph_compute_thread`` does, taking its share of each node by thread index ith/nth with a barrier between
nodes — no Python between nodes.

Shares: a MUL_MAT packs the activations (quantize+pack, mr-row groups) — unless the previous MUL_MAT packed the
same input the same way (K and V after Q, up after gate: the plan marks them) — and then splits the columns in
multiples of n_step, or the mr-row groups when those split more evenly (:mod:`kleidipy.graph.matmul`); RoPE and the
KV-cache write split the heads, attention the heads or, when they do not split evenly, groups of rows (each thread
running its share over every segment of the ubatch: the rows of one sequence, with its own KV cache and positions);
the elementwise nodes split the rows. Every share is computed exactly as the whole is, so the result is the same bits
at every thread count — and the same bits as the eager path (:mod:`kleidipy.runtime.layers`), which runs the same op
functions (:mod:`kleidipy.graph.ops`, :mod:`kleidipy.graph.attention`) and the same kernels node by node from Python.

:class:`CompiledForward` owns a model's plan, its buffers (grown to the largest ubatch seen) and the persistent
workers (:class:`~kleidipy.graph.workers.Workers`, started once); per ubatch Python only fills the run's table (the
token count and the addresses of the arrays that change; for a decoded token the run's entry point sets it,
:func:`decode_run`) and starts the run — which embeds the tokens itself when the embedding has a compiled GET_ROWS
and writes the logits into the caller's array —, calling the compiled function past numba's type dispatch, with every
array in one address table (rows ``A_*``); the workers stay in :func:`serve_plan` between runs and take the next one
without the GIL, and thread 0 publishes such a run, takes its share and waits for the workers' end in one compiled
call (:func:`lead_plan`): a decoded token is one compiled call from Python.
Hand-written because the executor must call the kernels and ops from compiled code on persistent threads; no
maintained library runs a numba graph that way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress
from sys import getrefcount
from time import monotonic_ns as clock_ns
from time import perf_counter
from typing import Any

import numba
import numpy as np

from kleidipy.errors import NonFiniteInputError
from kleidipy.formats.rows import get_rows
from kleidipy.graph import attention, ops
from kleidipy.graph import matmul as mm
from kleidipy.graph.atomics import monotonic_ns
from kleidipy.graph.contention import ThreadChoice
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
    NotPlannableError,
    Plan,
    build_plan,
)
from kleidipy.graph.profile import kernel_call, node_runs
from kleidipy.graph.views import address_table, bool_at, f32_1d, f32_2d, f32_at, f64_at, i64_at, like_4d, u8_1d, u8_at
from kleidipy.graph.workers import (
    SYNC_FIRST_FREE,
    Workers,
    barrier,
    next_run,
    pool_arrays,
    post_again,
    share,
    wait_done,
)
from kleidipy.runtime.kv_cache import KVCache, cells
from kleidipy.runtime.layers import CausalLM, Segment, gelu_f16_table
from kleidipy.runtime.observer import Observer
from kleidipy.runtime.weights import InvalidTokenError

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


#: rows of the table of the arrays run_plan reads (:func:`~kleidipy.graph.views.address_table` of any dtype): the
#: plan's nodes and float parameters; the address tables of the activation buffers, the packed weights, their sizes,
#: kernel codes and parameters, the norm vectors, the RoPE cos/sin tables, whether each RoPE is NeoX; the GELU table;
#: the address tables of the K and V caches; the packed-LHS scratch, attention's scratch [threads, n], the status,
#: the embedding's bytes, the run table and a decoded token's run table (:func:`decode_run`). The table's address is
#: the one argument instead of twenty arrays: numba unboxes every array argument of a call (a reference-counted
#: MemInfo: a malloc, a free, Python reference counts), ~4 µs each when the call runs cold, after the plan streamed the
#: weights through the caches; an int costs nothing.
A_NODES, A_FPARAMS, A_BUFFERS, A_RHS, A_SIZES, A_CODES, A_PARAMS, A_VECTORS, A_COS, A_SIN = range(10)
A_NEOX, A_GELU, A_KCACHES, A_VCACHES, A_LHS, A_SCRATCH, A_STATUS, A_EMBD_ROWS, A_RUN, A_DECODE = range(10, 20)
A_SLOTS = A_DECODE + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _i64_2d(arrays, i):  # pragma: no cover - compiled
    return i64_at(arrays[i, 0], (arrays[i, 1], arrays[i, 2]))


@numba.njit(cache=True, nogil=True)
def run_plan(ith, nth, sync, table, cell, f16, logits_buffer, embd_code, embd_scale):  # pragma: no cover - compiled
    """Thread ith's walk over the plan for a ubatch of m tokens in segments ``segs`` [n, 4] (cache index, first
    position, first row, last row + 1: rows of one sequence, whose KV cache is row ``cache index`` of the address
    tables kcaches/vcaches, of the type of the scalar ``cell``), keeping the rows ``keep`` at the KEEP
    node (see the module docstring); the MUL_MAT into buffer ``logits_buffer`` writes into ``logits`` instead
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
    sizes, codes, params = _i64_2d(arrays, A_SIZES), _i64_2d(arrays, A_CODES), _i64_2d(arrays, A_PARAMS)
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
                ops.scale(x, embd_scale, lo, hi)
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
            code, prm, n, k, w = codes[c, kind], params[2 * c + kind], sizes[c, 0], sizes[c, 1], u8_1d(rhs, c)
            x = f32_2d(buffers, a)
            out = f32_at(run[RUN_LOGITS], (keep.size, run[RUN_N_VOCAB])) if b == logits_buffer else f32_2d(buffers, b)
            if d == 1:  # the previous MUL_MAT packed this input so: no pack, no barrier
                if timed:
                    prof[ith, i, 1] = prof[ith, i, 0]
                mm.matmul(code, prm, rows, n, k, lhs, w, out, ith, nth)
            elif not mm.mul_mat(ith, nth, sync, code, prm, x, rows, lhs, w, out, n, k, status, prof, i):
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
            ops.rms_norm(x, f32_1d(vectors, c), np.float32(fparams[i]), out, lo, hi)
        elif op == OP_ADD:
            lo, hi = share(rows, ith, nth)
            ops.add(f32_2d(buffers, a), f32_2d(buffers, b), f32_2d(buffers, c), lo, hi)
        elif op == OP_ADD_ROW:
            lo, hi = share(rows, ith, nth)
            ops.add_row(f32_2d(buffers, a), f32_1d(vectors, b), lo, hi)
        elif op == OP_SCALE:
            lo, hi = share(rows, ith, nth)
            ops.scale(f32_2d(buffers, a), np.float32(fparams[i]), lo, hi)
        elif op == OP_ROPE:
            x = f32_2d(buffers, a)
            heads = x.reshape(x.shape[0], b, x.shape[1] // b)
            lo, hi = share(b, ith, nth)
            for s in range(segs.shape[0]):
                ops.rope(heads[segs[s, 2] : segs[s, 3]], f32_2d(cos, c), f32_2d(sin, c), segs[s, 1], neox[c], lo, hi)
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
            ops.swiglu(f32_2d(buffers, a), f32_2d(buffers, b), f32_2d(buffers, c), lo, hi)
        elif op == OP_GEGLU:
            lo, hi = share(rows, ith, nth)
            ops.geglu(f32_2d(buffers, a), f32_2d(buffers, b), gelu_table, f32_2d(buffers, c), lo, hi)
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
    ``A_DECODE``) with those three in their slots —, and clear the status of the last run: what Python would do in
    numpy steps, each run cold after the plan streamed the weights through the caches (every argument an int: an
    array argument costs ~4 µs cold to unbox). The entry points run it for a ``token`` >= 0; called alone before
    the first runs of new arguments on the workers."""
    arrays = i64_at(table, (A_SLOTS, 5))
    run = i64_at(arrays[A_RUN, 0], arrays[A_RUN, 1])
    run[:] = i64_at(arrays[A_DECODE, 0], arrays[A_DECODE, 1])
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


def entry_point(fn: numba.core.registry.CPUDispatcher, args: tuple) -> Callable[..., Any] | None:
    """The compiled ``fn`` for the types of ``args`` (called past numba's per-argument type dispatch), or None
    when it is not compiled for them."""
    try:
        return fn.get_overload(tuple(map(fn.typeof_pyval, args)))
    except KeyError:
        return None


class CompiledForward:
    """A model's forward pass as a compiled plan on ``threads`` persistent workers (module docstring)."""

    def __init__(self, lm: CausalLM, threads: int = 1, adaptive: bool = True) -> None:
        self.lm = lm
        self.plan: Plan = build_plan(lm)
        plan = self.plan
        self._rhs_arrays = [np.asarray(w.rhs) for w in plan.weights]  # (kept alive: run_plan reads their addresses)
        self._rhs = address_table(self._rhs_arrays, np.uint8)
        self._sizes = np.array([[w.n, w.k] for w in plan.weights], np.int64)
        self._codes = np.array([[w.gemv.code, w.gemm.code] for w in plan.weights], np.int64)
        width = max(len(k.params) for w in plan.weights for k in (w.gemv, w.gemm))
        self._params = np.zeros((2 * len(plan.weights), width), np.int64)
        for i, w in enumerate(plan.weights):
            self._params[2 * i, : len(w.gemv.params)] = w.gemv.params
            self._params[2 * i + 1, : len(w.gemm.params)] = w.gemm.params
        self._vectors = address_table(plan.vectors, np.float32)
        self._cos = address_table([r.cos for r in plan.ropes], np.float32)
        self._sin = address_table([r.sin for r in plan.ropes], np.float32)
        self._neox = np.array([r.neox for r in plan.ropes], np.bool_)
        self._gelu = gelu_f16_table()
        self._n_logits = plan.widths[plan.logits]
        self._rows = 0
        self._buffers = address_table([], np.float32)
        self._arrays: list[np.ndarray] = []
        self._lhs = np.zeros(0, np.uint8)
        self._scratch = np.zeros((threads, attention.attention_scratch_size(lm.n_ctx, lm.hparams.head_dim)), np.float32)
        self._status = np.zeros(STATUS_INSIDE + 1, np.int64)
        #: the embedding as the run does it (GET_ROWS of its bytes, code >= 0), or -1: the caller embeds in Python
        embd = getattr(lm.embedding, "compiled_rows", lambda: None)()
        self._embd = (-1, np.zeros((0, 0), np.uint8), np.float32(0.0)) if embd is None else embd
        #: the address tables of the K and V arrays of the caches of the last run, and a scalar of their dtype
        self._kv: tuple[np.ndarray, np.ndarray, np.generic] | None = None
        self._kv_caches: list[KVCache] = []
        self._untimed = np.zeros((0, len(plan.nodes), 3), np.int64)
        self._one_segment = np.array([[0, 0, 0, 1]], np.int64)
        self._first_row = np.zeros(1, np.int64)
        #: run_plan's arguments that stay from run to run, and run_plan compiled for their types (None: not known)
        self._static: tuple | None = None
        self._arrays_table = np.zeros((0, 5), np.int64)  # (the address table of the arrays the tuple gives)
        self._run_slots = np.zeros(RUN_SLOTS, np.int64)
        #: a decoded token's run table (decode_run sets its id, position (in _one_segment), logits' address)
        self._decode_slots = np.zeros(RUN_SLOTS, np.int64)
        self._logits: np.ndarray | None = None  # (the last decoded token's, and its address)
        self._logits_at = 0
        self._decode_slots[:RUN_TOKEN] = (
            1, self._untimed.ctypes.data, 0, self._one_segment.ctypes.data, 1, self._first_row.ctypes.data, 1, 0,
            self._n_logits, self._run_slots.ctypes.data + RUN_TOKEN * self._run_slots.itemsize,
        )  # fmt: skip
        #: run_alone and lead_plan compiled for the types of the arguments (None: not known yet)
        self._alone = self._lead = None
        self.workers = Workers(threads)
        self.choice = ThreadChoice(threads, adaptive)
        self._choosing = threads > 1 and adaptive
        self._sync = np.zeros(SYNC_FIRST_FREE, np.int64)  # a run on the calling thread alone (no barrier waits)
        self._sync_at = self._sync.ctypes.data

    @property
    def run_seconds(self) -> float:
        """Seconds spent inside the compiled runs so far, as thread 0 clocks them (the rest of a forward pass, the
        call into numba included, is host Python)."""
        return int(self._status[STATUS_INSIDE]) / 1e9

    def close(self) -> None:
        """Stop the worker threads."""
        self.workers.close()

    def warm_up(self) -> None:
        """Run one token through the plan on a cache of its own, twice (the second: on the workers, lead_plan's first)
        and, when the thread choice probes, on one thread as its probes run (run_alone loaded at the first took ~0.2 s),
        so that numba compiles (or loads from its cache) the executor before the first real token; the choice starts
        afresh afterwards. Activations not finite (weights loaded unchecked): the error is left to the real runs."""
        cache, first = self.lm.new_cache(1), self.choice
        probe = [ThreadChoice(1, False)] if self._choosing else []
        for choice in (first, first, *probe):
            self.choice = choice
            with suppress(NonFiniteInputError):
                self.decode(0, cache, 0)
        self.choice = ThreadChoice(first.threads, first.adaptive)

    def _grow_rows(self, m: int) -> None:
        """Buffers (and the packed-LHS scratch) for ubatches of up to m tokens (more than now)."""
        # (kept alive here, read through their address table; the logits buffer has no rows: the LM head writes out)
        self._arrays = [
            np.zeros((0 if i == self.plan.logits else m, w), np.float32) for i, w in enumerate(self.plan.widths)
        ]
        self._buffers = address_table(self._arrays, np.float32)
        self._lhs = np.zeros(max(k.lhs_bytes(m) for w in self.plan.weights for k in (w.gemv, w.gemm)), np.uint8)
        self._rows = m
        self._static = None

    def _static_args(self) -> tuple:
        """run_plan's arguments after ``sync``: the same tuple until the buffers grow or other KV caches come (a run
        changes only the table ``run`` in it; a decoded token's Python steps run cold after the plan, and the
        workers take the next run of the same tuple without Python)."""
        if self._static is None:
            kc, vc, cell = self._kv
            code, rows, scale = self._embd
            arrays = [  # (rows A_*)
                self.plan.nodes, self.plan.fparams, self._buffers, self._rhs, self._sizes, self._codes, self._params,
                self._vectors, self._cos, self._sin, self._neox, self._gelu, kc, vc, self._lhs, self._scratch,
                self._status, rows, self._run_slots, self._decode_slots,
            ]  # fmt: skip
            self._arrays_table = address_table(arrays, None)  # (the arrays stay alive as attributes of self)
            table = self._arrays_table.ctypes.data
            self._static = (table, cell, self._kv_caches[0].f16, self.plan.logits, code, scale)
            self._alone = self._lead = None
        return self._static

    def __call__(self, ids: np.ndarray, ubatch: Sequence[Segment], keep: np.ndarray) -> np.ndarray:
        """One ubatch of tokens ``ids``, in segments of one sequence each: the logits of the rows ``keep`` (int64,
        increasing) [keep.size, n_vocab] (stored K/V in each segment's cache; the caller advances them)."""
        caches = list(dict.fromkeys(seg.cache for seg in ubatch))
        index = {id(c): i for i, c in enumerate(caches)}
        segs = np.array([[index[id(g.cache)], g.start, g.lo, g.hi] for g in ubatch], np.int64).reshape(-1, 4)
        return self._run(ids, caches, segs, np.ascontiguousarray(keep, np.int64))

    def decode(self, token: int, cache: KVCache, position: int) -> np.ndarray:
        """One token (an id, checked) of the sequence of ``cache`` at ``position``: what ``self([token],
        [Segment(cache, position, 0, 1)], [0])[0]`` gives [n_vocab], without building the segment and row lists or
        reading any array's address (a decoded token's Python time is mostly such steps, each run cold after the
        plan): the run's entry point sets the run table (:func:`decode_run`). The logits go into the array of the last
        decoded token when nothing else holds it any more (its reference count says so: a caller that kept it gets a
        new array), which spares a cold allocation (~10 µs after the plan)."""
        if not self._rows:
            self._grow_rows(1)
        if len(self._kv_caches) != 1 or self._kv_caches[0] is not cache:
            self._use_caches([cache])
        if self._embd[0] < 0:
            self._arrays[0][:1] = self.lm.embedding(np.array([token], np.int64))
        args = self._static_args()
        if self._logits is None or getrefcount(self._logits) > 2:  # (2: the attribute and the argument)
            self._logits = np.empty(self._n_logits, np.float32)
            self._logits_at = self._logits.ctypes.data
        logits, threads, at = self._logits, self.choice.pick(1), self._logits_at
        if threads > 1 and self._lead is None:  # (the first runs of these arguments on the workers)
            decode_run(args[0], token, position, at)
            self._launch(args, [token], 1, threads, ())
        else:  # (the run's entry point sets the run table)
            self._launch(args, [token], 1, threads, (), decode=(token, position, at))
        return logits

    def _run(self, ids: np.ndarray, caches: list[KVCache], segs: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """:meth:`__call__` with the segments as the int64 table run_plan reads (cache index in ``caches``, first
        position, first row, last row + 1)."""
        ids = np.ascontiguousarray(ids, np.int64)
        m = ids.size
        if m > self._rows:
            self._grow_rows(m)
        if self._embd[0] < 0:
            self._arrays[0][:m] = self.lm.embedding(ids)
        if caches != self._kv_caches:  # (KVCache compares by identity)
            self._use_caches(caches)
        threads = self.choice.pick(m)
        watchers = [o for o in self.lm.observers if o.wants_matmuls] if self.lm.observers else ()
        nth = 1 if threads == 1 else self.workers.n_threads  # (a run takes the caller alone or every worker)
        prof = np.zeros((nth, len(self.plan.nodes), 3), np.int64) if watchers else self._untimed
        logits = np.empty((keep.size, self._n_logits), np.float32)
        args = self._static_args()
        self._run_slots[:] = (
            m, prof.ctypes.data, prof.shape[0], segs.ctypes.data, segs.shape[0], keep.ctypes.data, keep.size,
            logits.ctypes.data, self._n_logits, ids.ctypes.data, 0,
        )  # fmt: skip
        self._status[:STATUS_PER_RUN] = 0
        self._launch(args, ids, m, threads, watchers, prof, logits.shape[0])
        return logits

    def _use_caches(self, caches: list[KVCache]) -> None:
        """Runs from now on read and write the KV caches ``caches`` (in this order)."""
        k, v = [cells(c.k) for c in caches], [cells(c.v) for c in caches]
        self._kv = (address_table(k, k[0].dtype), address_table(v, k[0].dtype), k[0].dtype.type(0))
        self._kv_caches = caches
        self._static = None

    def _launch(
        self,
        args: tuple,
        ids: Sequence[int] | np.ndarray,
        m: int,
        threads: int,
        watchers: Sequence[Observer],
        prof: np.ndarray | None = None,
        kept: int = 1,
        decode: tuple[int, int, int] = (-1, 0, 0),
    ) -> None:
        """Run the plan (arguments ``args``, :meth:`_static_args`) on ``threads`` threads with the run table and the
        status as set, or as the entry point sets them for ``decode`` = (token >= 0, position, logits' address)
        (ids ``ids`` of m tokens; ``prof``: the profile array for ``watchers``; ``kept`` rows of logits); raises on a
        run that stopped on an error."""
        # (a run that may compile a function, or load it from numba's cache, tells the thread choice nothing)
        measured = self._choosing and self.choice.timing and (self._alone if threads == 1 else self._lead) is not None
        t0 = perf_counter()
        mono0 = clock_ns() if watchers else 0
        if threads == 1:
            failed = (self._alone or run_alone)(self._sync_at, args, *decode)
        else:
            failed = self.workers.run(run_plan, args, serve_plan, self._lead or lead_plan, decode)
        if measured:
            self.choice.record(m, threads, perf_counter() - t0)
        # compiled for these types now: called past numba's dispatch from the next run (lead_plan: the 2nd on workers)
        if self._alone is None and threads == 1:
            self._alone = entry_point(run_alone, (self._sync_at, args, *decode))
        if self._lead is None and threads > 1:
            self._lead = entry_point(lead_plan, (0, 0, 0, args, *decode))
        if failed:
            status = self._status.tolist()
            if status[STATUS_BAD_TOKEN]:
                shown = [int(i) for i in ids[:8]]
                raise InvalidTokenError(f"token ids must be in [0, {self._embd[1].shape[0]}), got {shown}")
            weight = self.plan.weights[int(self.plan.nodes[status[STATUS_NODE], 3])]
            raise NonFiniteInputError(f"{weight.name}: the activations of this MUL_MAT have NaN/Inf")
        for node in node_runs(self.plan, prof, m, kept, t0 - mono0 / 1e9) if watchers else ():
            for observer in watchers:  # told here, so that their view of the call stack ends in this function
                observer.on_node(node)
                if node.op == "MUL_MAT" and node.rows:
                    observer.on_matmul(kernel_call(self.plan, node))


def compile_model(lm: CausalLM, threads: int = 1, adaptive: bool = True) -> bool:
    """Run ``lm``'s forward pass from now on as one compiled plan on ``threads`` persistent workers (each run on
    all of them, or with ``adaptive`` on the calling thread alone when that measures faster:
    :class:`~kleidipy.graph.contention.ThreadChoice`), bit-identical to the op-by-op path. False (and nothing changes)
    when the model cannot run so: a weight that is not a jit-executed KleidiAI matmul."""
    try:
        compiled = CompiledForward(lm, threads, adaptive)
    except NotPlannableError:
        return False
    if lm.compiled is not None:
        lm.compiled.close()
    lm.compiled = compiled
    return True
