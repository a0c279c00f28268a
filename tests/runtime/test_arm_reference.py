"""kleidipy against llama.cpp itself on Arm: llama.cpp 0c1e570 with KleidiAI v1.24.0, cross-built for aarch64 (NEON,
DotProd, I8MM, no FP16 arithmetic; KleidiAI's SME2 kernels) with GCC and run under QEMU
(``tests/data/llama_cpp_arm/README.md``, ``make_arm_reference.py``), with the reference procedure
(``../shared/reference``'s "logits" section): ``--target i8mm`` against the CPU without SME (``logits/``) and
``--target sme2:svl=512`` (llama.cpp master's table) against SME2 at SVL 512 with ``GGML_KLEIDIAI_SME`` = the thread
count (``sme2_svl512/logits/``), on SmolLM2-135M requantized to pure Q4_0 and Q8_0 and Gemma 3 270M to pure Q4_0
(``kleidipy quantize --pure``, byte-identical to llama-quantize's files).

llama.cpp's KleidiAI path runs the same matmul kernels and packers as the target (on SME2 the F16-LHS GEMM at prefill
and KleidiAI's BF16 GEMM for a batch's KQV), and kleidipy's own ops follow ggml-cpu's NEON code as GCC compiles it
(RoPE's fused products, GELU's fma, glibc's cosf/sinf for RoPE's tables), so the logits are llama.cpp's **bit for
bit**: the top-10 ids and values of every prompt position, the whole last row and the 32 greedy steps after it. At 1
and 2 threads (the compiled plan). Every test prints what it measured (``pytest -s``).
"""

from __future__ import annotations

import json

import numpy as np
import paths
import pytest
from model_files import GEMMA3, SMOLLM2, requantized

from kleidipy.graph.execute import compile_model
from kleidipy.runtime.generate import Engine
from kleidipy.target import parse_target

ARM = paths.DATA / "llama_cpp_arm"
#: the reference sets: (target, folder of the reference files)
SETS = {"i8mm": ARM / "logits", "sme2:svl=512": ARM / "sme2_svl512" / "logits"}
#: the models of the reference files' names: (catalogue model, --pure type)
MODELS = {"smollm2-q4_0": (SMOLLM2, "q4_0"), "smollm2-q8_0": (SMOLLM2, "q8_0"), "gemma3-q4_0": (GEMMA3, "q4_0")}
#: (target, model, prompt) of every reference file
CASES = sorted(
    (target, path.name.split("__")[0], path.name.split("__")[1])
    for target, folder in SETS.items()
    for path in folder.glob("*__*__default.json")
)


@pytest.fixture(scope="module", params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> int:
    return request.param


_ENGINES: dict[tuple[str, str, int], Engine] = {}


def _engine(target: str, model: str, threads: int) -> Engine:
    """One engine per (target, model, threads), its plan run on all the threads (busy cores or not)."""
    key = (target, model, threads)
    if key not in _ENGINES:
        engine = Engine(requantized(*MODELS[model]), target=parse_target(target), threads=threads, progress=False)
        assert compile_model(engine.lm, threads, adaptive=False)
        _ENGINES[key] = engine
    return _ENGINES[key]


def test_every_model_and_set_has_cases() -> None:
    assert {(t, m) for t, m, _ in CASES} >= {("i8mm", "smollm2-q4_0"), ("i8mm", "gemma3-q4_0")} | {
        ("sme2:svl=512", m) for m in MODELS
    }


@pytest.mark.parametrize("target,model,prompt", CASES, ids=["-".join(c) for c in CASES])
def test_logits_are_llama_cpp_on_arm(target: str, model: str, prompt: str, threads: int) -> None:
    folder = SETS[target]
    ref = json.loads((folder / f"{model}__{prompt}__default.json").read_text())
    engine = _engine(target, model, threads)
    ids = engine.prompt(ref["prompt_text"]) if ref["prompt_kind"] != "chat" else engine.chat_prompt(ref["messages"])
    assert ids == ref["token_ids"]
    engine.lm.reset()
    rows = engine.lm.forward(ids, all_logits=True)
    same = []
    for row, pos in zip(rows, ref["positions"], strict=True):
        top = [t for t, _ in pos["top10"]]
        same.append(np.array_equal(row[top], np.array([v for _, v in pos["top10"]], np.float32)))
    first = next((i for i, s in enumerate(same) if not s), None)
    last = np.load(folder / ref["last_logits_npy"])
    print(f"{target} {model} {prompt}: {len(rows)} positions, first differing top-10 {first}, "
          f"last-logit max |d| {np.abs(rows[-1] - last).max():.4f}")  # fmt: skip
    assert first is None
    assert np.array_equal(rows[-1].view(np.uint32), last.view(np.uint32))
    row, greedy = rows[-1], []
    for step in range(len(ref["greedy"]["ids"])):
        greedy.append(int(np.argmax(row)))
        if step + 1 < len(ref["greedy"]["ids"]):
            row = np.asarray(engine.lm.forward([greedy[-1]])).reshape(-1, last.size)[-1]
    assert greedy == ref["greedy"]["ids"]
