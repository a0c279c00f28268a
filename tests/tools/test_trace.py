"""kleidipy.tools.trace: a traced short generation of the default model on the virtual SME2 (SVL 512) target — stages,
frames, kernel names, counts against the model's hyper-parameters, JSON and Chrome trace outputs, the tracer
detached and nothing patched afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_files import SMOLLM2, model_file

from kleidipy.core.matmul import MatmulKernel
from kleidipy.errors import KleidipyError
from kleidipy.graph import contention
from kleidipy.runtime.backend import KleidiBackend
from kleidipy.runtime.generate import PromptError
from kleidipy.target import resolve_target, select_kernels
from kleidipy.tools.trace import Op, Stage, Tracer, trace_generation
from kleidipy.tools.trace_report import call_tree, chrome_trace, format_text, run_trace, to_json

MODEL = SMOLLM2
TARGET = "sme2:svl=512"
GEMM_Q4_1 = "kai_run_matmul_clamp_f32_qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa"
GEMV_Q4_1 = "kai_run_matmul_clamp_f32_qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot"
#: matmul weights of a llama block: q, k, v, output, gate, up, down
PER_LAYER = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

HOOKS = {
    "KleidiBackend.__call__": lambda: KleidiBackend.__dict__["__call__"],
    "MatmulKernel.pack_rhs": lambda: MatmulKernel.__dict__["pack_rhs"],
}


@pytest.fixture(scope="module")
def originals() -> dict:
    model_file(MODEL)  # pulled like `kleidipy pull` does, if this machine does not have it yet
    return {name: get() for name, get in HOOKS.items()}


@pytest.fixture(scope="module")
def trace(originals: dict):
    """The op-by-op path (--no-graph): every MUL_MAT reached through the model's Python frames."""
    return trace_generation(MODEL, "The capital of France is", n_predict=4, target=TARGET, n_ctx=64, graph=False)


@pytest.fixture(scope="module")
def plan_trace(originals: dict):
    """The default path: the compiled plan on 2 threads, timed inside the plan — on cores no other process wants,
    whatever else runs on the machine (else a run may take the calling thread alone: graph/contention.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contention, "free_cores", lambda: 2)
        return trace_generation(MODEL, "The capital of France is", n_predict=4, target=TARGET, n_ctx=64, threads=2)


def assert_restored(originals: dict) -> None:
    for name, get in HOOKS.items():
        assert get() is originals[name], f"{name} not restored"


def matmul_weights(hp: dict) -> list[str]:
    """The matmul weights of the model, from its hyper-parameters: 7 per layer, then the LM head."""
    head = "token_embd.weight" if hp["tied_embeddings"] else "output.weight"
    return [f"blk.{i}.{w}.weight" for i in range(hp["n_layer"]) for w in PER_LAYER] + [head]


def paths(stage: Stage) -> set[tuple[str, ...]]:
    return {op.frames + (c.name,) for op in stage.ops for c in op.calls}


def test_hooks_restored(trace, originals: dict) -> None:
    assert_restored(originals)
    assert [s.name for s in trace.stages] == ["model load", "prefill", "decode"]


def test_model_load_one_repack_per_matmul_weight(trace) -> None:
    load = trace.stage("model load")
    weights = matmul_weights(trace.hparams)
    assert [op.weight for op in load.ops] == weights
    assert all(len(op.calls) == 1 and op.calls[0].role == "rhs_pack" for op in load.ops)
    assert all(op.frames[-1] == "KleidiBackend.__call__" for op in load.ops)
    assert load.ops[0].frames[:3] == ("Engine.__init__", "Engine.__post_init__", "Llama.__init__")
    target = resolve_target(TARGET)
    q4_1 = select_kernels("q4_1", target).gemm.rhs_packer.kai_name
    assert {op.calls[0].name for op in load.ops[:-1]} == {q4_1}
    for op in load.ops:
        call = op.calls[0]
        assert call.name.startswith("kai_run_rhs_pack_")
        assert call.bytes_read > 0 and call.bytes_written > 0
        assert op.start <= call.start and call.start + call.seconds <= op.start + op.seconds + 1e-9
    tree = call_tree(load)
    assert [n.frame for n in tree] == ["Engine.__init__"]
    node = tree[0]
    while node.frame != "KleidiBackend.__call__":
        (node,) = node.children.values()
    assert node.calls == len(weights)
    assert sum(leaf.calls for leaf in node.children.values()) == len(weights)
    assert load.wall_s > 0 and sum(op.seconds for op in load.ops) <= load.wall_s


def test_prefill_gemm_and_counts(trace) -> None:
    prefill = trace.stage("prefill")
    n_layer = trace.hparams["n_layer"]
    weights = matmul_weights(trace.hparams)
    assert len(prefill.passes) == 1 and prefill.passes[0].tokens == trace.prompt_tokens > 1
    assert [op.weight for op in prefill.ops] == weights  # one MUL_MAT per weight per forward pass
    kernels = [op.calls[-1].name for op in prefill.ops]
    # the last layer keeps only the last row after attention (llama.cpp's out_ids): its FFN and the LM head are GEMVs
    last_rows = {f"blk.{n_layer - 1}.{w}.weight" for w in PER_LAYER[4:]} | {weights[-1]}
    for op, name in zip(prefill.ops, kernels, strict=True):
        want_m = 1 if op.weight in last_rows else trace.prompt_tokens
        assert op.m == want_m, op.weight
        if op.weight != weights[-1]:
            assert name == (GEMV_Q4_1 if want_m == 1 else GEMM_Q4_1), op.weight
        assert [c.role for c in op.calls] == ["lhs_pack", "gemv" if want_m == 1 else "gemm"]
        assert op.calls[0].name.startswith("kai_run_lhs_quant_pack_")
    assert kernels.count(GEMM_Q4_1) == len(weights) - len(last_rows)
    s = to_json(trace)["stages"][1]["summary"]
    assert (s["matmuls"], s["gemm"], s["gemv"]) == (len(weights), len(weights) - len(last_rows), len(last_rows))
    assert 0 < s["kernel_seconds"] <= s["wall_seconds"]
    attention = (
        "Engine.generate",
        "Generation.step",
        "CausalLM.forward",
        "CausalLM._forward_checked",
        "CausalLM._run_ubatch",
        "CausalLM._decode",
        "CausalLM._hidden",
        "LlamaBlock.__call__",
    )
    attention += ("SelfAttention.__call__", "SelfAttention._project", "RepackedLinear.__call__")
    assert attention + ("compute_forward_mul_mat", GEMM_Q4_1) in paths(prefill)
    ffn = attention[:8] + ("SwiGLU.__call__", "RepackedLinear.__call__", "compute_forward_mul_mat", GEMM_Q4_1)
    assert ffn in paths(prefill)


def test_decode_gemv_and_counts(trace) -> None:
    decode = trace.stage("decode")
    weights = matmul_weights(trace.hparams)
    assert 1 <= len(decode.passes) == trace.decoded_tokens <= 3  # of 4 tokens sampled, the last one is not run
    assert all(p.tokens == 1 for p in decode.passes)
    assert [op.weight for op in decode.ops] == weights * len(decode.passes)
    assert all(op.m == 1 and op.calls[-1].role == "gemv" for op in decode.ops)
    assert {op.calls[-1].name for op in decode.ops if op.weight != weights[-1]} == {GEMV_Q4_1}
    tree = call_tree(decode)
    assert [(n.frame, n.calls) for n in tree] == [("Engine.generate", 1)]
    (step,) = tree[0].children.values()
    assert (step.frame, step.calls) == ("Generation.step", len(decode.passes))
    (forward,) = step.children.values()
    assert (forward.frame, forward.calls) == ("CausalLM.forward", len(decode.passes))
    ubatch = forward.children["CausalLM._forward_checked"].children["CausalLM._run_ubatch"]
    (hidden, head) = ubatch.children["CausalLM._decode"].children.values()
    assert (hidden.frame, hidden.calls) == ("CausalLM._hidden", len(decode.passes))  # the blocks, then the LM head
    (layers,) = hidden.children.values()
    assert (layers.frame, layers.calls) == ("LlamaBlock.__call__", trace.hparams["n_layer"] * len(decode.passes))
    assert head.calls == len(decode.passes)  # the LM head, called from CausalLM._decode
    leaves = [c for c in head.children["compute_forward_mul_mat"].children.values()]
    assert [leaf.calls for leaf in leaves] == [len(decode.passes)] * 2


def test_json_and_chrome_trace(trace, tmp_path: Path) -> None:
    data = json.loads(json.dumps(to_json(trace)))
    assert [s["name"] for s in data["stages"]] == ["model load", "prefill", "decode"]
    assert data["stages"][0]["summary"]["repacks"] == len(matmul_weights(trace.hparams))
    assert data["stages"][1]["tree"][0]["frame"] == "Engine.generate"
    assert any(row["kernel"] == GEMV_Q4_1 for row in data["stages"][2]["kernels"])

    events = json.loads(json.dumps(chrome_trace(trace)))["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in xs)
    n_ops = sum(len(s.ops) for s in trace.stages)
    assert sum(e["cat"] in ("gemm", "gemv", "rhs_pack") for e in xs) == n_ops
    assert sum(e["cat"] in ("mul_mat", "repack") for e in xs) == n_ops
    assert [e["name"] for e in xs if e["cat"] == "stage"] == ["model load", "prefill", "decode"]
    gemm = next(e for e in xs if e["cat"] == "gemm")
    assert gemm["name"] == GEMM_Q4_1 and {"weight", "m", "n", "k", "bytes_read"} <= gemm["args"].keys()
    # complete events nest: every kai call inside its op, every op inside a stage, nothing straddles
    open_: list[dict] = []
    for e in xs:  # sorted by (ts, -dur)
        start, end = round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)
        while open_ and round((open_[-1]["ts"] + open_[-1]["dur"]) * 1e3) <= start:
            open_.pop()
        parent = open_[-1] if open_ else None
        if parent is not None:
            assert end <= round((parent["ts"] + parent["dur"]) * 1e3), (parent["name"], e["name"])
        if e["cat"] in ("lhs_pack", "gemm", "gemv", "rhs_pack"):
            assert parent is not None and parent["cat"] in ("mul_mat", "repack")
        if e["cat"] in ("mul_mat", "repack"):
            assert any(p["cat"] == "stage" for p in open_)
        open_.append(e)


def test_run_trace_outputs(originals: dict, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    text = run_trace(MODEL, "Hi", 2, TARGET, json_out=True, chrome_trace_path=out, n_ctx=32)
    data = json.loads(text)
    assert data["target"].startswith("virtual SME2") and data["stages"][2]["summary"]["forward_passes"] == 1
    chrome = json.loads(out.read_text())
    assert any(e["ph"] == "X" and e["cat"] == "gemv" for e in chrome["traceEvents"])
    assert_restored(originals)


def test_text_report(trace) -> None:
    text = format_text(trace)
    for header in ("== model load ==", "== prefill ==", "== decode =="):
        assert header in text
    assert GEMM_Q4_1 in text and GEMV_Q4_1 in text and "└─ kai_run_rhs_pack_" in text


def test_hooks_restored_on_errors(originals: dict) -> None:
    with pytest.raises(KleidipyError):
        trace_generation("no-such-model", target=TARGET)
    assert_restored(originals)


def test_hooks_restored_when_generation_fails(originals: dict) -> None:
    tracer = Tracer()
    engine = tracer.load(MODEL, resolve_target(TARGET), 1, "jit", 16)
    assert_restored(originals)
    with pytest.raises(PromptError):
        tracer.generate(engine, [], 2)  # the empty prompt fails inside the traced generation
    assert_restored(originals)
    assert tracer not in engine.observers  # a failed generation detaches the tracer too
    assert tracer.generate(engine, engine.prompt("Hi"), 2)
    assert tracer not in engine.observers and len(tracer.stages["decode"].passes) == 1
    assert "forward" not in vars(engine.lm)  # observed through events: nothing of the model is patched
    assert_restored(originals)


def test_invocation_counts_from_frame_identity() -> None:
    """A frame shared with the previous op is one invocation; ``fresh`` marks where the new ones start."""
    ops = [
        Op(("A", "B", "C"), 0, "w0", 1, 1, 1, 0.0, 1.0, ()),
        Op(("A", "B", "C"), 2, "w1", 1, 1, 1, 1.0, 1.0, ()),  # same A and B, a new C
        Op(("A", "B", "C"), 1, "w2", 1, 1, 1, 2.0, 1.0, ()),  # same A, new B and C
    ]
    (a,) = call_tree(Stage("decode", ops=ops))
    b = a.children["B"]
    assert (a.calls, b.calls, b.children["C"].calls, a.seconds) == (1, 2, 3, 3.0)


# --------------------------------------------------------------------------------------------- compiled plan


def test_plan_trace_shows_the_plan_that_ran(trace, plan_trace) -> None:
    """The default trace runs the compiled plan: the same text and the same MUL_MATs (weights, m, kernels) as the
    op-by-op trace — but K, V and up without an LHS pack of their own (they take Q's and gate's) —, reached from
    CompiledForward.__call__, and every node timed per thread inside the plan."""
    assert plan_trace.graph and not trace.graph and plan_trace.text == trace.text
    for name in ("prefill", "decode"):
        eager, plan = trace.stage(name), plan_trace.stage(name)
        assert [(op.weight, op.m) for op in plan.ops] == [(op.weight, op.m) for op in eager.ops]
        shared = (".attn_k.", ".attn_v.", ".ffn_up.")
        want = [
            [c.name for c in op.calls if not (c.role == "lhs_pack" and any(s in op.weight for s in shared))]
            for op in eager.ops
        ]
        assert [[c.name for c in op.calls] for op in plan.ops] == want
        frames = ("CompiledForward.__call__", "CompiledForward._run", "CompiledForward._launch")
        assert all(op.frames[-3:] == frames for op in plan.ops)
        assert not eager.nodes and plan.nodes
        matmuls = [n for n in plan.nodes if n.op == "MUL_MAT"]
        assert [n.label for n in matmuls] == [op.weight for op in plan.ops]
        # a run takes every worker or the caller alone (prefill: the cores no other process wants; decode: by
        # measurement, its first run on every worker)
        assert max(len(node.threads) for node in plan.nodes) == 2 or name == "prefill"
        for node in plan.nodes:
            assert len(node.threads) in (1, 2)
            for start, packed, end in node.threads:
                assert start <= end and (packed is None) == (node.op != "MUL_MAT")
                assert packed is None or start <= packed <= end
        for p in plan.passes:  # every node of a pass inside the pass
            inside = [n for n in plan.nodes if p.start <= min(t[0] for t in n.threads) <= p.start + p.seconds]
            assert inside
    ops = {n.op for n in plan_trace.stage("prefill").nodes}
    assert {"MUL_MAT", "RMS_NORM", "ROPE", "STORE_KV", "ATTENTION", "SWIGLU", "ADD", "KEEP"} <= ops


def test_plan_trace_outputs(plan_trace) -> None:
    events = json.loads(json.dumps(chrome_trace(plan_trace)))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[2] == "plan thread 0" and names[3] == "plan thread 1"
    nodes = [e for e in events if e["ph"] == "X" and e["cat"] == "node"]
    runs = [n for s in plan_trace.stages for n in s.nodes]
    packs = sum(t[1] is not None for n in runs for t in n.threads)
    assert len(nodes) == sum(len(n.threads) for n in runs) + packs
    assert {e["tid"] for e in nodes} == {2, 3} and all(e["dur"] >= 0 for e in nodes)
    text = format_text(plan_trace)
    assert "compiled plan (timed inside it)" in text and "plan op" in text and "ATTENTION" in text
    data = json.loads(json.dumps(to_json(plan_trace)))
    assert data["graph"] is True
    table = {row["op"]: row for row in data["stages"][2]["nodes"]}
    decode = plan_trace.stage("decode")
    assert table["MUL_MAT"]["nodes"] == len(decode.ops) and table["ATTENTION"]["nodes"] > 0
