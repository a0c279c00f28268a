"""kleidipy.tools.trace: a traced short generation of the default model on the virtual SME2 (SVL 512) target — stages,
frames, kernel names, counts against the model's hyper-parameters, JSON and Chrome trace outputs, the tracer
detached and nothing patched afterwards; ``kleidipy trace`` with no arguments tells llama.cpp master's story (the Q4_0
SME2 kernels, on a Q4_0 copy of the Q4_1 default model) in a summary of one screen, the tables behind ``--tables``,
``-n`` counts decode passes, and the seeds' table is one target option away."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T
from model_files import SMOLLM2, model_file
from tiny_models import write_model

from kleidipy.cli import main
from kleidipy.core.matmul import MatmulKernel
from kleidipy.errors import InvalidArgumentError, KleidipyError
from kleidipy.graph import contention
from kleidipy.runtime.backend import KleidiBackend
from kleidipy.runtime.generate import PromptError
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.pull import default_model
from kleidipy.target import resolve_target, select_kernels
from kleidipy.tools.trace import TRACE_DEFAULT, Op, Stage, Tracer, q4_0_copy, trace_generation, trace_target
from kleidipy.tools.trace_report import call_tree, chrome_trace, format_text, report, to_json

MODEL = SMOLLM2  # Q4_1: traced as its Q4_0 copy (as_q4_0=True), as `kleidipy trace` runs the default model
TARGET = "sme2:svl=512"
#: llama.cpp master's path: Q4_0 weights repacked at load (once, for both kernels), the LHS converted to F16 and
#: packed for the F16-LHS SME2 MOPA GEMM at prefill, quantized to int8 and packed for the SME2 SDOT GEMV at decode
RHS_PACK = "kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon"
LHS_PACK_GEMM = "kai_run_lhs_pack_f16pmrx2_f32_neon"
LHS_PACK = "kai_run_lhs_quant_pack_qsi8d32p_f32_neon"
GEMM_Q4_0 = "kai_run_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa"
GEMV_Q4_0 = "kai_run_matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot"
#: master's GEMM of the F16 KV cache: a batch's KQV (ggml's F16 matmul for one token)
KV_GEMM = "kai_run_matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa"
#: the seeds' path (Arm's Learning Path, ``table=seeds``): the LHS quantized to int8 for the int8 MOPA GEMM too
SEEDS_TARGET = "sme2:svl=512,table=seeds"
SEEDS_GEMM_Q4_0 = "kai_run_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
N_DECODE = 3
STAGES = ("model load", "prefill", "decode")
#: lines of one screen (42: master's prefill names the KV-cache GEMM of its attention in the plan's op line, which
#: takes three lines then)
SCREEN = 42
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
    prompt = "The capital of France is"
    return trace_generation(MODEL, prompt, N_DECODE, TARGET, n_ctx=64, graph=False, as_q4_0=True)


@pytest.fixture(scope="module")
def plan_trace(originals: dict):
    """The default path: the compiled plan on 2 threads, timed inside the plan — on cores no other process wants,
    whatever else runs on the machine (else a run may take the calling thread alone: graph/contention.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contention, "free_cores", lambda: 2)
        prompt = "The capital of France is"
        return trace_generation(MODEL, prompt, N_DECODE, TARGET, threads=2, n_ctx=64, as_q4_0=True)


@pytest.fixture(scope="module")
def default_text(originals: dict) -> str:
    """``kleidipy trace`` with no arguments (no KLEIDIPY_TARGET either), as a user runs it first."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.delenv("KLEIDIPY_TARGET", raising=False)
        assert main(["trace"]) == 0
    return out.getvalue()


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
    assert load.ops[0].frames[:3] == ("Engine.__init__", "Engine.__post_init__", "CausalLM.__init__")
    assert select_kernels("q4_0", resolve_target(TARGET)).gemm.rhs_packer.kai_name == RHS_PACK
    assert {op.calls[0].name for op in load.ops[:-1]} == {RHS_PACK}
    assert {op.weight_type for op in load.ops[:-1]} == {"Q4_0 -> q4_0"}  # the copy's weights, requantized
    assert trace.requantized is not None and trace.requantized.from_types == {"Q4_1": len(load.ops) - 1}
    assert trace.path == trace.requantized.copy and trace.kernel_types() == {"q4_0": len(load.ops) - 1, "q8_0": 1}
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
            assert name == (GEMV_Q4_0 if want_m == 1 else GEMM_Q4_0), op.weight
        assert [c.role for c in op.calls] == ["lhs_pack", "gemv" if want_m == 1 else "gemm"]
        lhs = LHS_PACK if want_m == 1 else LHS_PACK_GEMM
        assert op.calls[0].name == (lhs if op.weight != weights[-1] else "kai_run_lhs_quant_pack_qai8dxp_f32")
    assert kernels.count(GEMM_Q4_0) == len(weights) - len(last_rows)
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
        "LlamaBlock.forward",
    )
    attention += ("SelfAttention.forward", "EagerOps.matmul", "RepackedLinear.__call__")
    assert attention + ("compute_forward_mul_mat", GEMM_Q4_0) in paths(prefill)
    ffn = attention[:8] + ("GatedFFN.forward", "EagerOps.matmul", "RepackedLinear.__call__", "compute_forward_mul_mat")
    ffn += (GEMM_Q4_0,)
    assert ffn in paths(prefill)


def test_decode_gemv_and_counts(trace) -> None:
    decode = trace.stage("decode")
    weights = matmul_weights(trace.hparams)
    assert len(decode.passes) == trace.decoded_tokens == trace.n_decode == N_DECODE  # -n: decode passes
    assert all(p.tokens == 1 for p in decode.passes)
    assert [op.weight for op in decode.ops] == weights * len(decode.passes)
    assert all(op.m == 1 and op.calls[-1].role == "gemv" for op in decode.ops)
    assert {op.calls[-1].name for op in decode.ops if op.weight != weights[-1]} == {GEMV_Q4_0}
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
    assert (layers.frame, layers.calls) == ("LlamaBlock.forward", trace.hparams["n_layer"] * len(decode.passes))
    assert head.calls == len(decode.passes)  # the LM head, called from CausalLM._decode
    leaves = [c for c in head.children["compute_forward_mul_mat"].children.values()]
    assert [leaf.calls for leaf in leaves] == [len(decode.passes)] * 2


def test_json_and_chrome_trace(trace, tmp_path: Path) -> None:
    data = json.loads(json.dumps(to_json(trace)))
    assert [s["name"] for s in data["stages"]] == ["model load", "prefill", "decode"]
    assert data["stages"][0]["summary"]["repacks"] == len(matmul_weights(trace.hparams))
    assert data["stages"][1]["tree"][0]["frame"] == "Engine.generate"
    assert any(row["kernel"] == GEMV_Q4_0 for row in data["stages"][2]["kernels"])

    events = json.loads(json.dumps(chrome_trace(trace)))["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in xs)
    n_ops = sum(len(s.ops) for s in trace.stages)
    assert sum(e["cat"] in ("gemm", "gemv", "rhs_pack") for e in xs) == n_ops
    assert sum(e["cat"] in ("mul_mat", "repack") for e in xs) == n_ops
    assert [e["name"] for e in xs if e["cat"] == "stage"] == ["model load", "prefill", "decode"]
    gemm = next(e for e in xs if e["cat"] == "gemm")
    assert gemm["name"] == GEMM_Q4_0 and {"weight", "m", "n", "k", "bytes_read"} <= gemm["args"].keys()
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


def test_report_outputs(originals: dict, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    trace = trace_generation(MODEL, "Hi", 1, TARGET, n_ctx=32, as_q4_0=True)
    text = report(trace, json_out=True, chrome_trace_path=out)
    data = json.loads(text)
    assert data["target"].startswith("virtual SME2") and data["stages"][2]["summary"]["forward_passes"] == 1
    assert (data["n_decode"], data["decoded_tokens"], data["target_source"]) == (1, 1, "--target")
    assert data["requantized"]["from_types"] == {"Q4_1": 210} and data["kernel_types"] == {"q4_0": 210, "q8_0": 1}
    chrome = json.loads(out.read_text())
    assert any(e["ph"] == "X" and e["cat"] == "gemv" for e in chrome["traceEvents"])
    assert_restored(originals)


def unwrapped(text: str) -> str:
    """The report with its wrapped lines joined (a long line goes on after a line break and two spaces)."""
    return text.replace("\n  ", " ")


def parts(text: str) -> dict[str, str]:
    """The summary's parts: "head" (the run), then each stage's, from its ``== stage`` title on."""
    head, *stages = text.split("\n\n== ")
    return {"head": head} | {name: part for part in stages for name in STAGES if part.startswith(name)}


def test_text_report(trace) -> None:
    """The summary of the op-by-op path: per stage the Python frames down to the seeds' kai_run_ calls."""
    text = format_text(trace)
    stage = parts(text)
    assert list(stage) == ["head", *STAGES]
    assert "├─ " + RHS_PACK in stage["model load"] and "KleidiBackend.__call__ ×211" in stage["model load"]
    for name, kernel in (("prefill", GEMM_Q4_0), ("decode", GEMV_Q4_0)):
        assert LHS_PACK in stage[name] and kernel in stage[name] and "compute_forward_mul_mat" in stage[name]
    assert LHS_PACK_GEMM in stage["prefill"] and LHS_PACK_GEMM not in stage["decode"]
    assert GEMM_Q4_0 not in stage["decode"] and SEEDS_GEMM_Q4_0 not in text
    assert f"== decode: {N_DECODE} passes of 1 token in " in text
    head = unwrapped(stage["head"])
    assert "210 Q4_1 matrices requantized to Q4_0 as llama-quantize does" in head
    assert "(--no-as-q4_0: the file as it is)" in head and "op by op" in head
    want = f"{N_DECODE + 1} predicted: token 1 from the prefill's logits, tokens 2-{N_DECODE + 1} from {N_DECODE}"
    assert f"{want} decode passes (-n {N_DECODE}): {trace.text!r}" in head
    assert "blk.0.attn_q.weight" not in text  # the tables: --tables


def test_default_invocation_tells_master_story(default_text: str) -> None:
    """`kleidipy trace`: llama.cpp master's Q4_0 SME2 stacks — the RHS repack at load, the F16 LHS pack and the
    F16-LHS MOPA GEMM at prefill, the LHS quantize+pack and the SDOT GEMV at decode — on the trace's own SME2 target,
    8 decode passes, on one screen."""
    lines = default_text.rstrip("\n").splitlines()
    assert len(lines) <= SCREEN, default_text
    stage = parts(default_text)
    head = unwrapped(stage["head"])
    assert "target: virtual SME2 CPU, SVL 512" in head and "the trace's default (--target chooses)" in head
    assert "llama.cpp's master kernel table" in head
    assert ("requantized to Q4_0" in head) == (q4_0_copy(default_model()) is not None)
    assert "kernels q4_0 (" in head and "(-n 8" in head and "compiled plan" in head
    assert RHS_PACK in stage["model load"] and "KleidiBackend.__call__ ×" in stage["model load"]
    for name in ("prefill", "decode"):
        assert "Engine.generate → Generation.step" in stage[name] and "CompiledForward._launch" in stage[name]
        assert LHS_PACK in stage[name]
    assert LHS_PACK_GEMM in stage["prefill"] and LHS_PACK_GEMM not in stage["decode"]
    assert GEMM_Q4_0 in stage["prefill"] and GEMV_Q4_0 in stage["decode"] and GEMM_Q4_0 not in stage["decode"]
    assert f"ATTENTION (KQV: {KV_GEMM})" in unwrapped(stage["prefill"]) and KV_GEMM not in unwrapped(stage["decode"])
    assert "blk.0.attn_q.weight" not in default_text and "--tables" in lines[-1]


def test_seeds_table_one_option_away(originals: dict) -> None:
    """``--target sme2:svl=512,table=seeds``: the seeds' int8 MOPA GEMM at prefill (its LHS quantized, no F16
    pack), the same SDOT GEMV at decode on the same packed weights; the head names the table."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["trace", "--target", SEEDS_TARGET, "-n", "1"]) == 0
    stage = parts(out.getvalue())
    assert "llama.cpp's seeds kernel table" in unwrapped(stage["head"]) and RHS_PACK in stage["model load"]
    assert SEEDS_GEMM_Q4_0 in stage["prefill"] and LHS_PACK in stage["prefill"] and GEMV_Q4_0 in stage["decode"]
    assert GEMM_Q4_0 not in out.getvalue() and LHS_PACK_GEMM not in out.getvalue()
    assert KV_GEMM not in unwrapped(out.getvalue())
    assert_restored(originals)


def test_tables_behind_the_flag(plan_trace) -> None:
    """--tables: the summary, then per stage the full tree and the tables per kernel, weight and plan op."""
    summary, full = format_text(plan_trace), format_text(plan_trace, tables=True)
    assert len(summary.splitlines()) <= SCREEN
    assert full.startswith(summary.rsplit("\n\n", 1)[0] + "\n\n== model load: tables ==")
    for table in ("KleidiAI function", "plan op ", "blk.0.attn_q.weight"):
        assert table not in summary and table in full
    assert full.count("\nblk.0.attn_q.weight ") == 3  # the weight tables of the load, the prefill and the decode


def test_n_counts_decode_passes() -> None:
    """-n is the decode passes (llama-bench's -n): 0 or more, checked before anything loads."""
    with pytest.raises(InvalidArgumentError, match="-n counts decode passes"):
        trace_generation("no-such-model", n_decode=-1, target=TARGET)


def test_the_file_as_it_is_says_its_family_and_the_flag(tmp_path: Path) -> None:
    """Another model than the default is traced as it is: a Q4_1 one says in one line that it ran the Q4_1 family
    and which flag shows the seeds' Q4_0 path; -n 0 runs the prefill alone (one token, from its logits)."""
    model = write_model(tmp_path / "tiny.gguf", "llama", T.Q4_1)
    trace = trace_generation(model, "hi", 0, TARGET, n_ctx=32, graph=False)
    assert trace.requantized is None and trace.path == str(model) and "q4_1" in trace.kernel_types()
    assert trace.decoded_tokens == 0 and not trace.stage("decode").passes and len(trace.stage("prefill").passes) == 1
    head = unwrapped(parts(format_text(trace))["head"])
    (line,) = [line for line in head.splitlines() if line.startswith("weights:")]
    assert "q4_1 (" in line and "not the seeds' Q4_0 path (--as-q4_0 traces a copy requantized to Q4_0)" in line
    assert "1 predicted: token 1 from the prefill's logits (-n 0)" in head
    assert "\n\n== decode: no forward pass" in format_text(trace)


def test_q4_0_copy_made_once_per_model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Q4_0 copy goes to the cache's trace/ folder once; a changed model file gets a new copy, replacing the old;
    a Q4_0 model needs none."""
    monkeypatch.setenv("KLEIDIPY_CACHE", str(tmp_path / "cache"))
    src = write_model(tmp_path / "tiny.gguf", "llama", T.Q4_1)
    first, again = q4_0_copy(src), q4_0_copy(src)
    assert first.copy == again.copy and Path(first.copy).parent == tmp_path / "cache" / "trace"
    assert (first.reused, again.reused, again.seconds) == (False, True, 0.0)
    types = {t.ggml_type for t in ModelFile(first.copy).tensors.values() if ".attn_q." in t.name}
    assert types == {T.Q4_0} and first.from_types["Q4_1"] > 0
    assert q4_0_copy(first.copy) is None
    stat = src.stat()
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    newer = q4_0_copy(src)
    assert newer.copy != first.copy and not newer.reused and not Path(first.copy).exists()


def test_trace_target_is_the_seeds_sme2_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace's target is sme2:svl=512 unless --target or KLEIDIPY_TARGET names one, whatever `run`'s default."""
    monkeypatch.delenv("KLEIDIPY_TARGET", raising=False)
    target = trace_target(None)
    assert (target.name, target.svl_bits, target.source) == ("sme2", 512, TRACE_DEFAULT)
    monkeypatch.setenv("KLEIDIPY_TARGET", "i8mm")
    assert (trace_target(None).name, trace_target(None).source) == ("i8mm", "KLEIDIPY_TARGET")
    assert (trace_target("dotprod").name, trace_target("dotprod").source) == ("dotprod", "--target")


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
    attention = f"ATTENTION (KQV: {KV_GEMM})"  # (master's table: a batch's KQV through the KV-cache GEMM)
    assert {"MUL_MAT", "RMS_NORM", "ROPE", "STORE_KV", attention, "SWIGLU", "ADD", "KEEP"} <= ops
    assert "ATTENTION" in {n.op for n in plan_trace.stage("decode").nodes} and "ATTENTION" not in ops


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
    assert "compiled plan (timed inside it)" in text and "\nplan (ms): " in text and "ATTENTION" in text
    data = json.loads(json.dumps(to_json(plan_trace)))
    assert data["graph"] is True
    table = {row["op"]: row for row in data["stages"][2]["nodes"]}
    decode = plan_trace.stage("decode")
    assert table["MUL_MAT"]["nodes"] == len(decode.ops) and table["ATTENTION"]["nodes"] > 0
    # the tables are the plan's clock summed as the server's Inside view sums it (ClockSums.rows): the same stamps
    # the per-call records and the plan's nodes come from
    for stage, row in zip(plan_trace.stages[1:], data["stages"][1:], strict=True):
        kernels, ops = stage.sums.rows(stage.wall_s, matmul=True)
        assert row["kernels"] == json.loads(json.dumps(kernels)) and [r["op"] for r in row["nodes"]] == [
            r["op"] for r in ops
        ]
        for r in row["kernels"]:
            calls = [c for c in stage.kai_calls() if c.name == r["kernel"] and c.role == r["role"]]
            # (a kernel whose LHS an earlier node packed: the clock counts it from the first thread's start)
            assert r["calls"] == len(calls) and r["seconds"] >= sum(c.seconds for c in calls) - 1e-6
            assert r["bytes_read"] == sum(c.bytes_read for c in calls) and 0 < r["share"] <= 1
        per_op = {}
        for n in stage.nodes:
            per_op[n.op] = per_op.get(n.op, 0.0) + max(t[2] for t in n.threads) - min(t[0] for t in n.threads)
        assert {r["op"]: pytest.approx(r["seconds"], abs=1e-6) for r in row["nodes"]} == per_op
