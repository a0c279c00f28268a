"""F32 weights as llama.cpp master routes them (kernels.cpp's F32 table, kleidiai.cpp): on SME2 the MOPA GEMM at
m > 1 and the MLA GEMV at m == 1 on one packing, a tied LM head too (the duplicated token_embd loads as the output,
a MUL_MAT); every other target or table as before. A tiny model of F32 weights: the trace names the kernels, the
compiled plan gives the op-by-op bits at 1 and 2 threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from kernel_helpers import MatmulRecorder as Calls
from tiny_models import model_parts, write_model

from kleidipy.graph.execute import compile_model
from kleidipy.runtime.backend import KleidiBackend, route
from kleidipy.runtime.layers import CausalLM
from kleidipy.runtime.model_file import ModelFile
from kleidipy.target import F32_KLEIDIAI, parse_target, select_kernels, selected_uses

GEMM = "matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa"
GEMV = "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla"


@pytest.mark.parametrize(
    ("spec", "weight_type"),
    [
        ("sme2:svl=512", F32_KLEIDIAI),
        ("sme2:svl=128", F32_KLEIDIAI),
        ("sme2:svl=512,table=seeds", "f16"),
        ("sme:svl=512", "f16"),
        ("i8mm", "f16"),
        ("dotprod", "f16"),
    ],
)
def test_f32_weights_take_the_f32_table_on_sme2_only(spec: str, weight_type: str) -> None:
    target = parse_target(spec)
    assert route(T.F32, target=target) == weight_type
    assert route(T.F32, exact_weights=True, target=target) == (weight_type if weight_type == F32_KLEIDIAI else "f32")
    assert route(T.F16, target=target) == "f16" and route(T.F16, exact_weights=True, target=target) == "f32"
    backend = KleidiBackend(target)
    w = np.random.default_rng(0).standard_normal((40, 24)).astype(np.float32)
    assert backend("blk.0.attn_q.weight", T.F32, (24, 40), w).pair.weight_type == weight_type
    assert backend("token_embd.weight", T.F32, (24, 40), w).pair.weight_type == weight_type  # (a tied LM head)
    if weight_type == F32_KLEIDIAI:
        pair = select_kernels(weight_type, target)
        assert (pair.gemm.name, pair.gemv.name) == (GEMM, GEMV)
        uses = selected_uses(target)
        assert uses[GEMM] == [f"{F32_KLEIDIAI} GEMM"] and uses[GEMV] == [f"{F32_KLEIDIAI} GEMV"]


def _model(tmp_path: Path) -> Path:
    """A tiny llama of F32 weights with its own LM head (output.weight)."""
    _, arrays = model_parts("llama")
    head = np.random.default_rng(7).standard_normal((arrays["token_embd.weight"].shape[0], 64)) / 8
    return write_model(tmp_path / "f32.gguf", "llama", T.F32, tensors={"output.weight": head.astype(np.float32)})


def _run(path: Path, threads: int, plan: bool, calls: Calls) -> list[np.ndarray]:
    model = ModelFile(path)
    backend = KleidiBackend(parse_target("sme2:svl=512"), threads=threads, notice=lambda msg: None, observers=[calls])
    lm: CausalLM = model.arch.build(model, linear=backend, n_ctx=96, n_ubatch=512)
    if plan:
        assert compile_model(lm, threads, adaptive=False)
        lm.observers.append(calls)
    prompt = np.arange(1, 41, dtype=np.int64) % 200
    cache = lm.new_cache()
    out = [lm.forward(prompt, all_logits=True, cache=cache)] + [lm.forward([t], cache=cache) for t in (17, 99)]
    if plan:
        lm.compiled.close()
    return out


def test_a_model_of_f32_weights_runs_them(tmp_path: Path) -> None:
    path = _model(tmp_path)
    assert ModelFile(path).tensor("blk.0.ffn_up.weight").ggml_type == T.F32
    eager = Calls()
    want = _run(path, 1, False, eager)
    names = {(c.weight, c.m > 1): c.kernel.name for c in eager.calls}
    assert names[("blk.0.ffn_up.weight", True)] == GEMM and names[("blk.0.ffn_up.weight", False)] == GEMV
    assert names[("output.weight", True)] == GEMM and names[("output.weight", False)] == GEMV
    assert {c.kernel.name for c in eager.calls} == {GEMM, GEMV}
    for threads in (1, 2):
        for plan in (False, True):
            calls = Calls()
            got = _run(path, threads, plan, calls)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
            if plan:
                assert {(c.weight, c.kernel.name) for c in calls.calls} == {
                    (c.weight, c.kernel.name) for c in eager.calls
                }
