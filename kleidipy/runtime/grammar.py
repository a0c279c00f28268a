"""Grammar-constrained sampling: OpenAI's ``response_format`` (``json_object``, ``json_schema``) and llama.cpp's
GBNF grammars, as the first step of the sampler chain (llama.cpp's grammar sampler).

:class:`Grammar` is a compiled, validated constraint; :func:`response_format_grammar` makes one from an OpenAI
``response_format`` object. :meth:`Grammar.matcher` starts one sequence's :class:`GrammarMatcher`: ``mask``
gives the logits with every token the grammar does not allow next set to -inf (before penalties, top-k, ...:
llama.cpp's ``grammar_first`` order), ``accept`` advances it by the sampled token, and ``done`` says that the
grammar is complete (the generation stops with finish reason "stop"). End-of-generation tokens are allowed exactly
where the grammar may end.

The matching is llguidance's; this module only adapts kleidipy's vocabulary to it: each token's bytes as
``token_to_piece`` gives them, control tokens (and user-defined tokens written like ``<...>``) marked special the
way llguidance's llama.cpp adapter marks them, the model's end-of-generation ids as its EOS tokens, and kleidipy's
exact tokenizer for its re-tokenization.

Why llguidance rather than xgrammar, measured on SmolLM2's 49152-token vocabulary (2-core x86, one thread):
the library's tokenizer from kleidipy's token bytes 0.19 s (xgrammar 0.03 s; once per model), schema compile +
matcher 3 ms (xgrammar 8 ms) for a 3-property object schema, a token mask 0.02 ms mean and 0.19 ms worst
(xgrammar 0.01 / 0.32 ms); this module's whole step (mask, -inf, accept) is 0.07 ms a token, far below a decode
step. They are as fast as each other, but xgrammar requires torch, transformers and triton (gigabytes of wheels)
where llguidance has no dependency, and llguidance is the library llama.cpp can build in (``LLAMA_LLGUIDANCE``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from kleidipy.errors import KleidipyError
from kleidipy.runtime.tokenizer import TokenAttr, Tokenizer

#: the ``response_format`` types: plain text (no constraint), any JSON object, a JSON schema
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


class GrammarError(KleidipyError, ValueError):
    """A response format, JSON schema or grammar that cannot be used: malformed, unsatisfiable, or using a feature
    the matcher does not support."""


def _one_line(message: str) -> str:
    return " ".join(message.split())


@dataclass(frozen=True)
class Grammar:
    """A validated constraint in llguidance's grammar format (see the module docstring)."""

    source: str

    @classmethod
    def _checked(cls, source: str, what: str) -> Grammar:
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source)
        if failed:
            raise GrammarError(f"invalid {what}: {_one_line(messages[0])}")
        return cls(source)

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool) -> Grammar:
        """JSON text matching ``schema`` (a JSON Schema object, or true/false)."""
        if not isinstance(schema, Mapping | bool):
            raise GrammarError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
        try:
            source = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"invalid JSON schema: {_one_line(str(exc))}") from None
        return cls._checked(source, "JSON schema")

    @classmethod
    def gbnf(cls, text: str) -> Grammar:
        """Text matching a llama.cpp GBNF grammar (or a Lark grammar)."""
        try:
            source = llguidance.grammar_from("gbnf", text)
        except ValueError as exc:
            raise GrammarError(f"invalid grammar: {_one_line(str(exc))}") from None
        return cls._checked(source, "grammar")

    def matcher(self, tokenizer: Tokenizer) -> GrammarMatcher:
        """A fresh matcher for one sequence generated with ``tokenizer``'s vocabulary."""
        return GrammarMatcher(self, tokenizer)


def response_format_grammar(response_format: Any) -> Grammar | None:
    """The constraint of an OpenAI ``response_format`` object: ``{"type": "text"}`` none,
    ``{"type": "json_object"}`` any JSON object, ``{"type": "json_schema", "json_schema": {"name": ...,
    "schema": {...}, "strict": ...}}`` JSON matching ``schema`` (any JSON value without one, as llama-server;
    the schema is always enforced, ``strict`` or not)."""
    if not isinstance(response_format, Mapping):
        raise GrammarError("response_format must be an object")
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMATS:
        raise GrammarError(f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_schema({"type": "object"})
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise GrammarError("response_format.json_schema must be an object holding the schema")
    return Grammar.json_schema(spec.get("schema", {}))


class _Vocabulary:
    """kleidipy's vocabulary in the shape llguidance's ``TokenizerWrapper`` reads."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for token in range(tokenizer.n_vocab):
            piece, attr = tokenizer.token_to_piece(token), tokenizer.token_attr(token)
            if attr & TokenAttr.CONTROL or (
                attr & TokenAttr.USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")
            ):
                piece = b"\xff" + piece  # llguidance's mark of a special token
                self.special_token_ids.append(token)
            self.tokens.append(piece)

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance probes with bytes, then falls back to str
            raise TypeError("text only")
        return self.tokenizer.encode(text, add_special=False)


@lru_cache(maxsize=4)
def _lltokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of ``tokenizer`` (~0.2 s for a 50k vocabulary: built once per tokenizer)."""
    wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer))
    return llguidance.LLTokenizer(wrapper, n_vocab=tokenizer.n_vocab, eos_token=sorted(tokenizer.eog_ids))


class GrammarMatcher:
    """One sequence's grammar state: the grammar step of the sampler chain (see the module docstring)."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer) -> None:
        self._matcher = llguidance.LLMatcher(_lltokenizer(tokenizer), grammar.source, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"invalid grammar: {_one_line(self._matcher.get_error())}")
        self._n_vocab = tokenizer.n_vocab
        self._bitmask = allocate_token_bitmask(1, self._n_vocab)

    def allowed(self) -> np.ndarray:
        """A boolean per token id of the vocabulary: may it come next?"""
        fill_next_token_bitmask(self._matcher, self._bitmask)
        if self._matcher.is_error():  # a parser limit reached on the way
            raise GrammarError(f"grammar matching failed: {_one_line(self._matcher.get_error())}")
        bits = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")
        return bits[: self._n_vocab].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """float32 ``logits`` with the tokens the grammar does not allow next at -inf (a copy)."""
        out = np.array(logits, dtype=np.float32)
        allowed = self.allowed()[: out.size]
        out[: allowed.size][~allowed] = -np.inf
        out[allowed.size :] = -np.inf  # ids past the vocabulary (padded output rows)
        return out

    def accept(self, token: int) -> None:
        """Advance by the sampled ``token`` (GrammarError if the grammar does not allow it)."""
        if not self._matcher.consume_token(token):
            raise GrammarError(f"token {token} does not match the grammar: {_one_line(self._matcher.get_error())}")

    @property
    def done(self) -> bool:
        """Whether the grammar is complete: nothing may follow."""
        return self._matcher.is_stopped()
