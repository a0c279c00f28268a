"""kleidipy on ``--target i8mm`` against llama.cpp itself on Arm: llama.cpp 0c1e570 with KleidiAI, cross-built for
aarch64 (NEON, DotProd, I8MM, no FP16 arithmetic) with GCC and run under QEMU (``tests/data/llama_cpp_arm/README.md``),
with the reference procedure (``../shared/reference``'s "logits" section), on SmolLM2-135M Q4_0 (``kleidipy quantize
--pure``, byte-identical to llama-quantize's file).

llama.cpp's KleidiAI path runs the same matmul kernels and packers as this target (the I8MM GEMM with the 4x8sb LHS
packer, the DotProd GEMV with the generic one), and kleidipy's own ops follow ggml-cpu's NEON code as GCC compiles
it (RoPE's fused products included), so the logits are llama.cpp's **bit for bit**: the top-10 ids and values of
every prompt position, the whole last row and the 32 greedy steps after it, for every prompt but ``long_prose``,
which is bit for bit up to position ``SAME_UNTIL`` (measured; a difference not yet traced starts there). At 1 and 2
threads (the compiled plan). Every test prints what it measured (``pytest -s``).
"""

from __future__ import annotations

import json

import numpy as np
import paths
import pytest
from model_files import SMOLLM2, requantized

from kleidipy.graph.execute import compile_model
from kleidipy.runtime.generate import Engine
from kleidipy.target import parse_target

ARM = paths.DATA / "llama_cpp_arm" / "logits"
#: per prompt, the first position whose top-10 is not llama.cpp's bit for bit (None: none), as measured
SAME_UNTIL = {
    "short_fact": None,
    "single_word": None,
    "code_python": None,
    "mixed_unicode": None,
    "long_prose": 148,
    "chat_capital": None,
}


@pytest.fixture(scope="module", params=[1, 2], ids=["1-thread", "2-threads"])
def engine(request: pytest.FixtureRequest) -> Engine:
    path = requantized(SMOLLM2, "q4_0")
    engine = Engine(path, target=parse_target("i8mm"), threads=request.param, progress=False, notice=print)
    assert compile_model(engine.lm, request.param, adaptive=False)  # every run on all the threads, busy cores or not
    return engine


@pytest.mark.parametrize("prompt", list(SAME_UNTIL))
def test_smollm2_q4_0_i8mm_is_llama_cpp_on_arm(engine: Engine, prompt: str) -> None:
    ref = json.loads((ARM / f"smollm2-q4_0__{prompt}__default.json").read_text())
    ids = engine.prompt(ref["prompt_text"]) if ref["prompt_kind"] != "chat" else engine.chat_prompt(ref["messages"])
    assert ids == ref["token_ids"]
    engine.lm.reset()
    rows = engine.lm.forward(ids, all_logits=True)
    same = []
    for row, pos in zip(rows, ref["positions"], strict=True):
        top = [t for t, _ in pos["top10"]]
        same.append(np.array_equal(row[top], np.array([v for _, v in pos["top10"]], np.float32)))
    first = next((i for i, s in enumerate(same) if not s), None)
    agree = sum(int(np.argmax(r)) == p["top10"][0][0] for r, p in zip(rows, ref["positions"], strict=True))
    last = np.load(ARM / ref["last_logits_npy"])
    print(
        f"{prompt}: {len(rows)} positions, first differing top-10 {first}, top-1 {agree}/{len(rows)}, "
        f"last-logit max |d| {np.abs(rows[-1] - last).max():.4f}"
    )
    want = SAME_UNTIL[prompt]
    if want is None:  # every position, the whole last row and the greedy steps, bit for bit
        assert first is None
        assert np.array_equal(rows[-1].view(np.uint32), last.view(np.uint32))
        row, greedy = rows[-1], []
        for step in range(len(ref["greedy"]["ids"])):
            greedy.append(int(np.argmax(row)))
            if step + 1 < len(ref["greedy"]["ids"]):
                row = np.asarray(engine.lm.forward([greedy[-1]])).reshape(-1, last.size)[-1]
        assert greedy == ref["greedy"]["ids"]
    else:
        assert first is None or first >= want
