"""A short greedy generation and the bits of its logits, printed as one JSON line: the same on every host.

    python tests/tools/greedy_bits.py MODEL TARGET [PROMPT] [-n N] [--graph]

Loads MODEL (a catalogue name or GGUF path) for TARGET, prefills PROMPT (raw text, no chat template) and takes N
greedy steps; prints the token ids, the text, and the sha256 of every logits row (prompt's last, then each step's)
in order. ``test_same_bits_on_aarch64.py`` runs it on this host and under ``scripts/qemu-aarch64 --python``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

from kleidipy.runtime.generate import Engine
from kleidipy.target import parse_target


def greedy_bits(model: str, target: str, prompt: str, n: int, graph: bool) -> dict:
    """{"tokens", "text", "logits_sha256"} of ``n`` greedy steps after ``prompt``."""
    engine = Engine(model, target=parse_target(target), progress=False, graph=graph, notice=lambda _: None)
    engine.lm.reset()
    logits = engine.lm.forward(engine.prompt(prompt))
    digest, tokens = hashlib.sha256(), []
    for _ in range(n):
        digest.update(np.ascontiguousarray(logits, np.float32).tobytes())
        tokens.append(int(np.argmax(logits)))
        logits = engine.lm.forward([tokens[-1]])
    return {"tokens": tokens, "text": engine.tokenizer.decode(tokens), "logits_sha256": digest.hexdigest()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("target")
    parser.add_argument("prompt", nargs="?", default="The capital of France is")
    parser.add_argument("-n", type=int, default=8)
    parser.add_argument("--graph", action="store_true", help="the compiled plan (default: op by op)")
    args = parser.parse_args(argv)
    print(json.dumps(greedy_bits(args.model, args.target, args.prompt, args.n, args.graph)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
