"""Perplexity of a model over a text, computed as llama-perplexity computes it (one sequence per chunk).

The steps: docs/perplexity.md."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from kleidipy.errors import KleidipyError
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.sampler import log_softmax


class PerplexityError(KleidipyError, ValueError):
    """A perplexity run that cannot be done: bad context/batch sizes, or a text too short for one chunk."""


@dataclass
class PerplexityResult:
    """Per-chunk NLL sums and the running and final estimates (``[i]x.xxxx`` and ``PPL = x +/- y``)."""

    n_ctx: int
    n_tokens: int
    chunk_nll: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)
    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    @property
    def stderr(self) -> float:
        """llama-perplexity's uncertainty: sqrt(var / (count - 1)) * PPL (0 when the variance is not positive)."""
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        return math.sqrt(var / (self.count - 1)) * self.ppl if var > 0 and self.count > 1 else 0.0

    def final_line(self) -> str:
        return f"Final estimate: PPL = {self.ppl:.4f} +/- {self.stderr:.5f}"


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log_softmax(logits[i])[targets[i]] per row, float64, as llama.cpp's ``log_softmax``: float32 max and
    ``logit - max``, ``expf`` summed in float64."""
    return -log_softmax(logits)[np.arange(len(targets)), targets]


def check_options(n_ctx: int, n_chunks: int | None, n_batch: int) -> None:
    """:class:`PerplexityError` for a context, chunk count or batch size llama-perplexity would refuse (checked
    before a model is loaded)."""
    if n_ctx < 4 or n_ctx % 2:
        raise PerplexityError(f"the context (-c) must be an even number >= 4, got {n_ctx}")
    if n_batch < 1 or (n_batch < n_ctx and n_ctx % n_batch):
        raise PerplexityError(f"the batch size (-b {n_batch}) must divide the context {n_ctx} or be >= it")
    if n_chunks is not None and n_chunks < 1:
        raise PerplexityError(f"--chunks must be >= 1, got {n_chunks}")


def perplexity(
    engine: Engine,
    text: str,
    n_ctx: int = 512,
    n_chunks: int | None = None,
    n_batch: int = 2048,
    on_chunk: Callable[[PerplexityResult], None] | None = None,
    progress: bool = False,
) -> PerplexityResult:
    """llama-perplexity's estimate of ``text`` under ``engine``'s model (see docs/perplexity.md);
    ``on_chunk`` is called after every chunk with the result so far; ``progress`` shows a bar on stderr."""
    check_options(n_ctx, n_chunks, n_batch)
    if n_ctx > engine.context_length:
        raise PerplexityError(f"the context (-c {n_ctx}) exceeds the engine's context of {engine.context_length}")
    tok = engine.tokenizer
    tokens = np.asarray(tok.encode(text, add_special=True, parse_special=False), dtype=np.int64)
    if tokens.size < 2 * n_ctx:
        raise PerplexityError(
            f"the text is {tokens.size} tokens; perplexity with a context of {n_ctx} needs at least {2 * n_ctx}"
        )
    available = tokens.size // n_ctx
    result = PerplexityResult(n_ctx=n_ctx, n_tokens=int(tokens.size))
    first, batch = n_ctx // 2, min(n_batch, n_ctx)
    count = available if n_chunks is None else min(n_chunks, available)
    for i in tqdm(range(count), desc="perplexity", unit="chunk", disable=not progress, file=sys.stderr, leave=False):
        chunk = tokens[i * n_ctx : (i + 1) * n_ctx].copy()
        if tok.add_bos:
            chunk[0] = tok.bos_id
        engine.lm.reset()
        logits = [engine.lm.forward(chunk[lo : lo + batch], all_logits=True) for lo in range(0, n_ctx, batch)]
        logits = np.concatenate(logits) if len(logits) > 1 else logits[0]
        nll = token_nll(logits[first : n_ctx - 1], chunk[first + 1 :])
        result.chunk_nll.append(float(nll.sum()))
        result.nll += float(nll.sum())
        result.nll2 += float(np.square(nll).sum())
        result.count += nll.size
        result.running.append(result.ppl)
        if on_chunk:
            on_chunk(result)
    return result
