"""``kleidipy trace``: per stage (model load, prefill, decode), the call stacks from the runtime operation down to
the KleidiAI micro-kernels that ran, with calls, time and bytes per kernel and per weight. The tracer is an observer
of the engine it loads (:mod:`kleidipy.observer`); the outputs made from a :class:`Trace` are in
:mod:`kleidipy.tools.trace_report`.

The frames, the events and what is traced by default: docs/tracing.md."""

from __future__ import annotations

import hashlib
import os
import sys
import types
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from time import perf_counter
from typing import Any

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.errors import InvalidArgumentError, KleidipyError
from kleidipy.graph.profile import ClockSums, PlanClock
from kleidipy.observer import KernelCall, NodeRun, Observer, RepackCall
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.pull import default_model, resolve_model, trace_dir
from kleidipy.target import Target, parse_target
from kleidipy.tools.quantize import quantize_gguf, target_type

STAGES = ("model load", "prefill", "decode")
DEFAULT_PROMPT = "The capital of France is"
#: the trace's target unless --target or $KLEIDIPY_TARGET names one: the seeds' SME2 CPU, SVL 512
TRACE_TARGET = "sme2:svl=512"
#: how :func:`trace_target` chose when nothing named a target
TRACE_DEFAULT = "trace default"


# --------------------------------------------------------------------------------------------- records


class TraceError(KleidipyError, OSError):
    """A file of the trace cannot be written: the Chrome trace-event file, or the model's Q4_0 copy."""


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
    #: the plan's clock summed over the stage's passes, as the server's Inside view sums a request's (None when the
    #: model ran op by op): the per-kernel and per-op tables come from it
    sums: ClockSums | None = None

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
    path: str  # the file that ran: the model's, or its Q4_0 copy (see ``requantized``)
    target: str
    target_source: str  # "--target", "KLEIDIPY_TARGET", or TRACE_DEFAULT
    execution: str
    threads: int
    graph: bool  # the forward pass ran as a compiled plan (else op by op from Python)
    prompt_tokens: int
    n_decode: int  # decode passes asked for (-n); the prefill's logits give one token more
    decoded_tokens: int  # decode passes run (fewer when the generation ended or the context is full)
    finish_reason: str | None  # "stop" (end of generation) or "length" (-n reached, or the context)
    text: str
    timings: str
    hparams: dict[str, Any]
    stages: list[Stage]
    requantized: Requantized | None = None  # the matrices were requantized to Q4_0 for the trace

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def kernel_types(self) -> dict[str, int]:
        """Matmul weights per kernel weight type at load (``{"q4_0": 210, "q8_0": 1}``): the families that ran."""
        return dict(Counter(op.weight_type.partition(" -> ")[2] for op in self.stage("model load").ops))


@dataclass
class Requantized:
    """The Q4_0 copy a trace ran instead of the model file (:func:`q4_0_copy`)."""

    source: str  # the model file
    copy: str
    from_types: dict[str, int]  # the GGUF types of the matrices requantized, and how many of each
    reused: bool  # made by an earlier trace
    seconds: float  # to make it (0 when reused)


# --------------------------------------------------------------------------------------------- choices


def trace_target(spec: str | None = None) -> Target:
    """``spec`` if given, else ``$KLEIDIPY_TARGET``, else :data:`TRACE_TARGET` (not the host's default target: the
    trace tells the seeds' SME2 story unless asked otherwise)."""
    if spec:
        return parse_target(spec, "--target")
    env = os.environ.get("KLEIDIPY_TARGET")
    if env:
        return parse_target(env, "KLEIDIPY_TARGET")
    return parse_target(TRACE_TARGET, TRACE_DEFAULT)


def q4_0_copy(model: str | Path) -> Requantized | None:
    """The model with its matrices requantized to Q4_0 as ``llama-quantize … Q4_0`` does (the LM head keeps its
    mixture's type: SmolLM2's stays Q8_0), or None when they are Q4_0 already. The copy is made once per model file
    (its path, size and time) in the cache's ``trace/`` folder, replacing the copy of an older version."""
    path = resolve_model(model)
    src = ModelFile(path)
    tied = src.hparams.tied_embeddings
    changed = Counter(
        t.ggml_type.name
        for t in src.tensors.values()
        if target_type(t, GGMLType.Q4_0, pure=False, tied=tied)[0] != t.ggml_type
    )
    del src
    if not changed:
        return None
    where, stat = path.resolve(), path.stat()
    place = hashlib.sha256(str(where).encode()).hexdigest()[:8]
    state = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:8]
    folder = trace_dir()
    copy = folder / f"{path.stem}.{place}-{state}.Q4_0.gguf"
    found = copy.is_file()
    t0 = perf_counter()
    if not found:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob(f"{path.stem}.{place}-*.Q4_0.gguf"):
                old.unlink()
        except OSError as exc:
            raise TraceError(f"cannot keep the Q4_0 copy in {folder}: {exc.strerror or exc}") from None
        print(f"kleidipy: requantizing {path.name} to Q4_0 for the trace (once: kept in {folder})", file=sys.stderr)
        quantize_gguf(path, copy, "q4_0", progress=False)
    return Requantized(str(path), str(copy), dict(changed), found, 0.0 if found else perf_counter() - t0)


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
    """Runs a load + generation as an observer of the engine (:mod:`kleidipy.observer`), recording a
    :class:`Trace`."""

    wants_matmuls = True

    def __init__(self) -> None:
        self.t0 = perf_counter()
        self.stages = {name: Stage(name) for name in STAGES}
        self.current: Stage | None = None
        self.stack = _StackRecorder({self.load.__code__, self.generate.__code__})
        self.clock: PlanClock | None = None  # the compiled plan's, started by generate()

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
        if self.clock is not None:
            self.clock.take()  # (what ran outside a pass is no stage's)

    def on_forward_end(self, n_tokens: int, n_past: int) -> None:
        stage, n_tokens, n_past, start = self._pass
        seconds = self.now() - start
        if self.clock is not None:
            stage.sums = stage.sums or ClockSums()
            stage.sums.add(self.clock, self.clock.take())
        stage.passes.append(Pass(start, seconds, n_tokens, n_past))
        stage.wall_s += seconds
        if len(stage.passes) == 1:
            stage.start = start

    def generate(self, engine: Engine, prompt_ids: list[int], n_predict: int) -> str:
        """Run ``engine.generate`` greedily (prefill, then decode: every MUL_MAT recorded); returns the text."""
        if self not in engine.observers:
            engine.observers.append(self)
        compiled = engine.lm.compiled
        self.clock = compiled.start_clock() if compiled is not None else None
        try:
            return "".join(engine.generate(prompt_ids, n_predict))
        finally:
            engine.observers.remove(self)
            self._leave()


def trace_generation(
    model: str | Path | None = None,
    prompt: str = DEFAULT_PROMPT,
    n_decode: int = 8,
    target: str | Target | None = None,
    threads: int = 1,
    execution: str = "jit",
    n_ctx: int | None = None,
    chat: bool = False,
    check_tensors: bool = True,
    graph: bool = True,
    as_q4_0: bool | None = None,
) -> Trace:
    """Load ``model`` (None: the default model, ``$KLEIDIPY_MODEL`` or the catalogue's) — with ``as_q4_0`` its Q4_0
    copy (:func:`q4_0_copy`; None: for the default model only) —, run ``prompt`` as the prefill and ``n_decode``
    decode passes (greedy: ``n_decode + 1`` tokens predicted, the first from the prefill's logits), tracing every
    KleidiAI call (and, when the forward pass runs as a compiled plan, every node of it per thread). ``target``:
    :func:`trace_target`'s choice when None."""
    if n_decode < 0:
        raise InvalidArgumentError(f"-n counts decode passes: 0 or more, got {n_decode}")
    tgt = target if isinstance(target, Target) else trace_target(target)
    model = default_model() if model is None else model
    if as_q4_0 is None:
        as_q4_0 = str(model) == default_model()
    requantized = q4_0_copy(model) if as_q4_0 else None
    path = requantized.copy if requantized else model
    tracer = Tracer()
    engine = tracer.load(path, tgt, threads, execution, n_ctx, check_tensors, graph)
    ids = engine.chat_prompt([{"role": "user", "content": prompt}]) if chat else engine.prompt(prompt)
    text = tracer.generate(engine, ids, n_decode + 1)
    t, hp = engine.timings, engine.lm.hparams
    return Trace(
        model=str(model),
        path=str(engine.path),
        target=tgt.describe(),
        target_source=tgt.source,
        execution=execution,
        threads=threads,
        graph=engine.lm.compiled is not None,
        prompt_tokens=t.n_prompt,
        n_decode=n_decode,
        decoded_tokens=t.n_decoded,
        finish_reason=engine.finish_reason,
        text=text,
        timings=t.summary(),
        hparams={f.name: getattr(hp, f.name) for f in fields(hp)},
        stages=[tracer.stages[name] for name in STAGES],
        requantized=requantized,
    )
