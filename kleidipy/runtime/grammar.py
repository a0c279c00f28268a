"""Grammar-constrained sampling: OpenAI's ``response_format`` (``json_object``, ``json_schema``) and llama.cpp's GBNF
grammars, as the first step of the sampler chain. Owns :class:`Grammar` (compiled and validated when made),
:func:`response_format_grammar` and the per-sequence :class:`GrammarMatcher`; the matching is llguidance's, this
module adapts kleidipy's vocabulary to it.

Details (matcher, validation, why llguidance, measurements): docs/grammar.md."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from kleidipy.errors import KleidipyError
from kleidipy.runtime.tokenizer import TokenAttr, Tokenizer

#: the ``response_format`` types: plain text (no constraint), any JSON object, a JSON schema
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
#: the longest chain of ``$ref`` a JSON schema may go down: llguidance's compiler recurses along it, and about 950
#: overflow its stack (the process dies)
MAX_REF_DEPTH = 100
#: subschemas the finite-value analysis of a JSON schema looks at before it gives up (and lets the schema through)
_MAX_VISITS = 1 << 16


class GrammarError(KleidipyError, ValueError):
    """A response format, JSON schema or grammar that cannot be used: malformed, unsatisfiable, or using a feature
    the matcher does not support."""


def _one_line(message: str) -> str:
    return " ".join(message.split())[:300]


def _matcher_error(matcher: llguidance.LLMatcher) -> str:
    """A failed matcher's reason in one line: llguidance's message about the grammar (an unsatisfiable schema, ...),
    never its parser state (all a matcher that finds nothing allowed gives)."""
    message = matcher.get_error()
    return "no text matches it" if "<state>" in message else _one_line(message)


@dataclass(frozen=True)
class Grammar:
    """A validated constraint in llguidance's grammar format (see docs/grammar.md)."""

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
        if _ref_depth(schema) > MAX_REF_DEPTH:
            raise GrammarError(f"invalid JSON schema: its $ref chains go more than {MAX_REF_DEPTH} deep")
        try:
            source = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"invalid JSON schema: {_one_line(str(exc))}") from None
        except RecursionError:
            raise GrammarError("invalid JSON schema: nested too deeply") from None
        grammar = cls._checked(source, "JSON schema")
        # a JSON schema's grammar is text only (no special token a vocabulary may lack): its first step on the 256
        # bytes is every vocabulary's
        matcher = llguidance.LLMatcher(_byte_tokenizer(), source, log_level=0)
        if not matcher.is_error():
            matcher.compute_bitmask()  # fails where nothing may come first
        if matcher.is_error():
            raise GrammarError(f"invalid JSON schema: {_matcher_error(matcher)}")
        if _endless(schema):
            raise GrammarError("invalid JSON schema: its $ref cycles leave no finite JSON value matching it")
        return grammar

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


def _ref_depth(schema: Any) -> int:
    """The longest chain of ``$ref`` a walk of ``schema`` from its root goes down (``$defs`` / ``definitions`` are
    reached through references only, as llguidance's compiler reaches them)."""
    deepest, seen, stack = 0, set(), [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        deepest = max(deepest, depth)
        if isinstance(node, Mapping):
            stack += [(value, depth) for key, value in node.items() if key not in ("$defs", "definitions")]
            target = _resolve(schema, node["$ref"]) if isinstance(node.get("$ref"), str) else None
            if target is not None:
                stack.append((target, depth + 1))
        elif isinstance(node, list):
            stack += [(value, depth) for value in node]
    return deepest


class _Undecided(Exception):
    """The finite-value analysis of :func:`_endless` looked at more subschemas than it may."""


def _endless(schema: Mapping[str, Any] | bool) -> bool:
    """Whether only an infinite JSON value could match ``schema``: every way through it goes round a ``$ref``
    cycle (an object that requires a property of its own schema, an array of at least one of itself, ...), which
    llguidance would follow for ever. A least fixed point over the document's local references (``#`` and JSON
    pointers); what it does not model (other documents, patterns, ``not``) counts as finite, and so does a schema
    that takes more than ``_MAX_VISITS`` steps to decide."""
    targets: dict[str, Any] = {}
    finite_refs: set[str] = set()
    visits = 0

    def collect(node: Any) -> None:
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref not in targets:
                target = _resolve(schema, ref)
                if target is not None:
                    targets[ref] = target
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    def finite(node: Any) -> bool:
        nonlocal visits
        visits += 1
        if visits > _MAX_VISITS:
            raise _Undecided
        if isinstance(node, bool) or not isinstance(node, Mapping):
            return node is not False
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in targets and ref not in finite_refs:
            return False
        for key, need in (("allOf", all), ("anyOf", any), ("oneOf", any)):
            subs = node.get(key)
            if isinstance(subs, list) and subs and not need(finite(sub) for sub in subs):
                return False
        types = node.get("type")
        if "const" in node or "enum" in node or not isinstance(types, str | list):
            return True
        return any(_finite_type(node, kind, finite) for kind in ([types] if isinstance(types, str) else types))

    try:
        collect(schema)
        grew = True
        while grew:
            grew = False
            for ref, target in targets.items():
                if ref not in finite_refs and finite(target):
                    finite_refs.add(ref)
                    grew = True
        return not finite(schema)
    except (_Undecided, RecursionError):
        return False


def _finite_type(node: Mapping[str, Any], kind: Any, finite: Callable[[Any], bool]) -> bool:
    """Whether a finite value of type ``kind`` may match ``node`` (``finite`` judges a subschema)."""
    if kind == "object":
        required, properties = node.get("required"), node.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        extra = node.get("additionalProperties", True)
        names = [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
        return all(finite(properties.get(name, extra)) for name in names)
    if kind == "array":
        least, items, prefix = node.get("minItems", 0), node.get("items", True), node.get("prefixItems")
        if not isinstance(least, int) or least <= 0:
            return True
        if isinstance(items, list):  # draft 4-7 tuples: additionalItems after them
            prefix, items = items, node.get("additionalItems", True)
        prefix = prefix if isinstance(prefix, list) else []
        return all(map(finite, prefix[:least])) and (least <= len(prefix) or finite(items))
    return True


def _resolve(document: Any, ref: str) -> Any:
    """The node a local ``$ref`` (``#`` or ``#/a/b`` with ``~0``, ``~1`` and %-escapes) points to, else None."""
    if not ref.startswith("#") or (len(ref) > 1 and ref[1] != "/"):
        return None
    node = document
    for part in ref[2:].split("/") if len(ref) > 1 else ():
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


class _Bytes:
    """A vocabulary of the 256 bytes and an end token, in the shape llguidance's ``TokenizerWrapper`` reads: the
    vocabulary a grammar's first step is tried on when it is made."""

    def __init__(self) -> None:
        self.tokens = [bytes([byte]) for byte in range(256)] + [b"\xff<end>"]
        self.eos_token_id = 256
        self.bos_token_id = None
        self.special_token_ids = [256]

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance probes with bytes, then falls back to str
            raise TypeError("text only")
        return list(text.encode())


@lru_cache(maxsize=1)
def _byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), n_vocab=257, eos_token=[256])


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
    """One sequence's grammar state: the grammar step of the sampler chain (see docs/grammar.md)."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer) -> None:
        self._matcher = llguidance.LLMatcher(_lltokenizer(tokenizer), grammar.source, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"invalid grammar: {_matcher_error(self._matcher)}")
        self._n_vocab = tokenizer.n_vocab
        self._bitmask = allocate_token_bitmask(1, self._n_vocab)

    def allowed(self) -> np.ndarray:
        """A boolean per token id of the vocabulary: may it come next?"""
        fill_next_token_bitmask(self._matcher, self._bitmask)
        if self._matcher.is_error():  # a parser limit reached on the way
            raise GrammarError("grammar matching failed: the grammar allows no token here")
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
            raise GrammarError(f"token {token} does not match the grammar")

    @property
    def done(self) -> bool:
        """Whether the grammar is complete: nothing may follow."""
        return self._matcher.is_stopped()
