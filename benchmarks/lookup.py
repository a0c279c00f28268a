"""Benchmark of prompt-lookup decoding (``--lookup``): decode tokens/s with and without drafts on answers that repeat
their prompt, timed from outside the process.

Starts ``kleidipy serve`` in a subprocess (``benchmarks/server.py``'s launcher; one slot), then for each workload —
rewrite a code file (this repository's ``kleidipy/runtime/lookup.py``, a function renamed), and summarise a text
quoting its sentences — sends the same greedy streaming chat request with ``lookup`` 0 and N in alternating rounds.
A stream's decode rate is its tokens after the first over the time after the first content delta (the client's
clock); the answers of both settings are compared (greedy: they must be equal). Prints a markdown table.

    python benchmarks/lookup.py [-m MODEL] [-t THREADS] [--lookup 10] [--rounds 3] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import openai
from server import start_server  # (benchmarks/ is on the path when a script here runs)

CODE = (Path(__file__).resolve().parents[1] / "kleidipy" / "runtime" / "lookup.py").read_text()
TEXT = (
    "The lighthouse stood on the northern cape for two hundred years. Its keeper lit the lamp every evening at "
    "dusk and wrote the weather in a book. Ships passing the cape in winter relied on its light to find the "
    "channel between the rocks. In 1921 the lamp was electrified, and the keeper's house became a museum. Today "
    "the light still turns every night, and visitors climb the tower in summer to see the coast."
)
WORKLOADS = {
    "rewrite code": "Rewrite this Python module, renaming the function `draft` to `draft_tokens`. Output the whole "
    f"module and nothing else.\n\n```python\n{CODE}```",
    "summarise with quotes": "Summarise this text in three sentences, each quoting a sentence of it exactly."
    f"\n\n{TEXT}",
}


def one(client: openai.OpenAI, prompt: str, lookup: int, max_tokens: int) -> tuple[str, float]:
    """(answer, decode tokens/s after the first token) of one greedy streamed request."""
    stream = client.chat.completions.create(
        model="bench",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"lookup": lookup},
    )
    first, tokens, text = None, 0, []
    for chunk in stream:
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
        piece = "".join(c.delta.content or "" for c in chunk.choices)
        if piece:
            first = first or time.perf_counter()
            text.append(piece)
    end = time.perf_counter()
    return "".join(text), (tokens - 1) / (end - first) if first and end > first else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("-t", "--threads", type=int, default=1)
    parser.add_argument("--lookup", type=int, default=10, help="draft length N of the lookup rows (default 10)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    server = argparse.Namespace(model=args.model, threads=args.threads, ctx=4096, parallel=1, deterministic=False)
    proc, url = start_server(server)
    client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=3600)
    try:
        print(
            f"model {args.model}, {args.threads} thread(s), greedy, {args.max_tokens} tokens at most, "
            f"{args.rounds} rounds (each: no lookup, then lookup {args.lookup})"
        )
        print("\n| workload | decode t/s, no lookup | decode t/s, lookup | speed-up | same text |")
        print("|---|---|---|---|---|")
        for name, prompt in WORKLOADS.items():
            one(client, prompt, 0, 8)  # warm-up: the prompt in the slot's cache for both settings alike
            rates: dict[int, list[float]] = {0: [], args.lookup: []}
            texts: dict[int, set[str]] = {0: set(), args.lookup: set()}
            for _ in range(args.rounds):
                for n in rates:
                    text, rate = one(client, prompt, n, args.max_tokens)
                    rates[n].append(rate)
                    texts[n].add(text)
            plain, looked = (statistics.mean(rates[n]) for n in rates)
            same = texts[0] == texts[args.lookup] and len(texts[0]) == 1
            print(
                f"| {name} | {plain:.1f} ± {statistics.pstdev(rates[0]):.1f} | {looked:.1f} ± "
                f"{statistics.pstdev(rates[args.lookup]):.1f} | {looked / plain:.2f}x | {'yes' if same else 'NO'} |",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
