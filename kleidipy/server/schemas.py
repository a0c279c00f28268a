"""The OpenAI wire format: request validation (:func:`parse_chat`, :func:`parse_completion`: every bad value an
:class:`APIError` naming its ``param``) and the response, chunk and error objects.

Supported fields and defaults: docs/server.md."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kleidipy.errors import KleidipyError
from kleidipy.runtime.grammar import Grammar, GrammarError, response_format_grammar
from kleidipy.runtime.lookup import MAX_DRAFT
from kleidipy.runtime.sampler import SamplingOptionError, SamplingParams, sampling_options

Kind = Literal["chat", "completion"]
FinishReason = Literal["stop", "length"]

MAX_STOP = 4  # OpenAI's limit on the number of stop sequences
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_UNSET = object()


class APIError(KleidipyError):
    """A request the server answers with an HTTP error and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = None) -> APIError:
    """A 400 invalid_request_error about ``param``."""
    return APIError(400, message, param=param, code=code)


#: most choices (``n``) one request may ask for
MAX_CHOICES = 8


@dataclass(frozen=True)
class GenerationRequest:
    """A validated chat or completion request. ``prompt`` is the text or token ids (completions only),
    ``messages`` the chat turns with roles normalised and content flattened to text (chat only).
    ``max_tokens`` None means "until the end of the context"."""

    kind: Kind
    model: str
    params: SamplingParams
    max_tokens: int | None
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    #: start from the longest prefix of the prompt a slot's KV cache holds (llama-server's field, default on)
    cache_prompt: bool = True
    #: log-probabilities of the generated tokens with this many alternatives each (None: none)
    logprobs: int | None = None
    #: choices to generate (each its own sequence; seed + i when a seed is given)
    n: int = 1
    messages: tuple[dict[str, str], ...] = ()
    prompt: str | tuple[int, ...] = ""
    #: the constraint of ``response_format`` (None: plain text)
    grammar: Grammar | None = None
    #: prompt-lookup drafts of up to this many tokens a step (kleidipy's field, as llama-server's
    #: ``speculative.n_max``; None: the server's ``--lookup``)
    lookup: int | None = None


# ---------------------------------------------------------------------------------------------------------------
# field readers


def _get(body: Mapping[str, Any], name: str, default: Any = None) -> Any:
    value = body.get(name, _UNSET)
    return default if value is _UNSET or value is None else value


def _unicode(text: str, param: str) -> str:
    """``text`` unless it holds a lone surrogate (legal in JSON as an escape, but not text a tokenizer can take)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(param, f"'{param}' is not valid Unicode (lone surrogate at character {exc.start})") from None
    return text


def _is_ids(x: Any) -> bool:
    """Whether ``x`` is a non-empty list of JSON integers (token ids; booleans are not)."""
    return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def check_token_ids(ids: Sequence[int], n_vocab: int, param: str) -> None:
    """A 400 naming ``param`` unless every id is in the vocabulary."""
    if not all(0 <= t < n_vocab for t in ids):
        raise invalid(param, f"token ids must be in [0, {n_vocab})", "invalid_value")


def _integer(body: Mapping[str, Any], name: str, default: int | None, lo: int | None = None) -> int | None:
    value = _get(body, name, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"'{name}' must be an integer, got {value!r}", "invalid_type")
    if lo is not None and value < lo:
        raise invalid(name, f"'{name}' must be >= {lo}, got {value}", "invalid_value")
    return value


def _number(body: Mapping[str, Any], name: str, default: float) -> float:
    value = _get(body, name, default)
    if isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if abs(value) < 2**64 else math.inf
    if not isinstance(value, float) or not math.isfinite(value):
        raise invalid(name, f"'{name}' must be a finite number, got {value!r}", "invalid_type")
    return value


def _boolean(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = _get(body, name, default)
    if not isinstance(value, bool):
        raise invalid(name, f"'{name}' must be a boolean, got {value!r}", "invalid_type")
    return value


def _model(body: Mapping[str, Any], required: bool = True) -> str:
    """The ``model`` named ("" when not ``required`` and left out or null: one model is served, and llama-server
    answers a chat or completion request that names none)."""
    model = body.get("model")
    if model is None and not required:
        return ""
    if not isinstance(model, str) or not model:
        raise invalid("model", "you must provide a model parameter (a non-empty string)", "missing_required_parameter")
    return model


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = _get(body, "stop", [])
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", "'stop' must be a string or a list of strings", "invalid_type")
    if len(stops) > MAX_STOP:
        raise invalid("stop", f"'stop' takes at most {MAX_STOP} sequences, got {len(stops)}", "invalid_value")
    return tuple(_unicode(s, "stop") for s in stops if s)


def _unsupported(body: Mapping[str, Any], kind: Kind) -> None:
    """Reject options that would change the answer but that this server cannot honour."""
    checks = {
        "logit_bias": lambda v: not v,
        "tools": lambda v: not v,
        "functions": lambda v: not v,
    }
    if kind == "completion":
        checks.update(echo=lambda v: v is False, suffix=lambda v: not v)
        checks["best_of"] = lambda v: v == 1
    for name, ok in checks.items():
        value = body.get(name)
        if value is not None and not ok(value):
            raise invalid(name, f"'{name}'={value!r} is not supported by this server", "unsupported_parameter")


def _sampling(body: Mapping[str, Any]) -> SamplingParams:
    """The sampling fields, held to the ranges the CLI's options have too (:func:`sampling_options`)."""
    try:
        return sampling_options(
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            top_k=_integer(body, "top_k", 40),
            min_p=_number(body, "min_p", 0.05),
            repeat_penalty=_number(body, "repeat_penalty", 1.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0),
            presence_penalty=_number(body, "presence_penalty", 0.0),
        )
    except SamplingOptionError as exc:
        raise invalid(exc.param, str(exc), "invalid_value") from None


def _common(body: Any, kind: Kind) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object", "invalid_type")
    _unsupported(body, kind)
    stream = _boolean(body, "stream")
    options = _get(body, "stream_options", {})
    if not isinstance(options, dict):
        raise invalid("stream_options", "'stream_options' must be an object", "invalid_type")
    include_usage = _boolean(options, "include_usage")
    key = "max_tokens"
    if kind == "chat" and _get(body, "max_completion_tokens") is not None:
        key = "max_completion_tokens"
    max_tokens = _integer(body, key, COMPLETION_DEFAULT_MAX_TOKENS if kind == "completion" else None, lo=1)
    seed = _integer(body, "seed", None)
    return dict(
        kind=kind,
        model=_model(body, required=False),
        params=_sampling(body),
        max_tokens=max_tokens,
        seed=seed,
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage,
        cache_prompt=_boolean(body, "cache_prompt", default=True),
        logprobs=_logprobs(body, kind),
        n=_choices(body),
        grammar=_grammar(body),
        lookup=_lookup(body),
    )


def _lookup(body: Mapping[str, Any]) -> int | None:
    n = _integer(body, "lookup", None, lo=0)
    if n is not None and n > MAX_DRAFT:
        raise invalid("lookup", f"'lookup' must be at most {MAX_DRAFT}, got {n}", "invalid_value")
    return n


def _grammar(body: Mapping[str, Any]) -> Grammar | None:
    value = body.get("response_format")
    try:
        return None if value is None else response_format_grammar(value)
    except GrammarError as exc:
        raise invalid("response_format", str(exc), "invalid_value") from None


def _choices(body: Mapping[str, Any]) -> int:
    n = _integer(body, "n", 1, lo=1)
    if n > MAX_CHOICES:
        raise invalid("n", f"'n' must be at most {MAX_CHOICES}, got {n}", "invalid_value")
    return n


def _logprobs(body: Mapping[str, Any], kind: Kind) -> int | None:
    """Chat: ``logprobs`` (bool) with ``top_logprobs`` 0..20 alternatives; completions: ``logprobs`` 0..5."""
    if kind == "completion":
        n = _integer(body, "logprobs", None, lo=0)
        if n is not None and n > 5:
            raise invalid("logprobs", f"'logprobs' must be at most 5, got {n}", "invalid_value")
        return n
    top = _integer(body, "top_logprobs", None, lo=0)
    if top is not None and top > 20:
        raise invalid("top_logprobs", f"'top_logprobs' must be at most 20, got {top}", "invalid_value")
    if not _boolean(body, "logprobs"):
        if top:
            raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true", "invalid_value")
        return None
    return top or 0


def _content(message: Mapping[str, Any], i: int) -> str:
    """A message's text: a string, or the concatenated text of its ``{"type": "text"}`` parts (only an assistant
    message may have none: null content, as OpenAI allows there)."""
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        return _unicode(content, f"messages[{i}].content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"messages[{i}].content", "only text content parts are supported", "unsupported_value")
            texts.append(part["text"])
        return _unicode("".join(texts), f"messages[{i}].content")
    raise invalid(f"messages[{i}].content", "content must be a string or a list of text parts", "invalid_type")


def parse_chat(body: Any) -> GenerationRequest:
    """Validate a ``/v1/chat/completions`` body."""
    fields = _common(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "'messages' must be a non-empty list", "missing_required_parameter")
    turns = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in CHAT_ROLES:
            raise invalid(
                f"messages[{i}].role",
                f"messages[{i}] must be an object with a role in {sorted(CHAT_ROLES)}, got {role!r}",
                "invalid_value",
            )
        turns.append({"role": CHAT_ROLES[role], "content": _content(message, i)})
    return GenerationRequest(messages=tuple(turns), **fields)


def parse_completion(body: Any) -> GenerationRequest:
    """Validate a ``/v1/completions`` body (``prompt``: a string, a list of one string, or token ids)."""
    fields = _common(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if _is_ids(prompt):
        return GenerationRequest(prompt=tuple(prompt), **fields)
    if not isinstance(prompt, str):
        raise invalid("prompt", "'prompt' must be a string or a list of token ids (batches are not supported)")
    return GenerationRequest(prompt=_unicode(prompt, "prompt"), **fields)


@dataclass(frozen=True)
class TokenizeRequest:
    """A validated ``/tokenize`` body (llama-server's fields)."""

    content: str
    add_special: bool
    parse_special: bool
    with_pieces: bool


def parse_tokenize(body: Any) -> TokenizeRequest:
    """``{"content": str, "add_special": false, "parse_special": true, "with_pieces": false}``."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object")
    content = body.get("content")
    if not isinstance(content, str):
        raise invalid("content", "'content' must be a string", "invalid_type")
    return TokenizeRequest(
        _unicode(content, "content"),
        _boolean(body, "add_special"),
        _boolean(body, "parse_special", default=True),
        _boolean(body, "with_pieces"),
    )


def parse_embeddings(body: Any) -> tuple[list[str | list[int]], str]:
    """``/v1/embeddings``: (inputs, encoding): ``input`` a string, a list of strings, token ids, or a list of
    token-id lists (any ``model``); ``encoding_format`` "float" (JSON numbers) or "base64" (little-endian float32,
    what the openai client asks for)."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object")
    _model(body)
    encoding = _get(body, "encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise invalid("encoding_format", "encoding_format must be 'float' or 'base64'", "invalid_value")
    data = body.get("input")
    items = [data] if isinstance(data, str) or _is_ids(data) else data
    if not isinstance(items, list) or not items or not all(isinstance(x, str) and x or _is_ids(x) for x in items):
        message = "'input' must be a non-empty string, token ids, or a list of them"
        raise invalid("input", message, "invalid_type")
    return [_unicode(x, "input") if isinstance(x, str) else x for x in items], encoding


def parse_detokenize(body: Any, n_vocab: int) -> list[int]:
    """``{"tokens": [int, ...]}``: ids of the vocabulary."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object")
    tokens = body.get("tokens")
    if tokens != [] and not _is_ids(tokens):
        raise invalid("tokens", "'tokens' must be a list of token ids", "invalid_type")
    check_token_ids(tokens, n_vocab, "tokens")
    return tokens


# ---------------------------------------------------------------------------------------------------------------
# responses

#: a generated token, its log-probability and the top alternatives [(token, log-probability)]
TokenLogprob = tuple[int, float, list[tuple[int, float]]]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens`` of the prompt came from the KV cache (not prefilled again)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def logprobs_object(kind: Kind, entries: Sequence[TokenLogprob], piece: Callable[[int], bytes]) -> dict[str, Any]:
    """OpenAI's logprobs of generated tokens: chat's ``{"content": [...]}`` or completions' token lists;
    ``piece`` gives a token's bytes."""

    def text(token: int) -> str:
        return piece(token).decode("utf-8", errors="replace")

    if kind == "chat":

        def one(token: int, lp: float) -> dict[str, Any]:
            return {"token": text(token), "logprob": lp, "bytes": list(piece(token))}

        return {"content": [{**one(t, lp), "top_logprobs": [one(a, alp) for a, alp in top]} for t, lp, top in entries]}
    offsets = [0]
    for t, _, _ in entries[:-1]:
        offsets.append(offsets[-1] + len(text(t)))
    return {
        "tokens": [text(t) for t, _, _ in entries],
        "token_logprobs": [lp for _, lp, _ in entries],
        "top_logprobs": [{text(a): alp for a, alp in top} for _, _, top in entries],
        "text_offset": offsets if entries else [],
    }


def _choice(
    kind: Kind,
    text: str,
    finish: FinishReason | None,
    delta: bool,
    first: bool,
    logprobs: dict | None = None,
    index: int = 0,
) -> dict[str, Any]:
    if kind == "completion":
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    if not delta:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
    body = {"role": "assistant", "content": text} if first else ({"content": text} if text or not finish else {})
    return {"index": index, "delta": body, "logprobs": logprobs, "finish_reason": finish}


def completion_object(
    kind: Kind,
    ident: str,
    created: int,
    model: str,
    answers: Sequence[tuple[str, FinishReason, dict | None]],
    use: dict[str, int],
) -> dict[str, Any]:
    """The whole answer of a non-streamed request: one choice per (text, finish reason, logprobs)."""
    obj = "chat.completion" if kind == "chat" else "text_completion"
    choices = [
        _choice(kind, text, finish, delta=False, first=False, logprobs=lps, index=i)
        for i, (text, finish, lps) in enumerate(answers)
    ]
    return {"id": ident, "object": obj, "created": created, "model": model, "choices": choices, "usage": use}


def chunk_object(
    kind: Kind,
    ident: str,
    created: int,
    model: str,
    text: str = "",
    finish: FinishReason | None = None,
    first: bool = False,
    use: dict[str, int] | None = None,
    include_usage: bool = False,
    logprobs: dict | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """One server-sent event of a streamed request (for choice ``index``); with ``use`` it is the final usage
    chunk (no choices)."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    choice = _choice(kind, text, finish, delta=True, first=first, logprobs=logprobs, index=index)
    choices = [] if use is not None else [choice]
    chunk = {"id": ident, "object": obj, "created": created, "model": model, "choices": choices}
    if include_usage:
        chunk["usage"] = use
    return chunk
