"""The generate loop: load a model end to end, then prefill (GEMM) and decode (GEMV) with streaming output.

:class:`Engine` opens a GGUF (a path or a catalogue name, pulled on first use), checks that every weight is finite
(``check_tensors``, llama.cpp's ``--check-tensors``), builds the tokenizer and chat template from its metadata,
repacks every matmul weight once for the target's kernels (progress bar; read back from the repack cache when an
earlier load made them), and builds the architecture.
:meth:`Engine.generate` yields text pieces as tokens are sampled and records :class:`Timings` (load, repack,
prefill and decode tokens/s) the way llama.cpp's tools report them.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm import tqdm

from kleidipy.core.buffers import check_threads
from kleidipy.errors import KleidipyError
from kleidipy.graph.execute import compile_model, plannable
from kleidipy.observer import Observer, RepackCall
from kleidipy.runtime import lookup as prompt_lookup
from kleidipy.runtime import plan_build, tensor_check
from kleidipy.runtime.backend import KleidiBackend, exact_weights_default
from kleidipy.runtime.chat_template import ChatTemplate
from kleidipy.runtime.grammar import Grammar
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.pull import resolve_model
from kleidipy.runtime.repack_cache import RepackCache
from kleidipy.runtime.sampler import Sampler, SamplingParams, log_softmax
from kleidipy.runtime.tokenizer import TOKENIZER_KEYS, StreamDetokenizer, Tokenizer
from kleidipy.target import Target, resolve_target

#: Why a generation ended: an end-of-generation token or a stop string ("stop"), or the token budget or the
#: context ("length") — OpenAI's finish reasons.
FinishReason = Literal["stop", "length"]
#: One forward pass: token ids -> logits of the last position (or, for a drafting step's, of every position
#: [m, n_vocab], each as a decode step computes it).
Forward = Callable[[Sequence[int]], np.ndarray]


class PromptError(KleidipyError, ValueError):
    """A prompt that cannot be run: empty, or longer than the context."""


def check_prompt_text(text: str) -> str:
    """The prompt, or a PromptError when it is empty or holds bytes that were not valid UTF-8 (which Python
    keeps as lone surrogates when it decodes command-line arguments)."""
    if not text:
        raise PromptError("the prompt is empty")
    bad = next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)
    if bad is not None:
        raise PromptError(f"the prompt is not valid UTF-8 (at character {bad})")
    return text


@dataclass
class Timings:
    """Wall-clock seconds of each stage and the token counts, as llama.cpp's timing summary."""

    load_s: float = 0.0
    repack_s: float = 0.0
    n_prompt: int = 0
    n_cached: int = 0
    prefill_s: float = 0.0
    n_decoded: int = 0
    n_generated: int = 0
    decode_s: float = 0.0
    n_drafted: int = 0  #: tokens prompt lookup drafted, and how many of them were accepted
    n_accepted: int = 0

    @property
    def prefill_tps(self) -> float:
        return self.n_prompt / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        return self.n_decoded / self.decode_s if self.decode_s else 0.0

    def summary(self) -> str:
        return (
            f"load {self.load_s:.2f} s (repack {self.repack_s:.2f} s) | prefill {self.n_prompt} tokens "
            + (f"(+{self.n_cached} cached) " if self.n_cached else "")
            + f"{self.prefill_tps:.1f} t/s | decode {self.n_decoded} tokens {self.decode_tps:.1f} t/s"
            + (f" (lookup: {self.n_accepted}/{self.n_drafted} drafted accepted)" if self.n_drafted else "")
        )


class Generation:
    """One sequence from prompt ids to finish: ``step(forward)`` runs one prefill chunk or one decode token and
    returns the text that is now final (possibly empty); ``finish_reason`` is set when it is over. A caller that
    runs the forward pass itself (a batch of several sequences) takes ``next_ids()`` and hands the logits to
    ``advance``. The first ``n_cached`` prompt tokens are taken as already in the KV cache (only the rest is
    prefilled). With a ``grammar`` only text it allows is sampled, and the generation stops ("stop") when the
    grammar is complete. With ``lookup`` N a decode step drafts up to N tokens from the context
    (:mod:`kleidipy.runtime.lookup`) and runs them after the last token: ``advance`` then takes every row's logits,
    samples row by row while the sampled token is the drafted one, and ``n_past`` counts only the rows it used
    (the caller rolls its KV cache back to it). Each row sampled as a decode step would sample it, with the same
    draws of the sampler's generator: the text is the one generated without drafts, token for token, when the
    rows' logits are the decode step's (``CausalLM.forward``'s ``as_decoded``)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        n_ctx: int,
        max_tokens: int | None = None,
        params: SamplingParams | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        chunk: int = 512,
        n_cached: int = 0,
        logprobs: int | None = None,
        grammar: Grammar | None = None,
        lookup: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompt = list(prompt_ids)
        self.n_ctx = n_ctx
        self.max_tokens = n_ctx if max_tokens is None else max_tokens
        matcher = grammar.matcher(tokenizer) if grammar is not None else None
        self.sampler = Sampler(params or SamplingParams(temperature=0.0), seed=seed, grammar=matcher)
        self.stop = tuple(s for s in stop if s)
        self.chunk = chunk
        self.detok = StreamDetokenizer(tokenizer)
        self.history = list(self.prompt)
        self.n_past = self.n_cached = n_cached
        self.n_generated = 0
        #: with ``logprobs`` (the number of alternatives): per generated token (id, log-probability, the top
        #: alternatives as [(id, log-probability)])
        self.logprobs = logprobs
        self.token_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = []
        self.finish_reason: FinishReason | None = None
        self.lookup = lookup
        #: the tokens the step drafted after the last one (:meth:`next_ids`); how many were drafted and accepted
        self.draft: list[int] = []
        self.n_drafted = self.n_accepted = 0
        self._text = ""
        self._sent = 0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return self.n_past < len(self.prompt)

    def step(self, forward: Forward, forward_rows: Forward | None = None) -> str:
        """Advance by one prefill chunk (sampling the first token after the last one) or one decode step; a step
        that drafted runs ``forward_rows`` (every row's logits as decoded), which a generation with ``lookup``
        needs."""
        ids = self.next_ids()
        if self.draft and forward_rows is None:
            raise ValueError("a generation with lookup needs forward_rows: the logits of every row as decoded")
        return self.advance(len(ids), forward_rows(ids) if self.draft else forward(ids))

    def next_ids(self) -> list[int]:
        """The tokens the next step runs: the next prefill chunk, or the last token (and a draft after it, which
        :attr:`draft` holds: then the step needs the logits of every row)."""
        if self.prefilling:
            return self.prompt[self.n_past : self.n_past + self.chunk]
        room = min(self.lookup, self.max_tokens - self.n_generated - 1, self.n_ctx - self.n_past - 1)
        self.draft = prompt_lookup.draft(self.history, room) if room > 0 else []
        return self.history[-1:] + self.draft

    def advance(self, n: int, logits: np.ndarray) -> str:
        """The step whose ``n`` tokens (:meth:`next_ids`) a forward pass ran, given the logits of the last one (of
        every row [n, n_vocab] after a draft): samples the next token unless the prompt is still prefilling;
        returns the text that is now final."""
        if self.draft:
            return self._verify(logits)
        self.n_past += n
        if self.prefilling:
            return ""
        token = self.sampler(logits, self.history)
        if self.tokenizer.is_eog(token):
            return self._release("stop")
        self.sampler.accept(token)
        if self.logprobs is not None:
            self._record_logprobs(logits, token)
        self.history.append(token)
        self.n_generated += 1
        self._text += self.detok.push(token)
        if self.sampler.finished:
            return self._release("stop")
        if self.n_generated >= self.max_tokens or self.n_past >= self.n_ctx:
            return self._release("length")
        return self._release(None)

    def _verify(self, rows: np.ndarray) -> str:
        """Sample row by row while the sampled token is the drafted one (every row: the last token's, then each
        drafted token's); the rows past the first miss are dropped (:attr:`n_past` stops before them)."""
        draft, self.draft = self.draft, []
        self.n_drafted += len(draft)
        out = ""
        for i, row in enumerate(rows):
            out += self.advance(1, row)
            if self.done or i == len(draft) or self.history[-1] != draft[i]:
                break
            self.n_accepted += 1
        return out

    def _record_logprobs(self, logits: np.ndarray, token: int) -> None:
        lp = log_softmax(logits)
        top = np.argsort(-lp, kind="stable")[: self.logprobs]
        self.token_logprobs.append((token, float(lp[token]), [(int(t), float(lp[t])) for t in top]))

    def _release(self, finish: FinishReason | None) -> str:
        """The text that can be sent now: up to a stop string (which finishes), else everything when finishing,
        else all but a tail that might begin a stop string."""
        if finish:
            self._text += self.detok.flush()
        hits = [i for i in (self._text.find(s, self._sent) for s in self.stop) if i >= 0]
        if hits:
            end, finish = min(hits), "stop"
        elif finish:
            end = len(self._text)
        else:
            end = len(self._text) - self._held_back()
        out, self._sent = self._text[self._sent : end], end
        self.finish_reason = finish
        return out

    def _held_back(self) -> int:
        """Length of the longest unsent tail that is a proper prefix of a stop string."""
        tail = self._text[self._sent :]
        for k in range(min(len(tail), max((len(s) for s in self.stop), default=1) - 1), 0, -1):
            if any(s.startswith(tail[-k:]) for s in self.stop):
                return k
        return 0


class _RepackProgress(Observer):
    """The load's progress bar: one step per repacked weight."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar

    def on_repack(self, call: RepackCall) -> None:
        self.bar.update()


@contextlib.contextmanager
def _compiling(shown: bool) -> Iterator[None]:
    """A status line while a first run's kernels compile (numba compiles each on its first call): what, and for how
    long so far (on a terminal; elsewhere the load's notice said it)."""
    if not shown or not sys.stderr.isatty():
        yield
        return
    desc = "kleidipy: compiling this model's kernels for this CPU (first run)"
    bar = tqdm(desc=desc, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.5):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        bar.close()


@dataclass
class Engine:
    """A loaded model ready to generate (see the module docstring)."""

    model: str | Path
    target: Target | None = None
    threads: int = 1
    execution: str = "jit"
    n_ctx: int | None = None
    kv_dtype: type = np.float16
    progress: bool = True
    #: one-line notices (requantized types, a stale repack cache): tqdm.write keeps the progress bar intact
    notice: Callable[[str], None] = field(default=lambda msg: tqdm.write(f"kleidipy: {msg}", file=sys.stderr))
    check_tensors: bool = True
    #: read the weights packed at an earlier load for this target (:mod:`kleidipy.runtime.repack_cache`)
    repack_cache: bool = True
    #: multiply every weight exactly as the file holds it, Q8_0 included (:attr:`KleidiBackend.exact_weights`; None:
    #: ``KLEIDIPY_EXACT_WEIGHTS``)
    exact_weights: bool | None = None
    #: watch the load and every generation (:mod:`kleidipy.observer`): shared by the backend and the model
    observers: list[Observer] = field(default_factory=list)
    #: run the forward pass as one compiled plan on persistent threads (:mod:`kleidipy.graph`; jit execution only);
    #: False runs it op by op from Python (the reference execution, same bits)
    graph: bool = True
    #: on a first run (no compiled plan cached for this CPU and these sources), build the plan in a background process
    #: and run op by op meanwhile (:mod:`kleidipy.runtime.plan_build`); False compiles it before the first token
    background_compile: bool = False

    def __post_init__(self) -> None:
        t0 = time.perf_counter()
        check_threads(self.threads)
        self.target = self.target or resolve_target()
        self.path = resolve_model(self.model, progress=self.progress)
        self.gguf = ModelFile(self.path)
        if self.check_tensors:
            tensor_check.check_tensors(self.gguf)
        metadata = self.gguf.metadata(TOKENIZER_KEYS)
        self.tokenizer = Tokenizer(metadata)
        self.chat_template = ChatTemplate.from_metadata(metadata)
        n_weights = sum(len(t.shape) == 2 for t in self.gguf.tensors.values())
        n_weights -= 0 if self.gguf.hparams.tied_embeddings else 1  # token_embd is only read by rows
        t1 = time.perf_counter()
        cache = RepackCache(self.path, self.target, self.execution, self.notice) if self.repack_cache else None
        bar = tqdm(
            total=n_weights, desc="repack", unit="tensor", disable=not self.progress, file=sys.stderr, leave=False
        )
        progress = _RepackProgress(bar)
        self.observers.append(progress)
        if self.exact_weights is None:
            self.exact_weights = exact_weights_default()
        self.backend = KleidiBackend(
            self.target,
            self.execution,
            self.threads,
            notice=self.notice,
            observers=self.observers,
            cache=cache,
            exact_weights=self.exact_weights,
        )
        try:
            self.lm = self.gguf.arch.build(self.gguf, linear=self.backend, n_ctx=self.n_ctx, kv_dtype=self.kv_dtype)
        finally:
            self.observers.remove(progress)
            bar.close()
        self.lm.observers = self.observers
        t2 = time.perf_counter()
        if cache is not None:
            cache.save()
        #: the compiled plan's first build, in a child process, while this one runs op by op (None: no build)
        self.build: plan_build.PlanBuild | None = None
        self._polls = 0  # (calls of poll_compiled)
        if self.graph and self.execution == "jit":
            self._compile()
        self.timings = Timings(load_s=time.perf_counter() - t0, repack_s=t2 - t1)
        #: why the last generation ended (None before the first one)
        self.finish_reason: FinishReason | None = None

    def _compile(self) -> None:
        """The forward pass as a compiled plan: loaded from numba's cache, built in the background on a first run
        (``background_compile``; this process runs op by op until :meth:`poll_compiled` finds it built), or
        compiled here (once: cached) — after any build another process has in progress."""
        if not plan_build.ready(self.kv_dtype) and self.background_compile and plan_build.enabled():
            if not plannable(self.lm):
                return
            self.build = plan_build.PlanBuild(self.path, self.target.spec(), self.kv_dtype, self.exact_weights)
            self.notice(
                "first run on this CPU: the model runs op by op, its kernels compiling now (~20 s); after the first "
                "answer the compiled forward pass builds in the background (once, about a minute; then cached)"
            )
            return
        if plan_build.building():
            self.notice("waiting for another kleidipy process that is building the compiled forward pass")
            plan_build.wait_for_build()
        if not compile_model(self.lm, self.threads):
            return
        slow = threading.Timer(1.0, self.notice, ("compiling the forward pass for this CPU (once: it is cached)",))
        slow.start()
        try:
            self.lm.compiled.warm_up()
        finally:
            slow.cancel()
        plan_build.mark_ready(self.kv_dtype)

    def poll_compiled(self) -> bool:
        """Take the compiled plan once the background build is over (True when it switched now): the same bits,
        faster. Call between generations."""
        if self.build is None:
            return False
        self._polls += 1
        if not self.build.started:
            if self._polls > 1:  # (a server's second round: its first request's kernels compiled)
                self._start_build()
            return False
        if not self.build.finished():
            return False
        self.build = None
        if not plan_build.ready(self.kv_dtype):
            return False
        self._compile()
        self.notice("the compiled forward pass is ready: from now on the model runs as one compiled plan")
        return self.lm.compiled is not None

    def _start_build(self) -> None:
        """Start the background build of the compiled plan if there is one to start; one that cannot start (the
        system cannot run the child) is a notice, and the model keeps running op by op."""
        if self.build is None or self.build.started:
            return
        why = self.build.start()
        if why is not None:
            self.build = None
            self.notice(f"the compiled forward pass cannot build in the background ({why}): the model keeps running "
                        f"op by op; {plan_build.ENV}=0 builds it in this process at the next load")  # fmt: skip

    def set_threads(self, threads: int) -> None:
        """Run the kernels on ``threads`` threads from now on (a compiled plan gets new workers)."""
        self.threads = self.backend.threads = check_threads(threads)
        if self.lm.compiled is not None:
            compile_model(self.lm, threads)

    @property
    def context_length(self) -> int:
        return self.lm.n_ctx

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of ``messages`` rendered with the model's chat template (special tokens parsed)."""
        text = self.chat_template.render(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special=True, parse_special=True)

    def prompt(self, text: str) -> list[int]:
        """Token ids of a plain-text prompt (BOS as the vocabulary says; special-token text is not parsed)."""
        return self.tokenizer.encode(check_prompt_text(text), add_special=True, parse_special=False)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int | None = 128,
        params: SamplingParams | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        reuse_cache: bool = False,
        grammar: Grammar | None = None,
        lookup: int = 0,
    ) -> Iterator[str]:
        """Yield the text pieces of up to ``max_tokens`` sampled tokens (None: until the context is full; stops at
        end-of-generation or a ``stop`` string, which is never yielded). The prompt runs as one batch (GEMM), then
        one token at a time (GEMV). With ``reuse_cache`` the cached positions holding the prompt's first tokens are
        kept and only the rest is prefilled (a growing conversation); otherwise the KV cache starts empty. A
        ``grammar`` constrains the text (and ends it when complete). ``lookup`` N drafts up to N tokens a step from
        the context and verifies them in one pass (prompt-lookup decoding: the same text, sooner when the answer
        repeats the context). When the iterator is exhausted, ``finish_reason`` and ``timings`` (``n_cached``:
        prompt tokens reused; ``n_drafted``, ``n_accepted``) describe it."""
        self.poll_compiled()
        ids = list(prompt_ids)
        if not ids:
            raise PromptError("the prompt is empty")
        if max_tokens is not None and max_tokens < 0:
            raise PromptError(f"max_tokens must be >= 0, got {max_tokens}")
        if len(ids) > self.lm.n_ctx:
            raise PromptError(f"the prompt is {len(ids)} tokens, more than the context of {self.lm.n_ctx}")
        if not reuse_cache:
            self.lm.reset()
        n_cached = self.lm.cache.reuse(ids)
        t = self.timings
        t.n_prompt, t.n_cached, t.n_decoded, t.n_generated = len(ids) - n_cached, n_cached, 0, 0
        t.prefill_s, t.decode_s = 0.0, 0.0
        self.finish_reason = None
        if max_tokens == 0:
            self.finish_reason = "length"
            return

        gen = Generation(
            self.tokenizer,
            ids,
            self.lm.n_ctx,
            max_tokens,
            params,
            seed,
            stop,
            chunk=len(ids),
            n_cached=n_cached,
            grammar=grammar,
            lookup=lookup,
        )
        # a first run's prefill and first decode step compile the op-by-op kernels (the build starts after them)
        cold = 2 if self.build is not None and not self.build.started else 0
        try:
            while not gen.done:
                prefill, t0 = gen.prefilling, time.perf_counter()
                generated = gen.n_generated
                with _compiling(self.progress) if cold else contextlib.nullcontext():
                    piece = gen.step(self.lm.forward, self._forward_rows)  # one forward pass + sampling
                self.lm.cache.n_past = gen.n_past  # (past a draft's rejected rows)
                cold = max(cold - 1, 0)
                if prefill:
                    t.prefill_s += time.perf_counter() - t0
                else:
                    t.decode_s += time.perf_counter() - t0
                    t.n_decoded += gen.n_generated - generated
                if piece:
                    yield piece
        finally:
            self._start_build()  # (after the first answer, not beside it; once)
        self.finish_reason, t.n_generated = gen.finish_reason, gen.n_generated
        t.n_drafted, t.n_accepted = gen.n_drafted, gen.n_accepted

    def _forward_rows(self, ids: list[int]) -> np.ndarray:
        """Every row's logits of a drafting step, each as the decode step computes it (by the GEMM where its rows
        are exact, else by every matmul's GEMV)."""
        return self.lm.forward(ids, all_logits=True, as_decoded=not self.backend.exact_rows)
