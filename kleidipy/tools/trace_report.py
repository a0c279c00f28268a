"""What ``kleidipy trace`` prints and writes from a :class:`~kleidipy.tools.trace.Trace`: the call-stack tree, the
kernel and weight tables, the stage summaries, the text report, the JSON and the Chrome trace-event file.

The text report is a summary that fits a screen — the run (model, weights, target, tokens), then per stage its totals,
its call stacks (single-child frames on one line, ``×N`` where a frame ran N times) down to the ``kai_run_…`` calls,
and the compiled plan's time per op —; ``tables`` adds per stage the full call-stack tree and the per-kernel,
per-weight and per-plan-op tables. Everything printed is read from the :class:`Trace`: :func:`to_json` is the same
content for machines."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kleidipy.tools.trace import TRACE_DEFAULT, Stage, Trace, TraceError

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
    """Per KleidiAI function: role, calls, total seconds, bytes read and written — from the plan's clock when the
    plan ran (:meth:`~kleidipy.graph.profile.ClockSums.rows`, the rows ``GET /api/inside`` serves: share of the
    stage, GB/s and GOPS too), else from the calls the op-by-op path reported."""
    if stage.sums is not None:
        return stage.sums.rows(stage.wall_s)[0]
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


def node_table(stage: Stage) -> list[dict[str, Any]]:
    """Per op of the compiled plan (MUL_MAT, ATTENTION, RMS_NORM, ...): nodes run and their time (each node from its
    first thread's start to its last thread's end), slowest first, with its share of the stage; from the plan's
    clock (:meth:`~kleidipy.graph.profile.ClockSums.rows`, as ``GET /api/inside``'s ops, MUL_MAT included); empty
    when the model ran op by op."""
    if stage.sums is not None:
        ops = stage.sums.rows(stage.wall_s, matmul=True)[1]
        return [{"op": r["op"], "nodes": r["calls"], "seconds": r["seconds"], "share": r["share"]} for r in ops]
    rows: dict[str, dict[str, Any]] = {}
    for node in stage.nodes:
        row = rows.setdefault(node.op, {"op": node.op, "nodes": 0, "seconds": 0.0})
        row["nodes"] += 1
        row["seconds"] += max(t[2] for t in node.threads) - min(t[0] for t in node.threads)
    return sorted(rows.values(), key=lambda r: -r["seconds"])


# --------------------------------------------------------------------------------------------- outputs


def to_json(trace: Trace) -> dict[str, Any]:
    """The report as a JSON-serialisable dict (the same content as :func:`format_text`)."""
    head = {k: getattr(trace, k) for k in ("model", "path", "target", "target_source", "execution", "threads", "graph")}
    head["requantized"] = None if trace.requantized is None else vars(trace.requantized)
    head["kernel_types"] = trace.kernel_types()
    head |= {k: getattr(trace, k) for k in ("prompt_tokens", "n_decode", "decoded_tokens", "finish_reason")}
    head |= {k: getattr(trace, k) for k in ("text", "timings")}
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
            "nodes": node_table(s),
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

    def event(name: str, cat: str, start: float, seconds: float, tid: int = tid, **args: Any) -> None:
        ts = _ns(start)  # whole ns, so that back-to-back events share their boundary exactly
        dur = _ns(start + seconds) - ts
        events.append(
            {"name": name, "cat": cat, "ph": "X", "ts": ts / 1e3, "dur": dur / 1e3, "pid": pid, "tid": tid}
            | ({"args": args} if args else {})
        )

    workers = max((len(n.threads) for s in trace.stages for n in s.nodes), default=0)
    for t in range(workers):  # the plan's threads, each node as that thread ran it (thread 0 is the caller)
        name = {"name": f"plan thread {t}"}
        events.append({"ph": "M", "pid": pid, "tid": 2 + t, "name": "thread_name", "args": name})

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
        for node in s.nodes:
            for t, (start, packed, end) in enumerate(node.threads):
                detail = {"node": node.index, "rows": node.rows} | ({"label": node.label} if node.label else {})
                event(node.op, "node", start, end - start, 2 + t, **detail)
                if packed is not None:
                    event("lhs pack", "node", start, packed - start, 2 + t, **detail)
    meta = 2 + workers
    events[meta:] = sorted(events[meta:], key=lambda e: (e["ts"], -e["dur"]))
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


#: the summary's width: call chains wrap before it
WIDTH = 120


def _fmt_t(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def _stage_title(stage: Stage, s: dict[str, Any]) -> str:
    share = f"{_fmt_t(s['kernel_seconds'])} ({100 * s['kernel_fraction']:.1f}%"
    if stage.name == "model load":
        return (
            f"== model load in {_fmt_t(s['wall_seconds'])}: {s['repacks']} weights repacked in "
            f"{_fmt_t(s['repack_seconds'])}, kai_run_rhs_pack_… {share}); {_fmt_b(s['bytes_read']).strip()} read, "
            f"{_fmt_b(s['bytes_written']).strip()} packed"
        )
    passes, tokens = s["forward_passes"], s["tokens"]
    return (
        f"== {stage.name}: {passes} pass{'es' * (passes != 1)} of {tokens // max(passes, 1)} token"
        f"{'s' * (tokens != passes)} in {_fmt_t(s['wall_seconds'])}, {s['matmuls']} matmuls ({s['gemm']} GEMM, "
        f"{s['gemv']} GEMV): KleidiAI {share}, LHS pack {_fmt_t(s['lhs_pack_seconds'])})"
    )


def _wrapped(pieces: list[str], lead: str, more: str, sep: str = " → ") -> list[str]:
    """``pieces`` joined by ``sep`` on lines of at most :data:`WIDTH` (the first after ``lead``, the others after
    ``more``), breaking only between pieces: an arrow starts the next line, a comma ends the line."""
    arrow = sep.strip() == "→"
    lines = [lead + pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + len(sep) + len(piece) <= WIDTH:
            lines[-1] += sep + piece
        elif arrow:
            lines.append(more + sep.lstrip() + piece)
        else:
            lines[-1] += sep.rstrip()
            lines.append(more + piece)
    return lines


def _stack_rows(nodes: list[Node]) -> list[tuple[str, Node | None]]:
    """The call-stack tree with its single-child frames joined into chains: (text, None) for a chain's lines,
    (indented name, node) for a ``kai_run_…`` leaf."""
    rows: list[tuple[str, Node | None]] = []

    def walk(node: Node, lead: str, branch: str) -> None:
        if node.frame.startswith("kai_run_"):
            rows.append((lead + branch + node.frame, node))
            return
        chain = [node]
        while len(chain[-1].children) == 1 and not next(iter(chain[-1].children)).startswith("kai_run_"):
            chain.append(next(iter(chain[-1].children.values())))
        inner = lead + {"": "", "├─ ": "│  ", "└─ ": "   "}[branch] + "  "
        pieces = [n.frame + (f" ×{n.calls}" if n.calls > 1 else "") for n in chain]
        rows.extend((text, None) for text in _wrapped(pieces, lead + branch, inner))
        kids = list(chain[-1].children.values())
        for i, kid in enumerate(kids):
            walk(kid, inner, "└─ " if i == len(kids) - 1 else "├─ ")

    for root in nodes:
        walk(root, "", "")
    return rows


def _stack_lines(stage: Stage) -> list[str]:
    """The stage's call stacks, each ``kai_run_…`` leaf with its role, calls, time and bytes read."""
    rows = _stack_rows(call_tree(stage))
    roles = {c.name: c.role for c in stage.kai_calls()}
    width = max(len(text) for text, node in rows if node is not None)
    head = f"{'call stack (×N: N calls) → KleidiAI':<{width}} {'role':<8} {'calls':>6} {'time':>13} {'bytes read':>12}"
    return [head] + [
        text
        if node is None
        else f"{text:<{width}} {roles[node.frame]:<8} {node.calls:>6} {_fmt_s(node.seconds)} {_fmt_b(node.bytes_read)}"
        for text, node in rows
    ]


def _plan_lines(stage: Stage) -> list[str]:
    """The compiled plan's time per op, slowest first (none when the model ran op by op)."""
    pieces = [f"{r['op']} {1e3 * r['seconds']:.1f}" for r in node_table(stage)]
    return _wrapped(pieces, "plan (ms): ", "  ", sep=", ") if pieces else []


def _count(types: dict[str, int]) -> str:
    return ", ".join(f"{name} ({n})" for name, n in types.items())


def _weights_line(trace: Trace) -> str:
    """Which weights ran, and the one flag that changes it: the Q4_0 copy, or the family of the model as it is."""
    kinds = f"weights: kernels {_count(trace.kernel_types())}"
    r = trace.requantized
    if r is not None:
        made = "made by an earlier trace" if r.reused else f"made in {r.seconds:.1f} s"
        types = ", ".join(f"{n} {name}" for name, n in r.from_types.items())
        if len(r.from_types) > 1:
            types = f"{sum(r.from_types.values())} ({types})"
        return (
            f"{kinds}; {types} matrices requantized to Q4_0 as llama-quantize does, in a copy {made} "
            "(--no-as-q4_0: the file as it is)"
        )
    if "q4_0" in trace.kernel_types():
        return f"{kinds}, as the file has them"
    return f"{kinds}, as the file has them: not the seeds' Q4_0 path (--as-q4_0 traces a copy requantized to Q4_0)"


def _tokens_line(trace: Trace) -> str:
    """What -n meant: the prefill's logits give the first token, each decode pass one more."""
    ran, asked = trace.decoded_tokens, trace.n_decode
    note = f"-n {asked}"
    if ran < asked:
        note += ": the end of the answer came first" if trace.finish_reason == "stop" else ": the context is full"
    rest = f"token {ran + 1}" if ran == 1 else f"tokens 2-{ran + 1}"
    how = f", {rest} from {ran} decode pass{'es' * (ran != 1)}" if ran else ""
    return (
        f"tokens: prompt {trace.prompt_tokens}; {ran + 1} predicted: token 1 from the prefill's logits{how} ({note}): "
        + repr(trace.text)
    )


def _header(trace: Trace) -> list[str]:
    hp = trace.hparams
    chosen = {TRACE_DEFAULT: "the trace's default (--target chooses)"}.get(
        trace.target_source, f"from {trace.target_source}"
    )
    lines = [
        f"kleidipy trace: {trace.model} ({Path(trace.path).name})",
        f"target: {trace.target}: {chosen}",
        _weights_line(trace),
        f"{hp['architecture']}: {hp['n_layer']} layers, n_embd {hp['n_embd']}, n_ff {hp['n_ff']}, "
        f"{hp['n_head']}/{hp['n_head_kv']} heads, n_vocab {hp['n_vocab']} | {trace.execution}, {trace.threads} "
        f"thread{'s' * (trace.threads != 1)}, " + ("compiled plan (timed inside it)" if trace.graph else "op by op"),
        _tokens_line(trace),
        trace.timings,
    ]
    return [
        part for line in lines for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    ]


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


def _table_lines(stage: Stage) -> list[str]:
    """The stage's full call-stack tree (every frame with its calls, time and bytes) and its per-kernel, per-weight
    and per-plan-op tables."""
    lines = [f"== {stage.name}: tables =="]
    tree = _tree_lines(call_tree(stage))
    width = max([len(text) for text, _ in tree] + [10])
    lines.append(f"{'call stack':<{width}} {'calls':>7} {'time':>13} {'bytes read':>12}")
    lines += [f"{text:<{width}} {n.calls:>7} {_fmt_s(n.seconds)} {_fmt_b(n.bytes_read)}" for text, n in tree]
    lines += ["", f"{'KleidiAI function':<84} {'role':<8} {'calls':>6} {'time':>13} {'bytes read':>12} {'written':>12}"]
    lines += [
        f"{r['kernel']:<84} {r['role']:<8} {r['calls']:>6} {_fmt_s(r['seconds'])} "
        f"{_fmt_b(r['bytes_read'])} {_fmt_b(r['bytes_written'])}"
        for r in kernel_table(stage)
    ]
    rows = weight_table(stage)
    if rows:
        lines += ["", *_weight_lines(stage, rows)]
    nodes = node_table(stage)
    if nodes:
        lines += ["", f"{'plan op':<12} {'nodes':>7} {'time':>13}"]
        lines += [f"{r['op']:<12} {r['nodes']:>7} {_fmt_s(r['seconds'])}" for r in nodes]
    return lines


def format_text(trace: Trace, tables: bool = False) -> str:
    """The report: the summary (module docstring), then with ``tables`` the full tree and the tables of every
    stage."""
    lines = _header(trace)
    for stage in trace.stages:
        if stage.ops or stage.passes:
            lines += ["", _stage_title(stage, stage_summary(stage)), *_stack_lines(stage), *_plan_lines(stage)]
        else:
            lines += ["", f"== {stage.name}: no forward pass"]
    if not tables:
        lines += ["", "per kernel, per weight and per plan op: --tables; for machines: --json, --chrome-trace FILE"]
        return "\n".join(lines)
    for stage in trace.stages:
        if stage.ops or stage.passes:
            lines += ["", *_table_lines(stage)]
    return "\n".join(lines)


def report(trace: Trace, *, json_out: bool = False, chrome_trace_path: Path | None = None, tables: bool = False) -> str:
    """``kleidipy trace``'s output of a :func:`~kleidipy.tools.trace.trace_generation` trace: the report (the
    summary, with ``tables`` the tables too, or JSON with ``json_out``); writes the Chrome trace-event file to
    ``chrome_trace_path`` when given."""
    if chrome_trace_path is not None:
        try:
            Path(chrome_trace_path).write_text(json.dumps(chrome_trace(trace)))
        except OSError as exc:
            raise TraceError(f"cannot write the Chrome trace to '{chrome_trace_path}': {exc.strerror or exc}") from None
    return json.dumps(to_json(trace), indent=1) if json_out else format_text(trace, tables)
