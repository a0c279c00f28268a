"""Benchmark of the host-side work before the first token: opening a GGUF, tokenizing, format conversions.

Prints a markdown table, best of ``-r`` runs each (CPU time of this process, so another process on the machine
does not inflate it): opening SmolLM2's GGUF (header, metadata, 49,152-token vocabulary; ``gguf.GGUFReader``
beside it), tokenizing the 11 kB Apache-2.0 licence that llama-perplexity reads (SmolLM2 and Qwen2.5 BPE, cold
merge cache), and quantizing + dequantizing a 49152 × 576 float tensor (SmolLM2's embedding) to each GGML format.
Then the repack stage of loading the K-quant models (Qwen2.5-Coder 0.5B and Gemma 3 270M, Q4_K_M) for the default
target: the first load converts and packs every weight and writes the repack cache (its file is removed first), the
next ``-r`` read the cache (wall seconds of ``Engine.timings.repack_s``, best of them; the cache write is not part of
it).

    python benchmarks/load.py [-r 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from kleidipy.formats import q4_0, q4_1, q8_0
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.pull import pull
from kleidipy.runtime.repack_cache import cache_path
from kleidipy.runtime.tokenizer import Tokenizer
from kleidipy.target import Target, resolve_target

TEXT = Path(__file__).resolve().parents[2] / "shared" / "reference" / "perplexity" / "Apache-2.0.txt"


def best_cpu_seconds(fn: Callable[[], object], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def repack_seconds(path: Path, target: Target) -> float:
    """Wall seconds of one load's repack stage (the engine is dropped before the next load)."""
    return Engine(path, target=target, progress=False, notice=lambda msg: None).timings.repack_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--repetitions", type=int, default=3)
    args = parser.parse_args()
    reps = args.repetitions
    rows: list[tuple[str, str, str]] = []

    smollm2 = pull("smollm2-135m-instruct")
    size = smollm2.stat().st_size / 1e6
    rows.append(
        ("open SmolLM2 GGUF (kleidipy)", f"{best_cpu_seconds(lambda: ModelFile(smollm2), reps):.3f}", f"{size:.0f} MB")
    )
    rows.append(
        ("open SmolLM2 GGUF (gguf.GGUFReader)", f"{best_cpu_seconds(lambda: gguf.GGUFReader(smollm2), 1):.3f}", "")
    )

    text = TEXT.read_text().removesuffix("\n")
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"):
        tok = Tokenizer.from_gguf(pull(name))
        n = len(tok.encode(text))

        def encode_cold(tok: Tokenizer = tok) -> None:
            tok._bpe_cache.clear()
            tok.encode(text)

        seconds = best_cpu_seconds(encode_cold, reps)
        rows.append((f"tokenize Apache-2.0 ({name})", f"{seconds:.3f}", f"{n / seconds:,.0f} tokens/s"))

    x = np.random.default_rng(0).standard_normal((49152, 576), dtype=np.float32)
    for label, mod in (("Q4_0", q4_0), ("Q4_1", q4_1), ("Q8_0", q8_0)):
        seconds = best_cpu_seconds(lambda mod=mod: mod.dequantize(mod.quantize(x), *x.shape), reps)
        rows.append(
            (f"quantize + dequantize 49152x576 {label}", f"{seconds:.3f}", f"{x.nbytes / seconds / 1e9:.2f} GB/s")
        )

    target = resolve_target()
    for name in ("qwen2.5-coder-0.5b-instruct", "gemma3-270m"):
        path = pull(name)
        cache_path(path, target, "jit").unlink(missing_ok=True)
        seconds = [repack_seconds(path, target) for _ in range(1 + reps)]
        rows.append((f"first load of {name}: repack (wall s)", f"{seconds[0]:.3f}", "converts, packs, writes cache"))
        rows.append((f"next loads of {name}: repack (wall s, best)", f"{min(seconds[1:]):.3f}", "reads the cache"))

    print("| step | CPU s (best) | rate |")
    print("|---|---:|---:|")
    for row in rows:
        print(f"| {' | '.join(row)} |")


if __name__ == "__main__":
    main()
