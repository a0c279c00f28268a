"""The layout of the tables a compiled run reads: the table of the plan's arrays (rows ``A_*``, one address-table row
each: :func:`~kleidipy.graph.views.address_table`), a run's table (slots ``RUN_*``) and a decoded token's template
(``DECODE_*``). The walk (:mod:`kleidipy.graph.walk`) and the node routines (:mod:`kleidipy.graph.nodes`) read them;
:mod:`kleidipy.graph.execute` fills them.

What each row holds and why a table: docs/compiled-plan-execution.md."""

from __future__ import annotations

import numba

from kleidipy.core.pointers import f32_at, i64_at

#: rows of the table of the arrays a run reads: the plan's nodes and float parameters, the address of each node's
#: routine (:mod:`kleidipy.graph.nodes`; 0 for the nodes the walk runs itself); the address tables of the activation
#: buffers, the packed weights, their sizes, their kernels' parameter records (:mod:`kleidipy.core.node`), the norm
#: vectors, the RoPE cos/sin tables, whether each RoPE is NeoX; the GELU table; the address tables of the K and V
#: caches; the packed-LHS scratch, attention's scratch [threads, n], the status, the embedding's bytes, the run table,
#: a decoded token's run table and the parameter record of the KV-cache GEMM (:attr:`~kleidipy.graph.plan.Plan.kv_gemm`;
#: empty without one)
A_NODES, A_FPARAMS, A_ROUTINES, A_BUFFERS, A_RHS, A_SIZES, A_PARAMS, A_VECTORS, A_COS, A_SIN = range(10)
A_NEOX, A_GELU, A_KCACHES, A_VCACHES, A_LHS, A_SCRATCH, A_STATUS, A_EMBD_ROWS, A_RUN, A_DECODE = range(10, 20)
A_KV_GEMM = 20
A_SLOTS = A_KV_GEMM + 1

#: slots of a run's table: the ubatch's token count, and the address (and size) of each array that changes from run
#: to run: the profile [threads (0: untimed), nodes, 3], the segments [n, 4], the rows kept, the logits
#: [rows kept, n_vocab] (the caller's array: the LM head writes into it) and the token ids
RUN_M, RUN_PROF, RUN_PROF_THREADS, RUN_SEGS, RUN_N_SEGS, RUN_KEEP, RUN_N_KEEP = range(7)
RUN_LOGITS, RUN_N_VOCAB, RUN_IDS = 7, 8, 9
#: a decoded token's id, in the table itself (a decode run's ``ids`` is this slot); 1 when every MUL_MAT runs its
#: GEMV whatever its rows (the decode step's numerics for each row: a draft's verification)
RUN_TOKEN, RUN_GEMV = 10, 11
RUN_SLOTS = 12
#: the decode template's slot past a run table's: the address of the first KV cache's token record
#: (:attr:`~kleidipy.runtime.kv_cache.KVCache.tokens`), where a decoded token writes its id
DECODE_TOKENS = RUN_SLOTS
DECODE_SLOTS = DECODE_TOKENS + 1


@numba.njit(cache=True, nogil=True, inline="always")
def arrays_at(table):  # pragma: no cover - compiled
    """The table of the run's arrays at address ``table`` (rows ``A_*``)."""
    return i64_at(table, (A_SLOTS, 5))


@numba.njit(cache=True, nogil=True, inline="always")
def i64_2d(arrays, i):  # pragma: no cover - compiled
    """Row ``i`` of the arrays' table, a 2-D int64 array, as the array."""
    return i64_at(arrays[i, 0], (arrays[i, 1], arrays[i, 2]))


@numba.njit(cache=True, nogil=True, inline="always")
def segments(arrays):  # pragma: no cover - compiled
    """The run's segments [n, 4] (cache index, first position, first row, last row + 1)."""
    run = i64_at(arrays[A_RUN, 0], arrays[A_RUN, 1])
    return i64_at(run[RUN_SEGS], (run[RUN_N_SEGS], 4))


@numba.njit(cache=True, nogil=True, inline="always")
def run_table(arrays):  # pragma: no cover - compiled
    """The run's table (slots ``RUN_*``)."""
    return i64_at(arrays[A_RUN, 0], arrays[A_RUN, 1])


@numba.njit(cache=True, nogil=True, inline="always")
def logits_2d(arrays):  # pragma: no cover - compiled
    """The caller's logits array [rows kept, n_vocab] of the run: where the LM head (and a final SOFTCAP) writes."""
    run = i64_at(arrays[A_RUN, 0], arrays[A_RUN, 1])
    return f32_at(run[RUN_LOGITS], (run[RUN_N_KEEP], run[RUN_N_VOCAB]))
