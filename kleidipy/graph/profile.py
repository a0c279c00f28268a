"""A timed run of the compiled plan told as the runtime's observers hear the op-by-op path: the per-node,
per-thread monotonic ns stamps that :func:`~kleidipy.graph.walk.run_plan` records (its ``prof`` array, as
ggml's graph profiling does) turned into :class:`~kleidipy.observer.NodeRun` events, and a MUL_MAT node
into the :class:`~kleidipy.observer.KernelCall` that `kleidipy trace` shows; and the same stamps kept on as the
plan's clock (:class:`PlanClock`), summed per kernel and op after every run, which the server's Inside view reads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from kleidipy.core.node import P_N_STEP
from kleidipy.core.pointers import i64_at
from kleidipy.core.threads import sme_columns
from kleidipy.graph.plan import OP_ATTENTION, OP_KEEP, OP_MATMUL, OP_NAMES, OP_STORE_KV, MatmulWeight, Plan
from kleidipy.observer import KernelCall, NodeRun


def batch_op_name(plan: Plan, op: int) -> str:
    """The name of an op of the plan when it runs more than one row, each not as a decoded token's: an ATTENTION whose
    KQV the plan's KV-cache GEMM takes names it (``ATTENTION (KQV: kai_run_…)``)."""
    if op == OP_ATTENTION and plan.kv_gemm is not None:
        return f"{OP_NAMES[op]} (KQV: kai_run_{plan.kv_gemm.name})"
    return OP_NAMES[op]


def node_runs(plan: Plan, prof: np.ndarray, m: int, kept: int, offset: float, gemv: bool = False) -> list[NodeRun]:
    """The nodes of a timed run of m tokens keeping ``kept`` rows (``prof`` [threads, nodes, 3]; ``gemv``: each row as
    a decoded token's), their monotonic ns stamps turned into perf_counter seconds (``offset`` apart)."""
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
        out.append(NodeRun(i, OP_NAMES[op] if rows == 1 or gemv else batch_op_name(plan, op), label, rows, threads))
        if op == OP_KEEP:
            rows = kept
    return out


def kernel_calls(plan: Plan, node: NodeRun, threads: int, gemv: bool = False) -> list[KernelCall]:
    """A MUL_MAT node's run as the eager path reports it: the LHS pack from the first thread's start to the last
    thread's pack end, the kernel (after the barrier) from there to the last thread's end (``gemv``: the run took
    every matmul's GEMV). One call a kernel: a hybrid node of a plan on ``threads`` threads (llama.cpp's SME/NEON
    hybrid, timed as one node) tells its two kernels, each its columns and its share of the spans by columns."""
    row = plan.nodes[node.index].tolist()
    weight, one = plan.weights[row[3]], node.rows == 1 or gemv
    parts = [(weight, 0, weight.n)]
    if row[5] >= 0:
        fallback = plan.weights[row[5]]
        steps = weight.gemm.record[P_N_STEP], fallback.gemm.record[P_N_STEP]
        cols = sme_columns(1 if one else node.rows, weight.n, threads, weight.linear.sme_threads, *steps)
        parts = [p for p in ((weight, 0, cols), (fallback, cols, weight.n)) if p[2] > p[1]]
    start = min(t[0] for t in node.threads)
    packed = max(t[1] for t in node.threads)
    end = max(t[2] for t in node.threads)
    calls = []
    for part, n0, n1 in parts:
        run, code = (part.linear.gemv, part.gemv) if one else (part.linear.gemm, part.gemm)
        rhs_bytes = part.rhs.nbytes * (n1 - n0) // weight.n
        call = KernelCall(part.name, run.kernel, node.rows, n1 - n0, part.k, code.lhs_bytes(node.rows), rhs_bytes)
        share = (n1 - n0) / weight.n
        call.lhs_seconds, call.matmul_seconds, call.start = (packed - start) * share, (end - packed) * share, start
        call.lhs_shared = row[4] == 1
        calls.append(call)
    return calls


# --------------------------------------------------------------------------------------------- the plan's clock

#: slots of a :class:`PlanClock`'s table (int64, read by :func:`clock_run` at its address): the profile [threads,
#: nodes, 3] the runs stamp, its threads and nodes, the group of each node [nodes, 4] (LHS pack and kernel when the
#: node runs one row, then when it runs more; -1: no such part), the KEEP node (-1: none), and the accumulated ns and
#: runs per group [groups], and the number of groups
CLOCK_PROF, CLOCK_THREADS, CLOCK_NODES, CLOCK_GROUPS, CLOCK_KEEP, CLOCK_NS, CLOCK_CALLS, CLOCK_N_GROUPS = range(8)
CLOCK_SLOTS = 8


@numba.njit(cache=True, nogil=True)
def clock_run(table, nth, m, kept, gemv):  # pragma: no cover - compiled
    """Add the stamps of the run just made on ``nth`` threads (m rows, ``kept`` after the KEEP node; ``gemv`` 1: every
    matmul ran its GEMV, row by row) to the clock's sums per group and clear them: a node from its first thread's
    start to its last thread's end, a MUL_MAT split at its last thread's end of the LHS pack (as :func:`kernel_calls`);
    a node never ended (no rows) is left out. Every argument an int: a decoded token pays no array unboxing for it."""
    t = i64_at(table, CLOCK_SLOTS)
    n_nodes = t[CLOCK_NODES]
    prof = i64_at(t[CLOCK_PROF], (t[CLOCK_THREADS], n_nodes, 3))
    groups = i64_at(t[CLOCK_GROUPS], (n_nodes, 4))
    ns, calls = i64_at(t[CLOCK_NS], t[CLOCK_N_GROUPS]), i64_at(t[CLOCK_CALLS], t[CLOCK_N_GROUPS])
    rows = m
    for i in range(n_nodes):
        start, packed, end = prof[0, i, 0], prof[0, i, 1], prof[0, i, 2]
        for th in range(1, nth):
            start, packed, end = min(start, prof[th, i, 0]), max(packed, prof[th, i, 1]), max(end, prof[th, i, 2])
        if end != 0:
            col = 0 if rows == 1 or gemv else 2
            lhs, kern = groups[i, col], groups[i, col + 1]
            split = packed if lhs >= 0 and packed != 0 else start
            if lhs >= 0:
                ns[lhs] += split - start
                calls[lhs] += 1
            ns[kern] += end - split
            calls[kern] += 1
        if i == t[CLOCK_KEEP]:
            rows = kept
    for th in range(nth):
        for i in range(n_nodes):
            prof[th, i, 0] = prof[th, i, 1] = prof[th, i, 2] = 0


@dataclass(frozen=True)
class ClockGroup:
    """What a clock sums apart: the LHS packs (``role`` "lhs_pack") or the kernels ("gemm", "gemv") of one KleidiAI
    function, or one op of the plan ("op": ATTENTION, RMS_NORM, ...); ``name`` the ``kai_run_…`` name or the op's
    (a batch's ATTENTION whose KQV the plan's KV-cache GEMM takes names it: ``ATTENTION (KQV: kai_run_…)``)."""

    role: str
    name: str


class PlanClock:
    """The compiled plan's own per-node timers kept on (:meth:`CompiledForward.start_clock`): every run stamps the
    clock's profile array, as a traced run stamps its own, and :func:`clock_run` sums the stamps per
    :class:`ClockGroup` right after the run (a few µs: no record per node, nothing in Python per node). A reader
    takes the sums of the runs since its last :meth:`take`."""

    def __init__(self, plan: Plan, threads: int) -> None:
        self.plan, self.threads = plan, threads
        self.groups: list[ClockGroup] = []
        index: dict[ClockGroup, int] = {}

        def group(role: str, name: str) -> int:
            return index.setdefault(ClockGroup(role, name), len(index))

        n_nodes = len(plan.nodes)
        self.node_groups = np.full((n_nodes, 4), -1, np.int64)
        keep = -1
        for i, node in enumerate(plan.nodes.tolist()):
            op = node[0]
            if op == OP_MATMUL:
                linear = plan.weights[node[3]].linear
                for col, run in enumerate((self._one_row(node).linear.gemv, linear.gemm)):
                    kern = run.kernel
                    if kern.lhs_packer is not None and node[4] != 1:  # (a shared LHS: no pack ran)
                        self.node_groups[i, 2 * col] = group("lhs_pack", kern.lhs_packer.kai_name)
                    self.node_groups[i, 2 * col + 1] = group(kern.kind, "kai_run_" + kern.name)
            else:
                self.node_groups[i, 1] = group("op", OP_NAMES[op])
                self.node_groups[i, 3] = group("op", batch_op_name(plan, op))
                keep = i if op == OP_KEEP else keep
        self.groups = list(index)
        self.prof = np.zeros((threads, n_nodes, 3), np.int64)
        self.ns = np.zeros(len(self.groups), np.int64)
        self.calls = np.zeros(len(self.groups), np.int64)
        self.table = np.array(
            [self.prof.ctypes.data, threads, n_nodes, self.node_groups.ctypes.data, keep, self.ns.ctypes.data,
             self.calls.ctypes.data, len(self.groups)], np.int64,
        )  # fmt: skip
        self.address = self.table.ctypes.data
        #: the threads of the last run (1: the caller alone)
        self.threads_used = 0
        #: runs since the last take per (m rows, kept rows, GEMV row by row): what :meth:`work` counts bytes and
        #: operations of
        self.shapes: Counter[tuple[int, int, bool]] = Counter()

    def _one_row(self, node: list[int]) -> MatmulWeight:
        """The weight whose GEMV a MUL_MAT node runs for a row alone: a hybrid's fallback when the plan's threads are
        more than the SME ones (a row is fewer than llama.cpp's 128; the clock books a hybrid's GEMM to the SME
        kernel)."""
        weight = self.plan.weights[node[3]]
        return self.plan.weights[node[5]] if node[5] >= 0 and self.threads > weight.linear.sme_threads else weight

    def add(self, nth: int, m: int, kept: int, gemv: bool = False) -> None:
        """Sum the stamps of the run just made (``nth`` threads, m rows, ``kept`` rows after the KEEP node; ``gemv``:
        every matmul ran its GEMV row by row, as a lookup draft's verification does)."""
        clock_run(self.address, nth, m, kept, int(gemv))
        self.threads_used = nth
        self.shapes[m, kept, gemv] += 1

    def take(self) -> tuple[np.ndarray, np.ndarray, Counter[tuple[int, int, bool]]]:
        """(seconds, runs) per group and the runs per (m, kept) since the last take, and the sums start again."""
        seconds, calls, shapes = self.ns / 1e9, self.calls.copy(), self.shapes
        self.ns[:] = 0
        self.calls[:] = 0
        self.shapes = Counter()
        return seconds, calls, shapes

    def work(self, m: int, kept: int, gemv: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bytes read, bytes written, operations) per group of one run of m rows keeping ``kept`` (``gemv``: the
        GEMVs row by row, each reading the packed weights): a kernel reads the packed LHS and the packed weights and
        writes f32 rows (2 operations a multiply-add), an LHS pack reads the f32 rows and writes the packed LHS; the
        plan's other ops count none."""
        read, written, ops = (np.zeros(len(self.groups), np.int64) for _ in range(3))
        rows = m
        for i, node in enumerate(self.plan.nodes.tolist()):
            one = rows == 1 or gemv
            lhs, kern = self.node_groups[i, 0 if one else 2], self.node_groups[i, 1 if one else 3]
            if node[0] == OP_MATMUL and rows:
                w = self._one_row(node) if one else self.plan.weights[node[3]]
                code = w.gemv if one else w.gemm
                packed = code.lhs_bytes(rows)
                if lhs >= 0:
                    read[lhs] += rows * w.k * 4
                    written[lhs] += packed
                read[kern] += packed + int(w.rhs.nbytes) * (rows if one else 1)
                written[kern] += rows * w.n * 4
                ops[kern] += 2 * rows * w.n * w.k
            if node[0] == OP_KEEP:
                rows = kept
        return read, written, ops


@dataclass
class ClockSums:
    """A stage's sums of the plan's clock over its runs (what :meth:`PlanClock.take` gave after each): per group
    seconds and runs, and the runs per shape. Told by :meth:`rows` as one record for every reader — the server's
    ``GET /api/inside`` and ``kleidipy trace``'s per-kernel and per-op tables."""

    clock: PlanClock | None = None
    seconds: np.ndarray | None = None
    calls: np.ndarray | None = None
    shapes: Counter[tuple[int, int, bool]] = field(default_factory=Counter)

    def add(self, clock: PlanClock, taken: tuple[np.ndarray, np.ndarray, Counter[tuple[int, int, bool]]]) -> None:
        """Add one :meth:`PlanClock.take` of ``clock`` (a new plan's clock starts the sums again: its groups
        differ)."""
        if self.clock is not clock or self.seconds is None or self.calls is None:
            self.clock, self.shapes = clock, Counter()
            self.seconds, self.calls = np.zeros(len(clock.groups)), np.zeros(len(clock.groups), np.int64)
        self.seconds += taken[0]
        self.calls += taken[1]
        self.shapes.update(taken[2])

    def rows(
        self, wall_seconds: float, read_gbps: float | None = None, int8_gops: float | None = None, matmul: bool = False
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(kernels, ops): per KleidiAI function its role, ``kai_run_…`` name, calls, seconds, share of
        ``wall_seconds``, bytes read and written, GB/s, for a GEMM int8 GOPS, and the fraction of this machine's
        limit (the read bandwidth, for a GEMM the int8 peak; None without them); per other op of the plan its calls,
        seconds and share, slowest first (with ``matmul``, MUL_MAT too: its nodes' packs and kernels)."""
        clock, kernels, ops = self.clock, [], []
        if clock is None or self.seconds is None or self.calls is None:
            return kernels, ops
        read, written, work = (np.zeros(len(clock.groups), np.int64) for _ in range(3))
        for (m, kept, gemv), count in self.shapes.items():
            r, w, o = clock.work(m, kept, gemv)
            read, written, work = read + count * r, written + count * w, work + count * o
        share = (lambda s: s / wall_seconds) if wall_seconds else (lambda s: 0.0)
        mul_mat = {"op": "MUL_MAT", "calls": 0, "seconds": 0.0}
        for g, group in enumerate(clock.groups):
            seconds, calls = float(self.seconds[g]), int(self.calls[g])
            if not calls:
                continue
            if group.role == "op":
                ops.append({"op": group.name, "calls": calls, "seconds": seconds, "share": share(seconds)})
                continue
            mul_mat["calls"] += calls if group.role != "lhs_pack" else 0
            mul_mat["seconds"] += seconds
            gbps = (read[g] + written[g]) / seconds / 1e9 if seconds else None
            gops = work[g] / seconds / 1e9 if seconds and group.role == "gemm" else None
            limit = int8_gops if gops is not None else read_gbps
            rate = gops if gops is not None else gbps
            kernels.append(
                {"role": group.role, "kernel": group.name, "calls": calls, "seconds": seconds, "share": share(seconds),
                 "bytes_read": int(read[g]), "bytes_written": int(written[g]), "gbps": gbps, "gops": gops,
                 "of_limit": rate / limit if limit and rate is not None else None}
            )  # fmt: skip
        if matmul and mul_mat["calls"]:
            ops.append({**mul_mat, "share": share(mul_mat["seconds"])})
        ops.sort(key=lambda r: -r["seconds"])
        return kernels, ops
