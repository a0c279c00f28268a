"""``kleidipy bench``: prompt-processing and text-generation throughput, measured and printed as llama-bench does.

For each thread count, ``ppN`` times one batch of N prompt tokens (one forward pass, GEMM kernels) and ``tgN``
times N single-token decode steps (GEMV kernels) from an empty context. As in llama-bench, the tokens are random
(a BOS first when the vocabulary adds one; seeded here, so runs are repeatable), the KV cache is cleared before
every run, one warm-up run precedes the timed ones (``ppN`` in full, ``tg1``), and each row reports the mean
± sample standard deviation of the per-repetition tokens/s. The model is loaded and repacked once.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from gguf import LlamaFileType
from tqdm import tqdm

from kleidipy.core.buffers import check_threads
from kleidipy.errors import InvalidArgumentError, KleidipyError
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.pull import default_model
from kleidipy.target import Target, resolve_target

#: seed of the random prompt / generation tokens
SEED = 1234
#: file-type names as llama.cpp prints them in a model description (others: the LlamaFileType name)
_FTYPE_SUFFIX = {"_S": " - Small", "_M": " - Medium", "_L": " - Large"}


class BenchError(KleidipyError, ValueError):
    """Bench parameters that cannot be run (no test, a count below its minimum, a test longer than the context)."""


@dataclass
class BenchRow:
    """One line of the table: a test (``pp512``, ``tg128``) at one thread count, with tokens/s per repetition."""

    model: str
    size_bytes: int
    n_params: int
    backend: str
    threads: int
    test: str
    n_tokens: int
    samples: list[float] = field(default_factory=list)  #: seconds per repetition

    @property
    def rates(self) -> list[float]:
        return [self.n_tokens / s for s in self.samples]

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.rates) if self.samples else 0.0

    @property
    def stdev_ts(self) -> float:
        return statistics.stdev(self.rates) if len(self.samples) > 1 else 0.0


def run_bench(
    model: str | os.PathLike[str] | Engine | None = None,
    n_prompt: int = 512,
    n_gen: int = 128,
    threads_list: Sequence[int] = (1,),
    repetitions: int = 3,
    target: Target | None = None,
    progress: bool = True,
    execution: str = "jit",
    notice: Callable[[str], None] = lambda msg: print(f"kleidipy: {msg}", file=sys.stderr),
    check_tensors: bool = True,
    repack_cache: bool = True,
    graph: bool = True,
    exact_weights: bool | None = None,
) -> list[BenchRow]:
    """Load ``model`` (a path or catalogue name, None: the default model; an :class:`Engine` is used as it is,
    ``target`` and ``execution`` then being its own) once and time ``pp{n_prompt}`` and ``tg{n_gen}`` (a count of
    0 skips the test) at every thread count of ``threads_list``, ``repetitions`` times each
    (see the module docstring)."""
    tests = [(name, n) for name, n in ((f"pp{n_prompt}", n_prompt), (f"tg{n_gen}", n_gen)) if n > 0]
    if n_prompt < 0 or n_gen < 0 or not tests:
        raise BenchError(f"need a prompt (-p) or generation (-n) length > 0, got -p {n_prompt} -n {n_gen}")
    if repetitions < 1:
        raise BenchError(f"repetitions (-r) must be >= 1, got {repetitions}")
    threads_list = _thread_counts(threads_list)
    if isinstance(model, Engine):
        engine = model
    else:
        engine = Engine(
            model or default_model(),
            target=target or resolve_target(),
            execution=execution,
            progress=progress,
            notice=notice,
            check_tensors=check_tensors,
            repack_cache=repack_cache,
            graph=graph,
            exact_weights=exact_weights,
        )
    longest = max(n_prompt, n_gen)
    if longest > engine.context_length:
        raise BenchError(f"a test of {longest} tokens does not fit the context of {engine.context_length}")
    model_desc, size_bytes, n_params = describe_model(engine)
    backend = f"kleidipy {target_label(engine.target)}"
    runs = len(threads_list) * len(tests) * (repetitions + 1)
    bar = tqdm(total=runs, desc="bench", unit="run", disable=not progress, file=sys.stderr, leave=False)
    rows = []
    threads_before = engine.backend.threads
    try:
        for threads in threads_list:
            engine.set_threads(threads)
            for test, n_tokens in tests:
                row = BenchRow(model_desc, size_bytes, n_params, backend, threads, test, n_tokens)
                timed = _time_prompt if test.startswith("pp") else _time_generation
                bar.set_postfix_str(f"{test} t={threads}", refresh=False)
                timed(engine, n_tokens if test.startswith("pp") else 1)  # warm-up (llama-bench: ppN, tg1)
                bar.update()
                for _ in range(repetitions):
                    row.samples.append(timed(engine, n_tokens))
                    bar.update()
                rows.append(row)
    finally:
        engine.set_threads(threads_before)
        bar.close()
    return rows


def parse_threads(text: str) -> list[int]:
    """``-t`` as llama-bench takes it: a comma-separated list of thread counts ("1,2,4")."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise BenchError(f"thread counts (-t) must be integers separated by commas, got {text!r}") from None
    return _thread_counts(values)


def _thread_counts(values: Sequence[int]) -> list[int]:
    """The thread counts, each checked as every thread count is (:func:`check_threads`)."""
    if not values:
        raise BenchError("no thread counts (-t) given")
    try:
        return [check_threads(v) for v in values]
    except InvalidArgumentError as exc:
        raise BenchError(f"thread counts (-t): {exc}") from None


def _random_tokens(engine: Engine, n: int, rng: np.random.Generator) -> np.ndarray:
    ids = rng.integers(0, engine.lm.hparams.n_vocab, size=n)
    bos = engine.tokenizer.encode("", add_special=True, parse_special=False)
    if bos:
        ids[0] = bos[0]
    return ids


def _time_prompt(engine: Engine, n: int) -> float:
    """Seconds for one forward pass over ``n`` random prompt tokens from an empty context."""
    ids = _random_tokens(engine, n, np.random.default_rng(SEED))
    engine.lm.reset()
    t0 = time.perf_counter()
    engine.lm.forward(ids)
    return time.perf_counter() - t0


def _time_generation(engine: Engine, n: int) -> float:
    """Seconds for ``n`` single-token decode steps (random tokens) from an empty context."""
    ids = _random_tokens(engine, n, np.random.default_rng(SEED))
    engine.lm.reset()
    t0 = time.perf_counter()
    for token in ids:
        engine.lm.forward([int(token)])
    return time.perf_counter() - t0


def describe_model(engine: Engine) -> tuple[str, int, int]:
    """llama-bench's model columns: "<arch> <size label> <file type>", tensor bytes, parameter count."""
    g = engine.gguf
    n_params = sum(math.prod(t.shape) for t in g.tensors.values())
    size_bytes = sum(int(t.data.nbytes) for t in g.tensors.values())
    label = g.get_str("general.size_label", "") or _params_label(n_params)
    ftype = g.get_int("general.file_type", -1)
    return f"{g.architecture} {label} {_ftype_name(ftype)}", size_bytes, n_params


def target_label(target: Target) -> str:
    """A target as ``--target`` spells it: ``sme2:svl=512``, ``i8mm``, ..."""
    return f"{target.name}:svl={target.svl_bits}" if target.svl_bits else target.name


def _ftype_name(ftype: int) -> str:
    try:
        name = LlamaFileType(ftype).name
    except ValueError:
        return "?"
    name = name.removeprefix("MOSTLY_").replace("ALL_F32", "F32")
    for suffix, words in _FTYPE_SUFFIX.items():
        if "_K" in name and name.endswith(suffix):
            return name[: -len(suffix)] + words
    return name


def _params_label(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{round(n / 1e6)}M"


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.2f} MiB" if n_bytes < 2**30 else f"{n_bytes / 2**30:.2f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def format_bench_table(rows: Sequence[BenchRow]) -> str:
    """The rows as llama-bench's markdown table (numbers right-aligned)."""
    header = ("model", "size", "params", "backend", "threads", "test", "t/s")
    right = (False, True, True, False, True, True, True)
    cells = [
        (
            r.model,
            _size(r.size_bytes),
            _params(r.n_params),
            r.backend,
            str(r.threads),
            r.test,
            f"{r.avg_ts:.2f} ± {r.stdev_ts:.2f}",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        padded = (v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if r else "-" * w for w, r in zip(widths, right, strict=True)) + " |"
    return "\n".join([line(header), rule, *(line(c) for c in cells)])
