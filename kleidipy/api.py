"""The Python API, in the style of llama-cpp-python and mlx-lm: ``llm = kleidipy.load(name)``, then
``llm.chat(messages)`` or ``llm.complete(prompt)``, streamed (an iterator of :class:`Chunk`) or not (a
:class:`Completion`).

The KV cache kept across calls, the defaults and ``response_format``: docs/python-api.md."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

from kleidipy.runtime.generate import Engine, FinishReason
from kleidipy.runtime.grammar import Grammar, response_format_grammar
from kleidipy.runtime.pull import default_model
from kleidipy.runtime.sampler import SamplingParams
from kleidipy.target import Target, parse_target, resolve_target


@dataclass(frozen=True)
class Usage:
    """Token counts of one call: ``cached_tokens`` of the ``prompt_tokens`` were already in the KV cache (only
    the rest was prefilled)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class Chunk:
    """A piece of streamed text; the last chunk has ``finish_reason`` and ``usage`` (and possibly no text)."""

    text: str
    finish_reason: FinishReason | None = None
    usage: Usage | None = None


@dataclass(frozen=True)
class Completion:
    """A whole reply."""

    text: str
    finish_reason: FinishReason
    usage: Usage


class Options(TypedDict, total=False):
    """The keyword options of :meth:`LLM.chat` and :meth:`LLM.complete` (defaults in brackets)."""

    max_tokens: int | None  #: tokens to generate at most [256]; None: until the model ends or the context is full
    temperature: float  #: [0.8]; 0 is greedy
    top_k: int  #: [40]; 0 is off
    top_p: float  #: [0.95]
    min_p: float  #: [0.05]
    repeat_penalty: float  #: [1.0 = off]
    seed: int | None  #: [None: a random seed]
    stop: Sequence[str]  #: strings that end the reply (not included) [()]
    response_format: Mapping[str, Any] | None  #: OpenAI's response_format: JSON object / schema [None: text]


class LLM:
    """A loaded model (made by :func:`load`); :attr:`engine` is the runtime underneath."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def chat(
        self, messages: Sequence[Mapping[str, str]], *, stream: bool = False, **options: Unpack[Options]
    ) -> Completion | Iterator[Chunk]:
        """Reply to ``messages`` (``[{"role": "user", "content": "..."}]``) rendered with the model's chat template;
        ``options`` as :class:`Options`."""
        return self._run(self.engine.chat_prompt(messages), stream, **options)

    def complete(
        self, prompt: str, *, stream: bool = False, **options: Unpack[Options]
    ) -> Completion | Iterator[Chunk]:
        """Continue ``prompt`` as plain text (no chat template); ``options`` as :class:`Options`."""
        return self._run(self.engine.prompt(prompt), stream, **options)

    def reset(self) -> None:
        """Forget the KV cache (the next call prefills its whole prompt)."""
        self.engine.lm.reset()

    def _run(
        self,
        ids: list[int],
        stream: bool,
        max_tokens: int | None = 256,
        seed: int | None = None,
        stop: Sequence[str] = (),
        response_format: Mapping[str, Any] | None = None,
        **sampling: float,
    ) -> Completion | Iterator[Chunk]:
        params = SamplingParams(**sampling)  # llama.cpp's defaults for what is not given
        grammar = None if response_format is None else response_format_grammar(response_format)
        chunks = self._chunks(ids, max_tokens, params, seed, stop, grammar)
        if stream:
            return chunks
        *pieces, last = chunks
        return Completion("".join(c.text for c in pieces), last.finish_reason, last.usage)

    def _chunks(
        self,
        ids: list[int],
        max_tokens: int | None,
        params: SamplingParams,
        seed: int | None,
        stop: Sequence[str],
        grammar: Grammar | None,
    ) -> Iterator[Chunk]:
        engine = self.engine
        for piece in engine.generate(ids, max_tokens, params, seed, stop, reuse_cache=True, grammar=grammar):
            yield Chunk(piece)
        t = engine.timings
        yield Chunk("", engine.finish_reason, Usage(len(ids), t.n_generated, t.n_cached))


def load(
    model: str | Path | None = None,
    *,
    target: str | Target | None = None,
    threads: int = 1,
    n_ctx: int | None = None,
    execution: str = "jit",
    progress: bool = False,
) -> LLM:
    """Load a GGUF file or a catalogue model (pulled on first use; None: ``$KLEIDIPY_MODEL``, else the default
    model), repacking its weights for ``target``'s kernels (a spec such as ``"sme2:svl=512"`` or ``"i8mm"``;
    default: ``$KLEIDIPY_TARGET``, else the host)."""
    resolved = parse_target(target) if isinstance(target, str) else target or resolve_target()
    engine = Engine(
        model or default_model(),
        target=resolved,
        threads=threads,
        execution=execution,
        n_ctx=n_ctx,
        progress=progress,
        background_compile=True,
    )
    return LLM(engine)
