"""llama.cpp's pp/tg tokens/s the way ``llama-bench`` measures them, through llama-cpp-python's low-level API.

    python benchmarks/llama_cpp_bench.py MODEL.gguf -p 512 -n 128 -t 2 -r 2      # prints one JSON line

pp: the prompt as one ``llama_decode`` (n_batch = n_ubatch = the prompt), then ``llama_synchronize``; tg: one token
per ``llama_decode`` + ``llama_synchronize``; the KV cache cleared before each test and filled (untimed) with
``-d`` tokens; first a warm-up as llama-bench's (the whole prompt, then one generated token); no logits are read
(llama-bench's procedure: llama-bench's own pp512 and tg128 agree with this script's within the spread on this
machine). It needs only llama-cpp-python (no kleidipy), so ``benchmarks/e2e.py`` can run it with another interpreter
(``--llama-cpp-python``), in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time


def bench(path: str, n_prompt: int, n_gen: int, threads: int, reps: int, depth: int = 0) -> dict[str, list[float]]:
    import llama_cpp as lc

    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(path.encode(), lc.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp cannot load {path}")
    cp = lc.llama_context_default_params()
    cp.n_ctx = depth + n_prompt + n_gen + 8
    cp.n_batch = cp.n_ubatch = max(n_prompt, depth, 1)
    cp.n_threads = cp.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, cp)
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    rng = random.Random(0)
    prompt = [rng.randrange(3, n_vocab) for _ in range(n_prompt)]
    gen = [rng.randrange(3, n_vocab) for _ in range(n_gen)]
    filler = [rng.randrange(3, n_vocab) for _ in range(depth)]

    def decode(ids: list[int]) -> None:
        tokens = (lc.llama_token * len(ids))(*ids)
        if lc.llama_decode(ctx, lc.llama_batch_get_one(tokens, len(ids))) != 0:
            raise SystemExit("llama_decode failed")
        lc.llama_synchronize(ctx)

    def fresh() -> None:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        if filler:
            decode(filler)

    fresh()  # warm-up, as llama-bench's: the prompt in full (every buffer of the run touched), then one token
    decode(prompt)
    decode(gen[:1])
    pp, tg = [], []
    try:
        for _ in range(reps):
            fresh()
            t0 = time.perf_counter()
            decode(prompt)
            pp.append(n_prompt / (time.perf_counter() - t0))
            fresh()
            t0 = time.perf_counter()
            for tok in gen:
                decode([tok])
            tg.append(n_gen / (time.perf_counter() - t0))
    finally:
        lc.llama_free(ctx)
        lc.llama_model_free(model)
    return {"pp": pp, "tg": tg}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-r", "--reps", type=int, default=2)
    ap.add_argument("-d", "--n-depth", type=int, default=0, help="tokens in the cache before each test")
    args = ap.parse_args(argv)
    print(json.dumps(bench(args.model, args.n_prompt, args.n_gen, args.threads, args.reps, args.n_depth)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
