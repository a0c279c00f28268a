"""``kleidipy trace``: per stage (model load, prefill, decode), the call stacks from the runtime operation down to
the KleidiAI micro-kernels that ran, with calls, time and bytes per kernel and per weight.

The frames are the real Python frames of kleidipy code between the stage's entry point and the kernel call
(``Engine.__init__ → … → KleidiBackend.__call__`` at load, ``Engine.generate → CausalLM.forward → … →
compute_forward_mul_mat`` at run time); the leaves are the ``kai_run_…`` packers and kernels that ran:

* model load: one repack per matmul weight — ``KleidiBackend.__call__`` (GGUF → packer-input conversion + pack, as
  ggml's ``tensor_traits::repack``) with its ``kai_run_rhs_pack_…`` leaf timed on its own;
* prefill / decode: per MUL_MAT, ``kai_run_lhs_quant_pack_…`` then ``kai_run_matmul_…`` (GEMM when m > 1, GEMV
  when m == 1 — llama.cpp's rule; the last layer's FFN and the LM head of a prefill run on the last row only,
  so they are GEMVs too).

Hooks, installed only while a trace runs and restored after it (even on errors): during model load, the
backend's ``REPACK_HOOK`` (a :class:`~kleidipy.runtime.backend.RepackCall` after every repack, with the pack timed
on its own); during the generation, its ``TRACE_HOOK`` (a :class:`~kleidipy.runtime.backend.KernelCall` after
every MUL_MAT) and a wrapper around the engine's ``CausalLM.forward`` (on the instance) that delimits the forward
passes — the first pass of the
generation is the prefill, the others are decode steps. Nothing is installed otherwise: tracing off costs nothing.

Outputs: a text report (:func:`format_text`), the same content as JSON (:func:`to_json`) and a Chrome
trace-event file (:func:`chrome_trace`, complete ``"X"`` events nested stage → pass → MUL_MAT → kernels; Perfetto
and chrome://tracing open it). :func:`run_trace` is the ``kleidipy trace`` command.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from time import perf_counter
from typing import Any

from kleidipy.errors import KleidipyError
from kleidipy.runtime import backend
from kleidipy.runtime.backend import KernelCall, RepackCall
from kleidipy.runtime.generate import Engine
from kleidipy.target import Target, resolve_target

STAGES = ("model load", "prefill", "decode")
DEFAULT_PROMPT = "The capital of France is"


# --------------------------------------------------------------------------------------------- records


class TraceError(KleidipyError, OSError):
    """The Chrome trace-event file cannot be written."""


@dataclass
class KaiCall:
    """One call of a KleidiAI function: a packer or a matmul kernel."""

    name: str  # kai_run_...
    role: str  # "rhs_pack" | "lhs_pack" | "gemm" | "gemv"
    start: float  # seconds since the trace began
    seconds: float
    bytes_read: int
    bytes_written: int


@dataclass
class Op:
    """One runtime operation that ended in KleidiAI calls: the repack of a weight, or one MUL_MAT."""

    frames: tuple[str, ...]  # kleidipy frames, outermost first, down to the function that called the kernels
    fresh: int  # index of the first frame that is a new invocation (not shared with the previous op)
    weight: str
    m: int  # 0 for a repack
    n: int
    k: int
    start: float  # the op function (KleidiBackend.__call__ / compute_forward_mul_mat): start and seconds
    seconds: float
    calls: tuple[KaiCall, ...]
    weight_type: str = ""  # model load: GGUF type -> kernel weight type, e.g. "Q4_1 -> q4_1"


@dataclass
class Pass:
    """One CausalLM.forward call (prefill: the prompt batch; decode: one token)."""

    start: float
    seconds: float
    tokens: int
    n_past: int


@dataclass
class Stage:
    """One of :data:`STAGES`: its ops (in call order) and, for prefill/decode, its forward passes."""

    name: str
    start: float = 0.0
    wall_s: float = 0.0  # load: Engine construction; prefill/decode: sum of the forward passes
    ops: list[Op] = field(default_factory=list)
    passes: list[Pass] = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.passes[-1].start + self.passes[-1].seconds if self.passes else self.start + self.wall_s

    def kai_calls(self) -> Iterator[KaiCall]:
        for op in self.ops:
            yield from op.calls


@dataclass
class Trace:
    """Everything a trace recorded (times in seconds since the trace began)."""

    model: str
    path: str
    target: str
    execution: str
    threads: int
    prompt_tokens: int
    decoded_tokens: int
    text: str
    timings: str
    hparams: dict[str, Any]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


# --------------------------------------------------------------------------------------------- frames


def _frame_name(frame: types.FrameType) -> str:
    """The qualified name of a frame's function (dataclass-generated methods are named after their class)."""
    code = frame.f_code
    if code.co_qualname.startswith("__create_fn__."):
        owner = frame.f_locals.get("self")
        if owner is not None:
            return f"{type(owner).__qualname__}.{code.co_name}"
    return code.co_qualname


class _StackRecorder:
    """The kleidipy frames of the current call stack, up to (not including) a root frame of the trace driver,
    and which of them are new invocations since the previous capture (frames are kept alive between two
    captures, so a new invocation is never the same object as an old one)."""

    def __init__(self, roots: set[types.CodeType]) -> None:
        self.roots = roots
        self.prev: tuple[object, ...] = ()

    def reset(self) -> None:
        self.prev = ()

    def capture(self, frame: types.FrameType | None, extra: tuple[str, ...] = ()) -> tuple[tuple[str, ...], int]:
        names: list[str] = []
        objs: list[object] = []
        while frame is not None and frame.f_code not in self.roots:
            module = frame.f_globals.get("__name__", "")
            if module.startswith("kleidipy.") and module != __name__:
                names.append(_frame_name(frame))
                objs.append(frame)
            frame = frame.f_back
        names.reverse()
        objs.reverse()
        names.extend(extra)
        objs.extend(object() for _ in extra)  # frames added by name are always new invocations
        fresh = next((i for i, (a, b) in enumerate(zip(objs, self.prev, strict=False)) if a is not b), None)
        fresh = min(len(objs), len(self.prev)) if fresh is None else fresh
        self.prev = tuple(objs)
        return tuple(names), fresh


# --------------------------------------------------------------------------------------------- tracer


class Tracer:
    """Runs a load + generation with the hooks installed, recording a :class:`Trace`."""

    def __init__(self) -> None:
        self.t0 = perf_counter()
        self.stages = {name: Stage(name) for name in STAGES}
        self.current: Stage | None = None
        self.stack = _StackRecorder({self.load.__code__, self.generate.__code__})

    def now(self) -> float:
        return perf_counter() - self.t0

    def _enter(self, name: str) -> Stage:
        if self.current is not self.stages[name]:  # invocations are counted per stage
            self.current = self.stages[name]
            self.stack.reset()
        return self.current

    def _leave(self) -> None:
        self.current = None
        self.stack.reset()  # drop the frames kept for the invocation counts

    # --- model load ---------------------------------------------------------------------------
    def _on_repack(self, call: RepackCall) -> None:
        frames, fresh = self.stack.capture(sys._getframe(1))
        packer = call.pair.gemm.rhs_packer
        pack = KaiCall(
            packer.kai_name, "rhs_pack", call.pack_start - self.t0, call.pack_seconds, call.raw_bytes, call.packed_bytes
        )
        kind = f"{call.ggml_type.name} -> {call.pair.weight_type}"
        self.current.ops.append(
            Op(frames, fresh, call.weight, 0, call.n, call.k, call.start - self.t0, call.seconds, (pack,), kind)
        )

    @contextmanager
    def _repack_hook(self) -> Iterator[None]:
        previous, backend.REPACK_HOOK = backend.REPACK_HOOK, self._on_repack
        try:
            yield
        finally:
            backend.REPACK_HOOK = previous

    def load(
        self,
        model: str | Path,
        target: Target,
        threads: int,
        execution: str,
        n_ctx: int | None,
        check_tensors: bool = True,
    ) -> Engine:
        """Build the Engine (the model load stage: every repack recorded)."""
        stage = self._enter("model load")
        try:
            with self._repack_hook():
                stage.start = self.now()
                engine = Engine(
                    model,
                    target=target,
                    threads=threads,
                    execution=execution,
                    n_ctx=n_ctx,
                    progress=False,
                    check_tensors=check_tensors,
                )
                stage.wall_s = self.now() - stage.start
        finally:
            self._leave()
        return engine

    # --- prefill / decode ---------------------------------------------------------------------
    def _on_mul_mat(self, call: KernelCall) -> None:
        frames, fresh = self.stack.capture(sys._getframe(1))
        kern, m, n, k = call.kernel, call.m, call.n, call.k
        t_lhs = call.start - self.t0
        t_mm = t_lhs + call.lhs_seconds
        calls = []
        if kern.lhs_packer is not None:  # f32-LHS kernels read the activations as they are (a copy, not a kai call)
            calls.append(
                KaiCall(kern.lhs_packer.kai_name, "lhs_pack", t_lhs, call.lhs_seconds, m * k * 4, call.lhs_bytes)
            )
        read = call.lhs_bytes + call.rhs_bytes
        calls.append(KaiCall("kai_run_" + kern.name, kern.kind, t_mm, call.matmul_seconds, read, m * n * 4))
        seconds = call.lhs_seconds + call.matmul_seconds
        self.current.ops.append(Op(frames, fresh, call.weight, m, n, k, t_lhs, seconds, tuple(calls)))

    @contextmanager
    def _run_hooks(self, engine: Engine) -> Iterator[None]:
        lm = engine.lm
        forward = lm.forward
        shadowed = "forward" in vars(lm)

        def traced_forward(token_ids, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            stage = self._enter("decode" if self.stages["prefill"].passes else "prefill")
            n_past, start = lm.n_past, self.now()
            try:
                return forward(token_ids, *args, **kwargs)
            finally:
                seconds = self.now() - start
                stage.passes.append(Pass(start, seconds, len(token_ids), n_past))
                stage.wall_s += seconds
                if len(stage.passes) == 1:
                    stage.start = start

        previous_hook = backend.TRACE_HOOK
        backend.TRACE_HOOK = self._on_mul_mat
        lm.forward = traced_forward
        try:
            yield
        finally:
            backend.TRACE_HOOK = previous_hook
            if shadowed:
                lm.forward = forward
            else:
                del lm.forward

    def generate(self, engine: Engine, prompt_ids: list[int], n_predict: int) -> str:
        """Run ``engine.generate`` greedily (prefill, then decode: every MUL_MAT recorded); returns the text."""
        try:
            with self._run_hooks(engine):
                return "".join(engine.generate(prompt_ids, n_predict))
        finally:
            self._leave()


def trace_generation(
    model: str | Path = "smollm2-135m-instruct",
    prompt: str = DEFAULT_PROMPT,
    n_predict: int = 8,
    target: str | Target | None = None,
    threads: int = 1,
    execution: str = "jit",
    n_ctx: int | None = None,
    chat: bool = False,
    check_tensors: bool = True,
) -> Trace:
    """Load ``model`` and generate ``n_predict`` tokens (greedy) from ``prompt``, tracing every KleidiAI call."""
    tgt = target if isinstance(target, Target) else resolve_target(target)
    tracer = Tracer()
    engine = tracer.load(model, tgt, threads, execution, n_ctx, check_tensors)
    ids = engine.chat_prompt([{"role": "user", "content": prompt}]) if chat else engine.prompt(prompt)
    text = tracer.generate(engine, ids, n_predict)
    t, hp = engine.timings, engine.lm.hparams
    return Trace(
        model=str(model),
        path=str(engine.path),
        target=tgt.describe(),
        execution=execution,
        threads=threads,
        prompt_tokens=t.n_prompt,
        decoded_tokens=t.n_decoded,
        text=text,
        timings=t.summary(),
        hparams={f.name: getattr(hp, f.name) for f in fields(hp)},
        stages=[tracer.stages[name] for name in STAGES],
    )


# --------------------------------------------------------------------------------------------- aggregation


@dataclass
class Node:
    """A frame (or kai_run_ leaf) of the call-stack tree: invocations that reached a kernel, the time spent in the
    op functions beneath (KleidiBackend.__call__ / compute_forward_mul_mat; a leaf: its own time) and the bytes
    the KleidiAI calls beneath read and wrote."""

    frame: str
    calls: int = 0
    seconds: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    children: dict[str, Node] = field(default_factory=dict)

    def child(self, frame: str) -> Node:
        return self.children.setdefault(frame, Node(frame))

    def add(self, seconds: float, bytes_read: int, bytes_written: int) -> None:
        self.seconds += seconds
        self.bytes_read += bytes_read
        self.bytes_written += bytes_written

    def to_dict(self) -> dict[str, Any]:
        return {
            "frame": self.frame,
            "calls": self.calls,
            "seconds": self.seconds,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "children": [c.to_dict() for c in self.children.values()],
        }


def call_tree(stage: Stage) -> list[Node]:
    """The stage's call-stack tree (roots first): each op's frames, then its kai_run_ calls as leaves."""
    root = Node("")
    for op in stage.ops:
        node = root
        read, written = sum(c.bytes_read for c in op.calls), sum(c.bytes_written for c in op.calls)
        for depth, frame in enumerate(op.frames):
            node = node.child(frame)
            node.calls += depth >= op.fresh
            node.add(op.seconds, read, written)
        for call in op.calls:
            leaf = node.child(call.name)
            leaf.calls += 1
            leaf.add(call.seconds, call.bytes_read, call.bytes_written)
    return list(root.children.values())


def kernel_table(stage: Stage) -> list[dict[str, Any]]:
    """Per KleidiAI function: role, calls, total seconds, bytes read and written."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in stage.kai_calls():
        row = rows.setdefault(
            (c.role, c.name),
            {"kernel": c.name, "role": c.role, "calls": 0, "seconds": 0.0, "bytes_read": 0, "bytes_written": 0},
        )
        row["calls"] += 1
        row["seconds"] += c.seconds
        row["bytes_read"] += c.bytes_read
        row["bytes_written"] += c.bytes_written
    return list(rows.values())


def weight_table(stage: Stage) -> list[dict[str, Any]]:
    """Per weight (and kernel): calls, shape, time of the op (repack / MUL_MAT), of the LHS pack and of the kernel
    (kai_run_rhs_pack_… or kai_run_matmul_…), bytes read and written by the KleidiAI calls."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for op in stage.ops:
        main = op.calls[-1]
        row = rows.setdefault(
            (op.weight, main.name),
            {
                "weight": op.weight,
                "kernel": main.name,
                "role": main.role,
                "type": op.weight_type,
                "n": op.n,
                "k": op.k,
                "m": [],
                "calls": 0,
                "seconds": 0.0,
                "lhs_seconds": 0.0,
                "kernel_seconds": 0.0,
                "bytes_read": 0,
                "bytes_written": 0,
            },
        )
        row["calls"] += 1
        if op.m and op.m not in row["m"]:
            row["m"].append(op.m)
        row["seconds"] += op.seconds
        row["lhs_seconds"] += sum(c.seconds for c in op.calls[:-1])
        row["kernel_seconds"] += main.seconds
        row["bytes_read"] += sum(c.bytes_read for c in op.calls)
        row["bytes_written"] += sum(c.bytes_written for c in op.calls)
    return list(rows.values())


def stage_summary(stage: Stage) -> dict[str, Any]:
    """Counts and totals of a stage: operations, GEMM/GEMV/repack split, KleidiAI time vs the stage's wall time."""
    calls = list(stage.kai_calls())
    kernel_s = sum(c.seconds for c in calls)
    by_role = {role: [c for c in calls if c.role == role] for role in ("rhs_pack", "lhs_pack", "gemm", "gemv")}
    out: dict[str, Any] = {"wall_seconds": stage.wall_s, "kernel_seconds": kernel_s}
    out["kernel_fraction"] = kernel_s / stage.wall_s if stage.wall_s else 0.0
    if stage.name == "model load":
        out["repacks"] = len(by_role["rhs_pack"])
        out["repack_seconds"] = sum(op.seconds for op in stage.ops)
        out["bytes_read"] = sum(c.bytes_read for c in calls)
        out["bytes_written"] = sum(c.bytes_written for c in calls)
    else:
        out["forward_passes"] = len(stage.passes)
        out["tokens"] = sum(p.tokens for p in stage.passes)
        out["matmuls"] = len(stage.ops)
        out["gemm"] = len(by_role["gemm"])
        out["gemv"] = len(by_role["gemv"])
        out["matmuls_per_pass"] = len(stage.ops) / len(stage.passes) if stage.passes else 0.0
        out["lhs_pack_seconds"] = sum(c.seconds for c in by_role["lhs_pack"])
        out["matmul_seconds"] = sum(c.seconds for c in by_role["gemm"] + by_role["gemv"])
        out["bytes_read"] = sum(c.bytes_read for c in by_role["gemm"] + by_role["gemv"])
    return out


# --------------------------------------------------------------------------------------------- outputs


def to_json(trace: Trace) -> dict[str, Any]:
    """The report as a JSON-serialisable dict (the same content as :func:`format_text`)."""
    head = {k: getattr(trace, k) for k in ("model", "path", "target", "execution", "threads")}
    head |= {k: getattr(trace, k) for k in ("prompt_tokens", "decoded_tokens", "text", "timings")}
    head["hparams"] = {
        k: v if v is None or isinstance(v, int | float | str) else str(v) for k, v in trace.hparams.items()
    }
    head["stages"] = [
        {
            "name": s.name,
            "summary": stage_summary(s),
            "passes": [vars(p) for p in s.passes],
            "tree": [n.to_dict() for n in call_tree(s)],
            "kernels": kernel_table(s),
            "weights": weight_table(s),
        }
        for s in trace.stages
    ]
    return head


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def chrome_trace(trace: Trace) -> dict[str, Any]:
    """Chrome trace-event JSON: complete events ("ph": "X", ts/dur in µs) nested stage → pass → op → kai call."""
    pid, tid = 1, 1
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "tid": tid, "name": "process_name", "args": {"name": f"kleidipy {trace.model}"}},
        {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": "main"}},
    ]

    def event(name: str, cat: str, start: float, seconds: float, **args: Any) -> None:
        ts = _ns(start)  # whole ns, so that back-to-back events share their boundary exactly
        dur = _ns(start + seconds) - ts
        events.append(
            {"name": name, "cat": cat, "ph": "X", "ts": ts / 1e3, "dur": dur / 1e3, "pid": pid, "tid": tid}
            | ({"args": args} if args else {})
        )

    for s in trace.stages:
        if not s.ops and not s.passes and not s.wall_s:
            continue
        event(s.name, "stage", s.start, s.end - s.start, **stage_summary(s))
        for p in s.passes:
            event("CausalLM.forward", "pass", p.start, p.seconds, tokens=p.tokens, n_past=p.n_past)
        for op in s.ops:
            shape = {"weight": op.weight, "m": op.m, "n": op.n, "k": op.k} | (
                {"type": op.weight_type} if op.m == 0 else {}
            )
            event(
                op.frames[-1],
                "repack" if op.m == 0 else "mul_mat",
                op.start,
                op.seconds,
                **shape,
                kernel=op.calls[-1].name,
                stack=" → ".join(op.frames),
            )
            for c in op.calls:
                event(
                    c.name, c.role, c.start, c.seconds, **shape, bytes_read=c.bytes_read, bytes_written=c.bytes_written
                )
    events[2:] = sorted(events[2:], key=lambda e: (e["ts"], -e["dur"]))
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"target": trace.target, "model": trace.path}}


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:10.3f} ms"


def _fmt_b(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:8.2f} {unit}"
    return f"{n:8d} B  "


def _tree_lines(nodes: list[Node]) -> list[tuple[str, Node]]:
    """(indented label, node) of every node, depth first, with box-drawing branches."""
    out: list[tuple[str, Node]] = []

    def walk(node: Node, lead: str, branch: str) -> None:
        out.append((lead + branch + node.frame, node))
        kids = list(node.children.values())
        inner = lead + {"": "", "├─ ": "│  ", "└─ ": "   "}[branch]
        for i, kid in enumerate(kids):
            walk(kid, inner, "└─ " if i == len(kids) - 1 else "├─ ")

    for root in nodes:
        walk(root, "", "")
    return out


def _summary_line(stage: Stage, s: dict[str, Any]) -> str:
    share = f"{s['kernel_seconds']:.3f} s of the {s['wall_seconds']:.3f} s wall ({100 * s['kernel_fraction']:.1f}%)"
    if stage.name == "model load":
        return (
            f"{s['repacks']} weights repacked in {s['repack_seconds']:.3f} s (KleidiBackend.__call__); "
            f"kai_run_rhs_pack_… {share}; read {_fmt_b(s['bytes_read']).strip()} of GGUF weights, "
            f"wrote {_fmt_b(s['bytes_written']).strip()} packed"
        )
    return (
        f"{s['forward_passes']} forward pass(es), {s['tokens']} token(s): {s['matmuls']} matmuls "
        f"({s['gemm']} GEMM, {s['gemv']} GEMV, {s['matmuls_per_pass']:g} per pass); KleidiAI {share}: "
        f"LHS pack {s['lhs_pack_seconds']:.3f} s, matmul {s['matmul_seconds']:.3f} s"
    )


def _weight_lines(stage: Stage, rows: list[dict[str, Any]]) -> list[str]:
    if stage.name == "model load":
        head = (
            f"{'weight':<28} {'type':<14} {'n x k':>13} {'repack':>13} {'kai pack':>13} {'bytes read':>12} "
            f"{'written':>12}"
        )
        return [head] + [
            f"{r['weight']:<28} {r['type']:<14} {r['n']:>6}x{r['k']:<6} {_fmt_s(r['seconds'])} "
            f"{_fmt_s(r['kernel_seconds'])} {_fmt_b(r['bytes_read'])} {_fmt_b(r['bytes_written'])}"
            for r in rows
        ]
    head = (
        f"{'weight':<28} {'kernel':<74} {'calls':>5} {'m':>5} {'n x k':>11} {'LHS pack':>13} {'matmul':>13} "
        f"{'bytes read':>12}"
    )
    return [head] + [
        f"{r['weight']:<28} {r['kernel']:<74} {r['calls']:>5} {','.join(map(str, r['m'])):>5} "
        f"{r['n']:>5}x{r['k']:<5} {_fmt_s(r['lhs_seconds'])} {_fmt_s(r['kernel_seconds'])} {_fmt_b(r['bytes_read'])}"
        for r in rows
    ]


def format_text(trace: Trace) -> str:
    """The human-readable report: per stage a summary, the call-stack tree, the per-kernel and per-weight tables."""
    hp = trace.hparams
    lines = [
        f"kleidipy trace: {trace.model} ({trace.path})",
        f"target: {trace.target} | execution {trace.execution} | threads {trace.threads}",
        f"{hp['architecture']}: {hp['n_layer']} layers, n_embd {hp['n_embd']}, n_ff {hp['n_ff']}, "
        f"{hp['n_head']}/{hp['n_head_kv']} heads, n_vocab {hp['n_vocab']}",
        f"prompt {trace.prompt_tokens} tokens, decoded {trace.decoded_tokens}; text: {trace.text!r}",
        trace.timings,
    ]
    for stage in trace.stages:
        lines += ["", f"== {stage.name} ==", _summary_line(stage, stage_summary(stage)), ""]
        tree = _tree_lines(call_tree(stage))
        width = max([len(text) for text, _ in tree] + [10])
        lines.append(f"{'call stack':<{width}} {'calls':>7} {'time':>13} {'bytes read':>12}")
        lines += [f"{text:<{width}} {n.calls:>7} {_fmt_s(n.seconds)} {_fmt_b(n.bytes_read)}" for text, n in tree]
        lines += [
            "",
            f"{'KleidiAI function':<84} {'role':<8} {'calls':>6} {'time':>13} {'bytes read':>12} {'written':>12}",
        ]
        lines += [
            f"{r['kernel']:<84} {r['role']:<8} {r['calls']:>6} {_fmt_s(r['seconds'])} "
            f"{_fmt_b(r['bytes_read'])} {_fmt_b(r['bytes_written'])}"
            for r in kernel_table(stage)
        ]
        rows = weight_table(stage)
        if rows:
            lines += ["", *_weight_lines(stage, rows)]
    return "\n".join(lines)


def run_trace(
    model: str | Path = "smollm2-135m-instruct",
    prompt: str = DEFAULT_PROMPT,
    n_predict: int = 8,
    target: str | Target | None = None,
    threads: int = 1,
    json_out: bool = False,
    chrome_trace_path: Path | None = None,
    *,
    execution: str = "jit",
    n_ctx: int | None = None,
    chat: bool = False,
    check_tensors: bool = True,
) -> str:
    """``kleidipy trace``: trace a generation; returns the report (text, or JSON with ``json_out``) and writes the
    Chrome trace-event file to ``chrome_trace_path`` when given."""
    trace = trace_generation(model, prompt, n_predict, target, threads, execution, n_ctx, chat, check_tensors)
    if chrome_trace_path is not None:
        try:
            Path(chrome_trace_path).write_text(json.dumps(chrome_trace(trace)))
        except OSError as exc:
            raise TraceError(f"cannot write the Chrome trace to '{chrome_trace_path}': {exc.strerror or exc}") from None
    return json.dumps(to_json(trace), indent=1) if json_out else format_text(trace)
