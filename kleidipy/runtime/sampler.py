"""Next-token sampling with llama.cpp's semantics (its default sampler chain, without DRY/typical/XTC): ``[grammar]
-> penalties -> top-k -> top-p -> min-p -> temperature -> dist``. :class:`Sampler` runs the chain;
:func:`sampling_options` holds the values a user sets to :data:`OPTION_RANGES`.

Each step's rule: docs/sampling.md."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numba
import numpy as np

from kleidipy.errors import KleidipyError

if TYPE_CHECKING:
    from kleidipy.runtime.grammar import GrammarMatcher


class SamplingError(KleidipyError, ValueError):
    """Invalid sampling parameters, seed or logits (wrong shape, NaN)."""


class SamplingOptionError(SamplingError):
    """A user-set sampling option outside :data:`OPTION_RANGES`; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """llama.cpp's sampling parameters (defaults are llama.cpp's common defaults)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        values = (self.temperature, self.top_p, self.min_p, self.repeat_penalty)
        if not all(np.isfinite(v) for v in values) or self.repeat_penalty <= 0 or self.repeat_last_n < -1:
            raise SamplingError(f"invalid sampling parameters: {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


GREEDY = SamplingParams(temperature=0.0)

#: The range of each sampling option a user may set, the same for the CLI and the server: OpenAI's for the
#: temperature, top_p and the frequency/presence penalties; top_k 0 and min_p 0 are "off", repeat_last_n -1 "all".
OPTION_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_k": (0, math.inf),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "repeat_penalty": (1e-6, 10.0),
    "repeat_last_n": (-1, math.inf),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
}
_INTEGER_OPTIONS = frozenset(f.name for f in fields(SamplingParams) if f.type == "int")


def sampling_options(**options: float) -> SamplingParams:
    """SamplingParams from user-set options (unset ones take SamplingParams' defaults), each a finite number of
    the right kind inside :data:`OPTION_RANGES` (SamplingOptionError naming the option otherwise)."""
    checked = {}
    for name, value in options.items():
        if name not in OPTION_RANGES:
            raise SamplingOptionError(name, f"unknown sampling option {name!r}")
        kinds = (int,) if name in _INTEGER_OPTIONS else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
            kind = "an integer" if name in _INTEGER_OPTIONS else "a finite number"
            raise SamplingOptionError(name, f"{name} must be {kind}, got {value!r}")
        lo, hi = OPTION_RANGES[name]
        if not lo <= value <= hi:
            limits = f">= {lo:g}" if hi == math.inf else f"between {lo:g} and {hi:g}"
            raise SamplingOptionError(name, f"{name} must be {limits}, got {value}")
        checked[name] = int(value) if name in _INTEGER_OPTIONS else float(value)
    return SamplingParams(**checked)


def check_seed(seed: int | None) -> int | None:
    """A sampler seed: None (random) or any integer, taken modulo 2**64 (numpy's seeds are unsigned)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise SamplingError(f"the seed must be an integer, got {seed!r}")
    return int(seed) % 2**64


def greedy(logits: np.ndarray) -> int:
    """Argmax, ties going to the lowest token id."""
    return int(np.argmax(logits))


@numba.njit(cache=True, nogil=True)
def top_k(x: np.ndarray, k: int) -> np.ndarray:  # pragma: no cover - compiled
    """The ids of the k largest of x (0 < k <= x.size, no NaN), ordered by value and then by id (the lower id
    first among equal values). One pass in increasing id keeps the k best so far sorted: an entry joins only when
    it is greater than the worst kept (whose id is lower), which shifts the worse ones down by one."""
    ids = np.empty(k, np.int64)
    vals = np.empty(k, x.dtype)
    for i in range(k):  # the first k, sorted by value (descending), then id
        j = i
        while j > 0 and x[i] > vals[j - 1]:
            vals[j], ids[j] = vals[j - 1], ids[j - 1]
            j -= 1
        vals[j], ids[j] = x[i], i
    for i in range(k, x.size):
        v = x[i]
        if v > vals[k - 1]:
            j = k - 1
            while j > 0 and v > vals[j - 1]:
                vals[j], ids[j] = vals[j - 1], ids[j - 1]
                j -= 1
            vals[j], ids[j] = v, i
    return ids


def _check_logits(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits)
    if logits.ndim != 1 or logits.size == 0 or np.isnan(logits).any():
        raise SamplingError(f"logits must be a non-empty 1-D array without NaN, got shape {logits.shape}")
    return logits


def _softmax_f32(logits: np.ndarray) -> np.ndarray:
    """llama.cpp's softmax over candidates sorted by logit: expf(l - max) / sequential float32 sum."""
    e = np.exp(logits - logits[0])
    return e / np.cumsum(e)[-1]


class Sampler:
    """Draws next tokens from logits; ``Sampler(params, seed)`` is reproducible for a given seed. With a
    ``grammar`` matcher, only the tokens it allows are drawn and each chosen token must be passed to
    :meth:`accept`."""

    def __init__(
        self, params: SamplingParams = SamplingParams(), seed: int | None = None, grammar: GrammarMatcher | None = None
    ) -> None:
        self.params = params
        self.rng = np.random.default_rng(check_seed(seed))
        self.grammar = grammar

    def accept(self, token: int) -> None:
        """Advance the grammar (if any) by the chosen ``token``."""
        if self.grammar is not None:
            self.grammar.accept(token)

    @property
    def finished(self) -> bool:
        """Whether the grammar is complete (no token may follow); always False without one."""
        return self.grammar is not None and self.grammar.done

    def penalize(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """float32 logits with the repetition/frequency/presence penalties of ``history`` applied (a copy)."""
        p = self.params
        out = np.array(logits, dtype=np.float32)
        n = len(history) if p.repeat_last_n == -1 else p.repeat_last_n
        neutral = p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
        if n == 0 or neutral or not len(history):
            return out
        counts = Counter(int(t) for t in list(history)[-n:])
        ids = np.fromiter(counts, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= out.size:
            raise SamplingError(f"history holds token ids outside [0, {out.size})")
        c = np.fromiter(counts.values(), dtype=np.float32)
        r = np.float32(p.repeat_penalty)
        x = out[ids]
        x = np.where(x <= 0, x * r, x / r)
        out[ids] = x - (c * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty))
        return out

    def candidates(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The token ids left after penalties, top-k, top-p and min-p (sorted by logit, ties by id) and their
        float32 logits after temperature (unscaled when greedy)."""
        p = self.params
        x = self.penalize(_check_logits(logits), history)
        n = x.size
        if 0 < p.top_k < n:
            ids = top_k(x, p.top_k)
        else:
            ids = np.arange(n)
            ids = ids[np.lexsort((ids, -x))]
        lg = x[ids]
        if p.top_p < 1.0:
            reached = np.flatnonzero(np.cumsum(_softmax_f32(lg)) >= np.float32(p.top_p))
            if reached.size:
                ids, lg = ids[: reached[0] + 1], lg[: reached[0] + 1]
        if p.min_p > 0.0:
            keep = lg >= lg[0] + np.log(np.float32(p.min_p))
            ids, lg = ids[keep], lg[keep]
        if not p.greedy:
            lg = lg / np.float32(p.temperature)
        return ids, lg

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token id."""
        logits = _check_logits(logits)
        if self.grammar is not None:
            logits = self.grammar.mask(logits)
        if self.params.greedy:  # the filters never drop the maximum: argmax of the penalized logits
            return greedy(self.penalize(logits, history))
        ids, lg = self.candidates(logits, history)
        cum = np.cumsum(_softmax_f32(lg))
        i = int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"))
        return int(ids[min(i, ids.size - 1)])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of the last axis as llama.cpp computes them: float32 max and ``logit - max``,
    ``expf`` summed in float64."""
    logits = np.asarray(logits, dtype=np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted.astype(np.float64) - np.log(np.exp(shifted).sum(axis=-1, keepdims=True, dtype=np.float64))
