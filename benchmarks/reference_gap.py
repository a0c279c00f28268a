"""How far kleidipy's logits are from llama.cpp's, over every position of every reference prompt.

    python benchmarks/reference_gap.py [MODEL ...] [--target sme2:svl=512] [--reference ../shared/reference]

MODEL keys: smollm2-q4_1, smollm2-q4_0, smollm2-q8_0, qwen25-q4_0, qwen25-q4_k_m, gemma3-q4_k_m, gemma3-q4_0 (default:
all; a model without reference files in the folder is reported as such).
Shipped files come from the catalogue (``kleidipy pull``); the Q4_0/Q8_0 ones are made by ``kleidipy quantize
--pure`` (byte-identical to llama-quantize's) into the model cache's ``bench/`` folder. Per model it prints the mean
and 90th percentile over prompt positions of the largest |Δ| among llama.cpp's top-10 logits after removing the
mean shift (robust to the rounding noise one last logit row shows), top-1 agreement, the range over prompts of
the last-position max |Δ| that ``tests/runtime/test_runtime_reference.py`` bounds, how many prompts are llama.cpp's
bit for bit (every top-10 and the last row) and, for the others, the first position whose top-10 differs. The
reference's Qwen2.5 Q4_K_M files are in ``tests/data/llama_cpp``; ``--reference tests/data/llama_cpp_arm --target
i8mm smollm2-q4_0`` measures against llama.cpp on Arm (with KleidiAI, under QEMU: that folder's README), ``--reference
tests/data/llama_cpp_arm/sme2_svl512 --target sme2:svl=512`` against it on SME2 (smollm2-q4_0, smollm2-q8_0,
gemma3-q4_0). ``--threads`` sets kleidipy's thread count (default 1).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from e2e import requantized  # (benchmarks/ is on the path when a script here runs)

from kleidipy.runtime.generate import Engine
from kleidipy.runtime.pull import pull
from kleidipy.target import parse_target

HERE = Path(__file__).resolve().parent
SHIPPED = {
    "smollm2-q4_1": "smollm2-135m-instruct",
    "qwen25-q4_k_m": "qwen2.5-coder-0.5b-instruct",
    "gemma3-q4_k_m": "gemma3-270m",
}
#: key -> (catalogue model, type) made with `kleidipy quantize --pure`
REQUANTIZED = {
    "smollm2-q4_0": ("smollm2-135m-instruct", "q4_0"),
    "smollm2-q8_0": ("smollm2-135m-instruct", "q8_0"),
    "qwen25-q4_0": ("qwen2.5-coder-0.5b-instruct", "q4_0"),
    "gemma3-q4_0": ("gemma3-270m", "q4_0"),
}


def model_path(key: str) -> Path:
    if key in SHIPPED:
        return pull(SHIPPED[key])
    name, qtype = REQUANTIZED[key]
    return requantized(name, key, qtype)


def logits_dir(key: str, reference: Path) -> Path:
    if any((reference / "logits").glob(f"{key}__*__default.json")):
        return reference / "logits"
    if key.startswith("gemma3"):
        return reference / "gemma3" / "logits"
    if key == "qwen25-q4_k_m":
        return HERE.parent / "tests" / "data" / "llama_cpp" / "logits"
    return reference / "logits"


def measure(engine: Engine, folder: Path, key: str) -> str:
    gaps, agree, lasts, firsts = [], 0, [], []
    files = sorted(folder.glob(f"{key}__*__default.json"))
    if not files:
        return f"| {key} | no reference files in {folder} | | | | | |"
    for f in files:
        ref = json.loads(f.read_text())
        chat = ref["prompt_kind"] == "chat"
        ids = engine.chat_prompt(ref["messages"]) if chat else engine.prompt(ref["prompt_text"])
        engine.lm.reset()
        rows = engine.lm.forward(ids, all_logits=True)
        first = None
        for i, (pos, row) in enumerate(zip(ref["positions"], rows, strict=False)):
            tokens, values = [t for t, _ in pos["top10"]], [v for _, v in pos["top10"]]
            d = row[tokens] - np.array(values)
            gaps.append(float(np.abs(d - d.mean()).max()))
            agree += int(np.argmax(row)) == tokens[0]
            if first is None and not np.array_equal(row[tokens], np.array(values, np.float32)):
                first = i
        last = np.load(f.with_name(f.name.replace(".json", ".last_logits.npy")))
        lasts.append(float(np.abs(rows[-1] - last).max()))
        if first is not None or lasts[-1]:
            firsts.append(f"{ref['prompt_name']} {first}")
    n = len(lasts)
    return (
        f"| {key} | {np.mean(gaps):.4f} | {np.quantile(gaps, 0.9):.4f} | {agree}/{len(gaps)} | "
        f"{min(lasts):.2f}–{max(lasts):.2f} | {n - len(firsts)}/{n} | {', '.join(firsts) or '—'} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", choices=[*SHIPPED, *REQUANTIZED], help="default: all")
    parser.add_argument("--target", default="sme2:svl=512")
    parser.add_argument("--reference", type=Path, default=HERE.parent.parent / "shared" / "reference")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    print("| model | mean top-10 gap | p90 | top-1 | last-logit max \\|Δ\\| | bit for bit | first differing position |")
    print("|---|---|---|---|---|---|---|")
    for key in args.models or [*SHIPPED, *REQUANTIZED]:
        target = parse_target(args.target)
        engine = Engine(model_path(key), target=target, threads=args.threads, progress=False, notice=lambda _: None)
        print(measure(engine, logits_dir(key, args.reference), key), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
