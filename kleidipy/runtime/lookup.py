"""Prompt-lookup drafts (llama.cpp's ``llama-lookup``, llama-cpp-python's ``LlamaPromptLookupDecoding``): the tokens
that followed an earlier occurrence of the context's last n-gram, which a generation verifies in one forward pass.

The rule is llama-cpp-python's: the longest n-gram (``max_ngram`` down to 1) of the context's end that occurs
earlier, its first occurrence, and up to ``n_draft`` tokens after it. Hand-written: a few numpy lines."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kleidipy.errors import KleidipyError

#: the longest n-gram of the context's end a draft is looked up by
MAX_NGRAM = 3
#: the most tokens a step may draft
MAX_DRAFT = 64


class DraftError(KleidipyError, ValueError):
    """A draft length outside 0..MAX_DRAFT."""


def check_lookup(n: int) -> int:
    """``n`` when it is a draft length 0..MAX_DRAFT (0: no drafts), else DraftError."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_DRAFT:
        raise DraftError(f"--lookup must be 0..{MAX_DRAFT} tokens a step, got {n!r}")
    return n


def draft(history: Sequence[int], n_draft: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to ``n_draft`` tokens that followed the first earlier occurrence of the longest n-gram (``max_ngram``
    down to 1) that ends ``history``; [] when none occurs earlier or ``n_draft`` < 1."""
    ids = np.asarray(history, np.int64)
    n = ids.size
    if n_draft < 1 or n < 2:
        return []
    for size in range(min(max_ngram, n - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(ids[: n - 1], size)  # (every start but the end's own)
        starts = np.flatnonzero((windows == ids[n - size :]).all(axis=1))
        if starts.size:
            first = int(starts[0]) + size
            return ids[first : first + n_draft].tolist()
    return []
