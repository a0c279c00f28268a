"""The compiled forward pass's owner: :class:`CompiledForward` holds a model's plan, its buffers and the persistent
workers, and starts each run of the compiled walk (:mod:`kleidipy.graph.walk`): a decoded token is one compiled call
from Python.

What Python does per ubatch: docs/compiled-plan-execution.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress
from sys import getrefcount
from time import monotonic_ns as clock_ns
from time import perf_counter
from typing import Any

import numba
import numpy as np

from kleidipy.errors import InvalidTokenError, NonFiniteInputError
from kleidipy.graph.contention import ThreadChoice
from kleidipy.graph.matmul import second_lhs
from kleidipy.graph.model import KVCells, PlannedModel, UbatchSegment
from kleidipy.graph.nodes import routine_addresses
from kleidipy.graph.plan import OP_MATMUL, MatmulWeight, NotPlannableError, Plan, build_plan
from kleidipy.graph.profile import PlanClock, kernel_calls, node_runs
from kleidipy.graph.tables import (
    DECODE_SLOTS,
    DECODE_TOKENS,
    RUN_GEMV,
    RUN_PROF,
    RUN_PROF_THREADS,
    RUN_SLOTS,
    RUN_TOKEN,
)
from kleidipy.graph.views import address_table
from kleidipy.graph.walk import (
    STATUS_BAD_TOKEN,
    STATUS_INSIDE,
    STATUS_NODE,
    STATUS_PER_RUN,
    decode_run,
    lead_plan,
    run_alone,
    run_plan,
    serve_plan,
)
from kleidipy.graph.workers import SYNC_FIRST_FREE, Workers
from kleidipy.observer import Observer
from kleidipy.ops import attention
from kleidipy.ops.attention import cells
from kleidipy.ops.elementwise import gelu_f16_table


def entry_point(fn: numba.core.registry.CPUDispatcher, args: tuple) -> Callable[..., Any] | None:
    """The compiled ``fn`` for the types of ``args`` (called past numba's per-argument type dispatch), or None
    when it is not compiled for them."""
    try:
        return fn.get_overload(tuple(map(fn.typeof_pyval, args)))
    except KeyError:
        return None


class CompiledForward:
    """A model's forward pass as a compiled plan on ``threads`` persistent workers (docs/compiled-plan-execution.md)."""

    def __init__(self, lm: PlannedModel, threads: int = 1, adaptive: bool = True) -> None:
        self.lm = lm
        self.plan: Plan = build_plan(lm)
        plan = self.plan
        self._rhs_arrays = [np.asarray(w.rhs) for w in plan.weights]  # (kept alive: run_plan reads their addresses)
        self._rhs = address_table(self._rhs_arrays, np.uint8)
        #: n, k, and for llama.cpp's hybrid the thread count it decides on (this plan's) and the SME threads
        self._sizes = np.array([[w.n, w.k, threads, w.linear.sme_threads] for w in plan.weights], np.int64)
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
        self._kv_gemm = np.zeros(0, np.int64) if plan.kv_gemm is None else plan.kv_gemm.params
        self._status = np.zeros(STATUS_INSIDE + 1, np.int64)
        #: the embedding as the run does it (GET_ROWS of its bytes, code >= 0), or -1: the caller embeds in Python
        embd = getattr(lm.embedding, "compiled_rows", lambda: None)()
        self._embd = (-1, np.zeros((0, 0), np.uint8), np.float32(0.0)) if embd is None else embd
        #: the address tables of the K and V arrays of the caches of the last run, and whether their cells are F16
        self._kv: tuple[np.ndarray, np.ndarray, bool] | None = None
        #: the address of each node's routine (:mod:`kleidipy.graph.nodes`), by whether the KV cells are F16
        self._routines: dict[bool, np.ndarray] = {}
        self._kv_caches: list[KVCells] = []
        self._untimed = np.zeros((0, len(plan.nodes), 3), np.int64)
        self._one_segment = np.array([[0, 0, 0, 1]], np.int64)
        self._first_row = np.zeros(1, np.int64)
        #: run_plan's arguments that stay from run to run, and run_plan compiled for their types (None: not known)
        self._static: tuple | None = None
        self._arrays_table = np.zeros((0, 5), np.int64)  # (the address table of the arrays the tuple gives)
        self._run_slots = np.zeros(RUN_SLOTS, np.int64)
        #: a decoded token's run table (decode_run sets its id, position (in _one_segment), logits' address), and the
        #: address of the first KV cache's token record
        self._decode_slots = np.zeros(DECODE_SLOTS, np.int64)
        self._logits: np.ndarray | None = None  # (the last decoded token's, and its address)
        self._logits_at = 0
        self._decode_slots[:RUN_TOKEN] = (
            1,
            self._untimed.ctypes.data,
            0,
            self._one_segment.ctypes.data,
            1,
            self._first_row.ctypes.data,
            1,
            0,
            self._n_logits,
            self._run_slots.ctypes.data + RUN_TOKEN * self._run_slots.itemsize,
        )
        #: run_alone and lead_plan compiled for the types of the arguments (None: not known yet)
        self._alone = self._lead = None
        #: the KV cache whose decoded tokens take decode's short way (None: none yet, or the arguments changed)
        self._decoding: KVCells | None = None
        self.workers = Workers(threads)
        self.choice = ThreadChoice(threads, adaptive)
        self._choosing = threads > 1 and adaptive
        self._sync = np.zeros(SYNC_FIRST_FREE, np.int64)  # a run on the calling thread alone (no barrier waits)
        self._sync_at = self._sync.ctypes.data
        #: the plan's per-node timers kept on (:meth:`start_clock`), or None: runs unobserved are untimed
        self.clock: PlanClock | None = None

    @property
    def run_seconds(self) -> float:
        """Seconds spent inside the compiled runs so far, as thread 0 clocks them (the rest of a forward pass, the
        call into numba included, is host Python)."""
        return int(self._status[STATUS_INSIDE]) / 1e9

    def start_clock(self) -> PlanClock:
        """Time every run from now on by the plan's own per-node stamps, summed per kernel and op after each run
        (:class:`~kleidipy.graph.profile.PlanClock`; a decoded token keeps its short way): the clock, made once."""
        if self.clock is None:
            self.clock = PlanClock(self.plan, self.workers.n_threads)
            self._decode_slots[RUN_PROF] = self.clock.prof.ctypes.data
            self._decode_slots[RUN_PROF_THREADS] = self.clock.prof.shape[0]
        return self.clock

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
        hybrid = [second_lhs(w.gemm.record, m) + self.plan.weights[f].gemm.lhs_bytes(m) for w, f in self._fallbacks()]
        single = [k.lhs_bytes(m) for w in self.plan.weights for k in (w.gemv, w.gemm)]
        self._lhs = np.zeros(max(single + hybrid), np.uint8)
        self._rows = m
        self._static = self._decoding = None

    def _fallbacks(self) -> list[tuple[MatmulWeight, int]]:
        """The weights of the plan's hybrid MUL_MATs and their fallbacks' index."""
        nodes = self.plan.nodes.tolist()
        return [(self.plan.weights[row[3]], row[5]) for row in nodes if row[0] == OP_MATMUL and row[5] >= 0]

    def _static_args(self) -> tuple:
        """run_plan's arguments after ``sync``: the same tuple until the buffers grow or other KV caches come (a run
        changes only the table ``run`` in it; a decoded token's Python steps run cold after the plan, and the
        workers take the next run of the same tuple without Python)."""
        if self._static is None:
            kc, vc, f16 = self._kv
            code, rows, scale = self._embd
            if f16 not in self._routines:  # (compiles, or loads from numba's cache, the routines the plan uses)
                self._routines[f16] = routine_addresses(self.plan, f16)
            arrays = [  # (rows A_*)
                self.plan.nodes,
                self.plan.fparams,
                self._routines[f16],
                self._buffers,
                self._rhs,
                self._sizes,
                self._params,
                self._vectors,
                self._cos,
                self._sin,
                self._neox,
                self._gelu,
                kc,
                vc,
                self._lhs,
                self._scratch,
                self._status,
                rows,
                self._run_slots,
                self._decode_slots,
                self._kv_gemm,
            ]
            self._arrays_table = address_table(arrays, None)  # (the arrays stay alive as attributes of self)
            table = self._arrays_table.ctypes.data
            self._static = (table, self.plan.logits, code, scale)
            self._alone = self._lead = None
        return self._static

    def __call__(
        self, ids: np.ndarray, ubatch: Sequence[UbatchSegment], keep: np.ndarray, gemv: bool = False
    ) -> np.ndarray:
        """One ubatch of tokens ``ids``, in segments of one sequence each: the logits of the rows ``keep`` (int64,
        increasing) [keep.size, n_vocab] (stored K/V in each segment's cache; the caller advances them). ``gemv``:
        every MUL_MAT through its GEMV, whatever the rows (each row as a decoded token's)."""
        caches = list(dict.fromkeys(seg.cache for seg in ubatch))
        index = {id(c): i for i, c in enumerate(caches)}
        segs = np.array([[index[id(g.cache)], g.start, g.lo, g.hi] for g in ubatch], np.int64).reshape(-1, 4)
        return self._run(ids, caches, segs, np.ascontiguousarray(keep, np.int64), gemv)

    def decode(self, token: int, cache: KVCells, position: int) -> np.ndarray:
        """One token (an id, checked) of the sequence of ``cache`` at ``position``: what ``self([token],
        [Segment(cache, position, 0, 1)], [0])[0]`` gives [n_vocab], its id written into ``cache.tokens[position]``
        (the caller counts the position in), without building the segment and row lists or reading any array's
        address: the run's entry point sets the run table (:func:`~kleidipy.graph.walk.decode_run`). A decoded token's
        Python time is mostly steps like those, each run cold after the plan streamed the weights through the caches
        (~1-4 µs a line): once a token of ``cache`` ran on the arguments in use, the next take this short way — the
        thread choice, one compiled call, its result. The logits go into the array of the last decoded token when
        nothing else holds it any more (its reference count says so: a caller that kept it gets a new array), which
        spares a cold allocation (~10 µs after the plan)."""
        if cache is not self._decoding:  # (None until _decode_setup found the short way ready)
            return self._decode_setup(token, cache, position)
        logits = self._logits if getrefcount(self._logits) <= 2 else self._new_logits()  # (2: attribute, argument)
        threads = self.choice.pick(1)
        t0 = perf_counter() if self._choosing and self.choice.timing else 0.0
        if threads == 1:
            failed = self._alone(self._sync_at, self._static, token, position, self._logits_at)
        else:
            failed = self.workers.run(
                run_plan, self._static, serve_plan, self._lead, (token, position, self._logits_at)
            )
        if t0:
            self.choice.record(1, threads, perf_counter() - t0)
        if self.clock is not None:
            self.clock.add(1 if threads == 1 else self.workers.n_threads, 1, 1)
        if failed:
            self._raise_failed([token])
        return logits

    def _decode_setup(self, token: int, cache: KVCells, position: int) -> np.ndarray:
        """:meth:`decode` the long way: the buffers, the caches and the arguments set up as needed, the entry points
        compiled on their first runs (and the embedding done in Python when it has no compiled GET_ROWS); afterwards
        the short way is taken for ``cache`` when everything it calls is known."""
        if not self._rows:
            self._grow_rows(1)
        if len(self._kv_caches) != 1 or self._kv_caches[0] is not cache:
            self._use_caches([cache])
        if self._embd[0] < 0:
            self._arrays[0][:1] = self.lm.embedding(np.array([token], np.int64))
        args = self._static_args()
        logits = self._new_logits() if self._logits is None or getrefcount(self._logits) > 2 else self._logits
        threads, at = self.choice.pick(1), self._logits_at
        if threads > 1 and self._lead is None:  # (the first runs of these arguments on the workers)
            decode_run(args[0], token, position, at)
            self._launch(args, [token], 1, threads, ())
        else:  # (the run's entry point sets the run table)
            self._launch(args, [token], 1, threads, (), decode=(token, position, at))
        alone = self._alone is not None or (self.choice.threads > 1 and not self._choosing)
        lead = self._lead is not None or self.choice.threads == 1
        self._decoding = cache if alone and lead and self._embd[0] >= 0 else None
        return logits

    def _new_logits(self) -> np.ndarray:
        """A new array for a decoded token's logits (and its address)."""
        self._logits = np.empty(self._n_logits, np.float32)
        self._logits_at = self._logits.ctypes.data
        return self._logits

    def _run(
        self, ids: np.ndarray, caches: list[KVCells], segs: np.ndarray, keep: np.ndarray, gemv: bool = False
    ) -> np.ndarray:
        """:meth:`__call__` with the segments as the int64 table run_plan reads (cache index in ``caches``, first
        position, first row, last row + 1)."""
        ids = np.ascontiguousarray(ids, np.int64)
        m = ids.size
        if m > self._rows:
            self._grow_rows(m)
        if self._embd[0] < 0:
            self._arrays[0][:m] = self.lm.embedding(ids)
        if caches != self._kv_caches:  # (caches compare by identity)
            self._use_caches(caches)
        threads = self.choice.pick(m)
        watchers = [o for o in self.lm.observers if o.wants_matmuls] if self.lm.observers else ()
        nth = 1 if threads == 1 else self.workers.n_threads  # (a run takes the caller alone or every worker)
        if self.clock is not None:  # (the clock's stamps, which a trace reads too before the clock sums them)
            prof = self.clock.prof
        else:
            prof = np.zeros((nth, len(self.plan.nodes), 3), np.int64) if watchers else self._untimed
        logits = np.empty((keep.size, self._n_logits), np.float32)
        args = self._static_args()
        self._run_slots[:] = (
            m,
            prof.ctypes.data,
            prof.shape[0],
            segs.ctypes.data,
            segs.shape[0],
            keep.ctypes.data,
            keep.size,
            logits.ctypes.data,
            self._n_logits,
            ids.ctypes.data,
            0,
            int(gemv),
        )
        self._status[:STATUS_PER_RUN] = 0
        self._launch(args, ids, m, threads, watchers, prof, logits.shape[0])
        return logits

    def _use_caches(self, caches: list[KVCells]) -> None:
        """Runs from now on read and write the KV caches ``caches`` (in this order)."""
        k, v = [cells(c.k) for c in caches], [cells(c.v) for c in caches]
        self._kv = (address_table(k, k[0].dtype), address_table(v, k[0].dtype), caches[0].f16)
        self._kv_caches = caches
        self._decode_slots[DECODE_TOKENS] = caches[0].tokens.ctypes.data
        self._static = self._decoding = None

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
        nth, gemv = 1 if threads == 1 else self.workers.n_threads, bool(self._run_slots[RUN_GEMV])
        nodes = node_runs(self.plan, prof[:nth], m, kept, t0 - mono0 / 1e9, gemv) if watchers and not failed else ()
        if self.clock is not None:  # (after the trace's read: the clock clears its stamps)
            self.clock.add(nth, m, kept, gemv)
        if failed:
            self._raise_failed(ids)
        for node in nodes:
            for observer in watchers:  # told here, so that their view of the call stack ends in this function
                observer.on_node(node)
                if node.op == "MUL_MAT" and node.rows:
                    for call in kernel_calls(self.plan, node, self.workers.n_threads, gemv):
                        observer.on_matmul(call)

    def _raise_failed(self, ids: Sequence[int] | np.ndarray) -> None:
        """Raise what stopped the run of tokens ``ids`` (its status says)."""
        status = self._status.tolist()
        if status[STATUS_BAD_TOKEN]:
            shown = [int(i) for i in ids[:8]]
            raise InvalidTokenError(f"token ids must be in [0, {self._embd[1].shape[0]}), got {shown}")
        weight = self.plan.weights[int(self.plan.nodes[status[STATUS_NODE], 3])]
        raise NonFiniteInputError(f"{weight.name}: the activations of this MUL_MAT have NaN/Inf")


def plannable(lm: PlannedModel) -> bool:
    """Whether ``lm`` can run as a compiled plan (every weight a jit-executed KleidiAI matmul), without compiling."""
    try:
        build_plan(lm)
    except NotPlannableError:
        return False
    return True


def compile_model(lm: PlannedModel, threads: int = 1, adaptive: bool = True) -> bool:
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
