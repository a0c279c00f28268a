"""``kleidipy trace``: per stage (model load, prefill, decode), the call stacks from the runtime operation down to
the KleidiAI micro-kernels that ran, with calls, time and bytes per kernel and per weight.

The frames are the real Python frames of kleidipy code between the stage's entry point and the kernel call
(``Engine.__init__ → … → KleidiBackend.__call__`` at load; at run time ``Engine.generate → CausalLM.forward →
CausalLM._forward_checked → CausalLM._run_ubatch → CausalLM._decode → CompiledForward.__call__ → CompiledForward._run →
CompiledForward._launch`` when the forward pass runs as a compiled plan — the default —, or ``… →
compute_forward_mul_mat`` op by op with ``--no-graph``); the leaves are the ``kai_run_…`` packers and kernels that
ran:

* model load: one repack per matmul weight — ``KleidiBackend.__call__`` (GGUF → packer-input conversion + pack, as
  ggml's ``tensor_traits::repack``) with its ``kai_run_rhs_pack_…`` leaf timed on its own;
* prefill / decode: per MUL_MAT, ``kai_run_lhs_quant_pack_…`` then ``kai_run_matmul_…`` (GEMM when m > 1, GEMV
  when m == 1 — llama.cpp's rule; the last layer's FFN and the LM head of a prefill run on the last row only,
  so they are GEMVs too).

The tracer is an observer of the engine it loads (:mod:`kleidipy.runtime.observer`): during the load it receives
a :class:`~kleidipy.runtime.observer.RepackCall` after every repack (the pack timed on its own); during the
generation a :class:`~kleidipy.runtime.observer.KernelCall` after every MUL_MAT and the start and end of every
forward pass (the first pass of the generation is the prefill, the others are decode steps). A compiled plan
times itself: each worker thread records the start, the end of a MUL_MAT's LHS pack and the end of every node
(monotonic ns, inside the compiled code, like ggml's graph profiling), and the tracer receives each node as a
:class:`~kleidipy.runtime.observer.NodeRun` and each MUL_MAT node as a KernelCall — the trace shows the path that
runs. An engine without an observer runs the plain path: tracing off costs nothing.

The outputs made from a :class:`Trace` (text report, JSON, Chrome trace-event file) and the ``kleidipy trace``
command are in :mod:`kleidipy.tools.trace_report`.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from time import perf_counter
from typing import Any

from kleidipy.errors import KleidipyError
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.observer import KernelCall, NodeRun, Observer, RepackCall
from kleidipy.runtime.pull import DEFAULT_MODEL
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
    #: the compiled plan's nodes as they ran, timed per thread inside the plan (empty when the model ran op by op)
    nodes: list[NodeRun] = field(default_factory=list)

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
    graph: bool  # the forward pass ran as a compiled plan (else op by op from Python)
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


class Tracer(Observer):
    """Runs a load + generation as an observer of the engine (:mod:`kleidipy.runtime.observer`), recording a
    :class:`Trace`."""

    wants_matmuls = True

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
    def on_repack(self, call: RepackCall) -> None:
        frames, fresh = self.stack.capture(sys._getframe(1))
        packer = call.pair.gemm.rhs_packer
        pack = KaiCall(
            packer.kai_name, "rhs_pack", call.pack_start - self.t0, call.pack_seconds, call.raw_bytes, call.packed_bytes
        )
        kind = f"{call.ggml_type.name} -> {call.pair.weight_type}"
        self.current.ops.append(
            Op(frames, fresh, call.weight, 0, call.n, call.k, call.start - self.t0, call.seconds, (pack,), kind)
        )

    def load(
        self,
        model: str | Path,
        target: Target,
        threads: int,
        execution: str,
        n_ctx: int | None,
        check_tensors: bool = True,
        graph: bool = True,
    ) -> Engine:
        """Build the Engine (the model load stage: every repack recorded)."""
        stage = self._enter("model load")
        try:
            stage.start = self.now()
            engine = Engine(
                model,
                target=target,
                threads=threads,
                execution=execution,
                n_ctx=n_ctx,
                progress=False,
                check_tensors=check_tensors,
                graph=graph,
                repack_cache=False,  # the load stage shows every weight converted and packed
                observers=[self],
            )
            stage.wall_s = self.now() - stage.start
        finally:
            self._leave()
        return engine

    # --- prefill / decode ---------------------------------------------------------------------
    def on_matmul(self, call: KernelCall) -> None:
        frames, fresh = self.stack.capture(sys._getframe(1))
        kern, m, n, k = call.kernel, call.m, call.n, call.k
        t_lhs = call.start - self.t0
        t_mm = t_lhs + call.lhs_seconds
        calls = []
        if kern.lhs_packer is not None and not call.lhs_shared:  # (f32-LHS kernels read the activations as they are)
            calls.append(
                KaiCall(kern.lhs_packer.kai_name, "lhs_pack", t_lhs, call.lhs_seconds, m * k * 4, call.lhs_bytes)
            )
        read = call.lhs_bytes + call.rhs_bytes
        calls.append(KaiCall("kai_run_" + kern.name, kern.kind, t_mm, call.matmul_seconds, read, m * n * 4))
        seconds = call.lhs_seconds + call.matmul_seconds
        self.current.ops.append(Op(frames, fresh, call.weight, m, n, k, t_lhs, seconds, tuple(calls)))

    def on_node(self, node: NodeRun) -> None:
        t0 = self.t0  # to seconds since the trace began, as every other record
        threads = [(a - t0, None if b is None else b - t0, c - t0) for a, b, c in node.threads]
        self.current.nodes.append(replace(node, threads=threads))

    def on_forward_start(self, n_tokens: int, n_past: int) -> None:
        stage = self._enter("decode" if self.stages["prefill"].passes else "prefill")
        self._pass = (stage, n_tokens, n_past, self.now())

    def on_forward_end(self, n_tokens: int, n_past: int) -> None:
        stage, n_tokens, n_past, start = self._pass
        seconds = self.now() - start
        stage.passes.append(Pass(start, seconds, n_tokens, n_past))
        stage.wall_s += seconds
        if len(stage.passes) == 1:
            stage.start = start

    def generate(self, engine: Engine, prompt_ids: list[int], n_predict: int) -> str:
        """Run ``engine.generate`` greedily (prefill, then decode: every MUL_MAT recorded); returns the text."""
        if self not in engine.observers:
            engine.observers.append(self)
        try:
            return "".join(engine.generate(prompt_ids, n_predict))
        finally:
            engine.observers.remove(self)
            self._leave()


def trace_generation(
    model: str | Path = DEFAULT_MODEL,
    prompt: str = DEFAULT_PROMPT,
    n_predict: int = 8,
    target: str | Target | None = None,
    threads: int = 1,
    execution: str = "jit",
    n_ctx: int | None = None,
    chat: bool = False,
    check_tensors: bool = True,
    graph: bool = True,
) -> Trace:
    """Load ``model`` and generate ``n_predict`` tokens (greedy) from ``prompt``, tracing every KleidiAI call (and,
    when the forward pass runs as a compiled plan, every node of it per thread)."""
    tgt = target if isinstance(target, Target) else resolve_target(target)
    tracer = Tracer()
    engine = tracer.load(model, tgt, threads, execution, n_ctx, check_tensors, graph)
    ids = engine.chat_prompt([{"role": "user", "content": prompt}]) if chat else engine.prompt(prompt)
    text = tracer.generate(engine, ids, n_predict)
    t, hp = engine.timings, engine.lm.hparams
    return Trace(
        model=str(model),
        path=str(engine.path),
        target=tgt.describe(),
        execution=execution,
        threads=threads,
        graph=engine.lm.compiled is not None,
        prompt_tokens=t.n_prompt,
        decoded_tokens=t.n_decoded,
        text=text,
        timings=t.summary(),
        hparams={f.name: getattr(hp, f.name) for f in fields(hp)},
        stages=[tracer.stages[name] for name in STAGES],
    )
