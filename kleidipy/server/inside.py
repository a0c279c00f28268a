"""The server's Inside view: per request, the stages that ran — the model load (the RHS repacks), each prefill (LHS
quantize+pack, GEMM) and each decoded token (LHS pack, GEMV) — with the ``kai_run_…`` names, their call stacks, calls,
time, share of the stage, bytes moved and GB/s or GOPS against this machine's limits, and the plan's other ops.

Taken from the compiled plan that ran, by its own per-node timers (:class:`~kleidipy.graph.profile.PlanClock`),
summed per kernel after each forward pass; ``GET /api/inside`` answers :meth:`InsideRecorder.report`. The JSON:
docs/server.md."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kleidipy.errors import KleidipyError
from kleidipy.graph.profile import ClockSums, PlanClock
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.observer import Observer, RepackCall
from kleidipy.runtime.layers import CausalLM
from kleidipy.server.schemas import APIError, invalid
from kleidipy.tools import layout
from kleidipy.tools.emulate import emulate_steps
from kleidipy.tools.limits import HostLimits, host_limits

#: requests kept for ``?id=``
KEPT_REQUESTS = 16
#: llama.cpp's call stacks down to the KleidiAI calls (ggml-cpu's KleidiAI backend; spec §6), per stage
GGML_STACKS = {
    "load": [
        "llama_model_load",
        "llama_model::load_tensors",
        "ggml_backend_tensor_set",
        "ggml_backend_cpu_kleidiai_buffer_set_tensor",
        "ggml::cpu::kleidiai::tensor_traits::repack",
    ],
    "run": [
        "llama_decode",
        "llama_context::decode",
        "ggml_backend_sched_graph_compute",
        "ggml_graph_compute",
        "ggml_graph_compute_thread",
        "ggml_compute_forward_mul_mat",
        "ggml::cpu::kleidiai::tensor_traits::compute_forward",
        "compute_forward_q4_0",
    ],
}
#: kleidipy's: the server's compute thread down to the compiled walk and its MUL_MAT node (module:qualified name)
KLEIDIPY_STACKS = {
    "prefill": [
        "kleidipy.server.scheduler:Scheduler._forward",
        "kleidipy.runtime.layers:CausalLM.forward_batch",
        "kleidipy.runtime.layers:CausalLM._forward_checked",
        "kleidipy.runtime.layers:CausalLM._run_ubatch",
        "kleidipy.runtime.layers:CausalLM._decode",
        "kleidipy.graph.execute:CompiledForward.__call__",
        "kleidipy.graph.execute:CompiledForward._run",
        "kleidipy.graph.execute:CompiledForward._launch",
        "kleidipy.graph.walk:run_plan",
        "kleidipy.graph.matmul:mul_mat",
    ],
    "decode": [
        "kleidipy.server.scheduler:Scheduler._forward",
        "kleidipy.runtime.layers:CausalLM.forward_batch",
        "kleidipy.runtime.layers:CausalLM._forward_checked",
        "kleidipy.runtime.layers:CausalLM._forward_one",
        "kleidipy.graph.execute:CompiledForward.decode",
        "kleidipy.graph.walk:run_plan",
        "kleidipy.graph.matmul:mul_mat",
    ],
}


def _short(frame: str) -> str:
    return frame.partition(":")[2]


# --------------------------------------------------------------------------------------------- model load


@dataclass
class LoadRecord(Observer):
    """The model load as the repacks reported it (an observer of the Engine while it loads): per weight type and
    packer, calls, seconds, bytes, and the load's own call stack (its first repack's frames)."""

    rows: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    stack: list[str] = field(default_factory=list)

    def on_repack(self, call: RepackCall) -> None:
        if not self.stack:
            frame, names = sys._getframe(1), []
            while frame is not None:
                module = frame.f_globals.get("__name__", "")
                if module.startswith("kleidipy."):
                    names.append(frame.f_code.co_qualname)
                frame = frame.f_back
            self.stack = names[::-1]
        kind = f"{call.ggml_type.name} -> {call.pair.weight_type}"
        packer = call.pair.gemm.rhs_packer.kai_name
        row = self.rows.setdefault(
            (kind, packer),
            {"role": "rhs_pack", "kernel": packer, "weight_type": kind, "calls": 0, "cached": 0, "seconds": 0.0,
             "pack_seconds": 0.0, "bytes_read": 0, "bytes_written": 0},
        )  # fmt: skip
        row["calls"] += 1
        row["cached"] += call.cached
        row["seconds"] += call.seconds
        row["pack_seconds"] += call.pack_seconds
        row["bytes_read"] += call.raw_bytes
        row["bytes_written"] += call.packed_bytes


# --------------------------------------------------------------------------------------------- passes


@dataclass
class Stage:
    """A request's prefill or decode: its passes' wall time and tokens, the plan's clock summed over them
    (:class:`~kleidipy.graph.profile.ClockSums`: the same record ``kleidipy trace``'s tables come from), and one step
    line per pass."""

    name: str
    sums: ClockSums = field(default_factory=ClockSums)
    seconds: float = 0.0
    tokens: int = 0
    passes: int = 0
    untimed: int = 0  # passes run op by op (no compiled plan yet): no per-kernel times
    threads: int = 0
    steps: list[tuple[int, int, int, int, float, float]] = field(default_factory=list)


@dataclass
class RequestRecord:
    """The stages of one request (all its choices)."""

    ident: str
    created: float
    prefill: Stage = field(default_factory=lambda: Stage("prefill"))
    decode: Stage = field(default_factory=lambda: Stage("decode"))


class InsideRecorder:
    """Per request, the passes of the compute thread (:meth:`before_pass`, :meth:`after_pass` around each forward
    pass), summed from the plan's clock; :meth:`report` is ``GET /api/inside``'s answer."""

    def __init__(self, lm: CausalLM, model: str, target: str, threads: int, load: LoadRecord | None = None) -> None:
        self.lm, self.model, self.target, self.threads, self.load = lm, model, target, threads, load
        self.requests: deque[RequestRecord] = deque(maxlen=KEPT_REQUESTS)
        self._by_id: dict[str, RequestRecord] = {}
        self._lock = threading.Lock()
        self._limits: HostLimits | None = None
        self._measuring = False

    # --- the compute thread ---------------------------------------------------------------------
    def before_pass(self) -> None:
        """Before a forward pass: the compiled plan's clock on (once per plan), its sums since the last pass (an
        embedding's) dropped."""
        compiled = self.lm.compiled
        if compiled is not None:
            (compiled.clock or compiled.start_clock()).take()

    def after_pass(self, jobs: Sequence[tuple[str, bool, int]], rows: int, seconds: float) -> None:
        """After a forward pass of ``rows`` rows that took ``seconds``: per (request id, prefilling, its tokens) of
        the sequences in it, the pass added to that request's prefill or decode."""
        compiled = self.lm.compiled
        clock = compiled.clock if compiled is not None else None
        taken = clock.take() if clock is not None else None
        with self._lock:
            for ident, prefilling, tokens in _per_request(jobs):
                record = self._by_id.get(ident)
                if record is None:
                    if len(self.requests) == self.requests.maxlen:
                        del self._by_id[self.requests[0].ident]
                    record = self._by_id[ident] = RequestRecord(ident, time.time())
                    self.requests.append(record)
                stage = record.prefill if prefilling else record.decode
                _add(stage, clock, taken, tokens, rows, seconds, len(jobs))

    # --- the report -----------------------------------------------------------------------------
    def limits(self) -> HostLimits | None:
        """This machine's limits at the server's thread count, once measured (the first call starts the measurement
        in a thread of its own and answers None until it is done; later calls read the cache folder's)."""
        with self._lock:
            if self._limits is not None or self._measuring:
                return self._limits
            self._measuring = True

        def measure() -> None:
            limits = host_limits(self.threads)
            with self._lock:
                self._limits = limits

        threading.Thread(target=measure, name="kleidipy-limits", daemon=True).start()
        return None

    def report(self, ident: str | None = None) -> dict[str, Any] | None:
        """``GET /api/inside``: the last request's stages (or request ``ident``'s), None when there is no such
        request."""
        limits = self.limits()
        with self._lock:
            ids = [r.ident for r in self.requests]
            record = self._by_id.get(ident) if ident else (self.requests[-1] if self.requests else None)
            if ident and record is None:
                return None
            stages = [self._load_stage(limits)]
            if record is not None:
                stages += [_run_stage(s, limits) for s in (record.prefill, record.decode)]
        plan = "compiled plan" if self.lm.compiled is not None else "op by op (the compiled plan is being built)"
        return {
            "object": "inside",
            "id": None if record is None else record.ident,
            "created": None if record is None else int(record.created),
            "ids": ids,
            "model": self.model,
            "target": self.target,
            "threads": self.threads,
            "execution": plan,
            "limits": None if limits is None else vars(limits),
            "layout": self.model_layout(),
            "stages": stages,
        }

    def model_layout(self) -> dict[str, Any] | None:
        """The GEMM the model's first weight runs, at one packed group of its rows and its own k (the query of
        ``GET /api/inside/layout`` and ``/api/inside/emulate`` for the model's kernel), None before the plan."""
        compiled = self.lm.compiled
        if compiled is None:
            return None
        weight = compiled.plan.weights[0]
        kern = weight.linear.gemm.kernel
        m = 1 if kern.kind == "gemv" else min(16, kern.mr)
        return {"weight": weight.name, "kernel": kern.name, "m": m, "n": kern.nr, "k": weight.k, "svl": kern.svl_bits}

    def _load_stage(self, limits: HostLimits | None) -> dict[str, Any]:
        rows = [] if self.load is None else [dict(r) for r in self.load.rows.values()]
        seconds = sum(r["seconds"] for r in rows)
        for r in rows:
            r["share"] = r["seconds"] / seconds if seconds else 0.0
            moved = r["bytes_read"] + r["bytes_written"]
            r["gbps"] = moved / r["pack_seconds"] / 1e9 if r["pack_seconds"] else None
            r["of_limit"] = r["gbps"] / limits.read_gbps if limits and r["gbps"] else None
        stack = [] if self.load is None else self.load.stack
        return {
            "name": "load",
            "seconds": seconds,
            "recorded": self.load is not None,
            "stack": {"ggml": GGML_STACKS["load"], "kleidipy": stack},
            "kernels": rows,
            "ops": [],
            "steps": [],
        }


def _per_request(jobs: Sequence[tuple[str, bool, int]]) -> list[tuple[str, bool, int]]:
    """The sequences of a pass merged per request (its choices): prefilling if any is, their tokens summed."""
    merged: dict[str, tuple[bool, int]] = {}
    for ident, prefilling, tokens in jobs:
        was, n = merged.get(ident, (False, 0))
        merged[ident] = (was or prefilling, n + tokens)
    return [(ident, p, n) for ident, (p, n) in merged.items()]


def _add(stage: Stage, clock: PlanClock | None, taken: tuple | None, tokens: int, rows: int, seconds: float,
         sequences: int) -> None:  # fmt: skip
    """One pass into ``stage``."""
    stage.passes += 1
    stage.tokens += tokens
    stage.seconds += seconds
    if clock is None or taken is None:
        stage.untimed += 1
        stage.steps.append((tokens, rows, sequences, 0, seconds, 0.0))
        return
    stage.sums.add(clock, taken)
    stage.threads = max(stage.threads, clock.threads_used)
    stage.steps.append((tokens, rows, sequences, clock.threads_used, seconds, float(taken[0].sum())))


def _run_stage(stage: Stage, limits: HostLimits | None) -> dict[str, Any]:
    """A prefill or decode stage as JSON: its kernels and other ops (:meth:`ClockSums.rows`), its stack and its
    steps."""
    peaks = (limits.read_gbps, limits.int8_gops) if limits is not None else (None, None)
    kernels, ops = stage.sums.rows(stage.seconds, *peaks)
    return {
        "name": stage.name,
        "seconds": stage.seconds,
        "passes": stage.passes,
        "tokens": stage.tokens,
        "untimed_passes": stage.untimed,
        "threads": stage.threads,
        "stack": {"ggml": GGML_STACKS["run"], "kleidipy": [_short(f) for f in KLEIDIPY_STACKS[stage.name]]},
        "kernels": kernels,
        "ops": ops,
        "steps": [
            {"tokens": t, "rows": r, "sequences": s, "threads": th, "seconds": sec, "timed_seconds": timed}
            for t, r, s, th, sec, timed in stage.steps
        ],
    }


# --------------------------------------------------------------------------------------------- routes


def inside_routes(inside: InsideRecorder) -> list[Route]:
    """``GET /api/inside`` (:meth:`InsideRecorder.report`), ``/api/inside/layout`` (a packing picture) and
    ``/api/inside/emulate`` (a kernel call step by step), docs/server.md."""

    async def inside_report(request: Request) -> Response:
        """``GET /api/inside[?id=ID]``: the stages of the last request (or of request ID), docs/server.md."""
        ident = request.query_params.get("id")
        if ident is not None and not ident:
            raise invalid("id", "id is empty: give a request id (the 'ids' of GET /api/inside) or leave it out")
        body = inside.report(ident)
        if body is None:
            message = f"no request {ident!r} is kept (the last {KEPT_REQUESTS} are: GET /api/inside lists their ids)"
            raise APIError(404, message, "not_found_error", param="id", code="request_not_found")
        return JSONResponse(body)

    pictures: dict[tuple, bytes] = {}
    steps: dict[tuple, dict[str, Any]] = {}

    def kernel_query(request: Request) -> tuple[str, int | None, int, int, int]:
        """(kernel, m, n, k, svl) of a layout or emulation request: the seeds' example unless given."""
        q = request.query_params
        kernel = q.get("kernel") or layout.DEFAULT_KERNEL
        try:
            m, n, k, svl = (None if q.get(p) is None else int(q[p]) for p in ("m", "n", "k", "svl"))
        except ValueError:
            raise invalid(None, "m, n, k and svl must be integers") from None
        n0, k0 = layout.DEFAULT_SHAPE[1:]
        return kernel, m, n or n0, k or k0, svl or layout.DEFAULT_SVL

    async def inside_layout(request: Request) -> Response:
        """``GET /api/inside/layout``: the packing picture ``kleidipy layout`` draws, as SVG (400 for a kernel or a
        shape it cannot draw)."""
        key = kernel_query(request)
        if key not in pictures:
            try:
                pictures[key] = await run_in_threadpool(layout.layout_svg, *key)
            except (KleidipyError, NotImplementedError) as exc:
                raise invalid(None, str(exc), "invalid_kernel") from None
            if len(pictures) > 16:
                pictures.pop(next(iter(pictures)))
        return Response(pictures[key], media_type="image/svg+xml", headers={"Cache-Control": "max-age=3600"})

    async def inside_emulate(request: Request) -> Response:
        """``GET /api/inside/emulate``: a kernel call on the instruction emulator, step by step (the seeds' MOPA
        unless asked; 400 for a kernel or shape it cannot emulate)."""
        kernel, m, n, k, svl = kernel_query(request)
        key = (kernel, m, n, k, svl)
        if key not in steps:
            try:
                kern = get_kernel(kernel, svl)
                m = layout.default_m(kern) if m is None else m
                steps[key] = await run_in_threadpool(emulate_steps, kernel, m, n, k, svl)
            except (KleidipyError, NotImplementedError) as exc:
                raise invalid(None, str(exc), "invalid_kernel") from None
            if len(steps) > 8:
                steps.pop(next(iter(steps)))
        return JSONResponse(steps[key])

    return [
        Route("/api/inside", inside_report, methods=["GET"]),
        Route("/api/inside/layout", inside_layout, methods=["GET"]),
        Route("/api/inside/emulate", inside_emulate, methods=["GET"]),
    ]
