"""The grammar step of the sampler chain on a tiny byte-level vocabulary (token id b = byte b): masks, acceptance,
completion, seeded reproducibility and the errors of bad schemas and response formats."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_models import bpe_vocab

from kleidipy.errors import KleidipyError
from kleidipy.runtime.generate import Generation
from kleidipy.runtime.grammar import Grammar, GrammarError, response_format_grammar
from kleidipy.runtime.sampler import GREEDY, Sampler, SamplingParams
from kleidipy.runtime.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}
RANDOM = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(bpe_vocab())


def random_forward(n_vocab: int, seed: int):  # noqa: ANN201
    rng = np.random.default_rng(seed)
    return lambda ids: rng.normal(size=n_vocab).astype(np.float32)


def run(tokenizer: Tokenizer, grammar: Grammar, params: SamplingParams, seed: int, max_tokens: int = 200):
    gen = Generation(tokenizer, [ord("x")], 1024, max_tokens, params, seed, grammar=grammar)
    forward = random_forward(tokenizer.n_vocab, seed)
    text = ""
    while not gen.done:
        text += gen.step(forward)
    return text, gen


def test_mask_allows_only_what_the_grammar_allows(tokenizer: Tokenizer) -> None:
    matcher = Grammar.json_schema(SCHEMA).matcher(tokenizer)
    logits = np.zeros(tokenizer.n_vocab, dtype=np.float32)
    masked = matcher.mask(logits)
    allowed = np.flatnonzero(np.isfinite(masked))
    assert ord("{") in allowed and ord("x") not in allowed and tokenizer.eos_id not in allowed
    assert not logits.any()  # masked a copy
    with pytest.raises(GrammarError, match="does not match"):
        matcher.accept(ord("x"))


def test_grammar_completes_and_stops(tokenizer: Tokenizer) -> None:
    for seed in range(3):
        text, gen = run(tokenizer, Grammar.json_schema(SCHEMA), RANDOM, seed)
        value = json.loads(text)
        assert gen.finish_reason == "stop"
        assert set(value) == {"n", "ok"} and type(value["n"]) is int and type(value["ok"]) is bool


def test_greedy_follows_the_grammar_against_the_logits(tokenizer: Tokenizer) -> None:
    """Logits that always prefer 'x' (not allowed anywhere) and then '}' still give a JSON object."""
    matcher = Grammar.json_schema({"type": "object"}).matcher(tokenizer)
    sampler = Sampler(GREEDY, grammar=matcher)
    logits = np.zeros(tokenizer.n_vocab, dtype=np.float32)
    logits[ord("x")], logits[ord("}")] = 9.0, 5.0
    out = []
    while not sampler.finished and len(out) < 10:
        token = sampler(logits)
        sampler.accept(token)
        out.append(token)
    assert bytes(out) == b"{}" and sampler.finished


def test_seeded_reproducibility(tokenizer: Tokenizer) -> None:
    grammar = response_format_grammar({"type": "json_object"})
    first = run(tokenizer, grammar, RANDOM, seed=7, max_tokens=40)[0]
    assert first == run(tokenizer, grammar, RANDOM, seed=7, max_tokens=40)[0]
    assert first.startswith("{")


def test_max_tokens_cuts_the_json(tokenizer: Tokenizer) -> None:
    text, gen = run(tokenizer, Grammar.json_schema(SCHEMA), RANDOM, seed=0, max_tokens=3)
    assert gen.finish_reason == "length" and len(text) == 3


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "strin"}, "invalid JSON schema: Invalid type: strin"),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, "Unimplemented keys"),
        ({"type": "integer", "minimum": 5, "maximum": 3}, "Unsatisfiable schema"),
        ({"type": "string", "pattern": "(?<=a)b"}, "look-around"),
        ([1], "must be an object or a boolean"),
    ],
)
def test_bad_schemas(schema: object, message: str) -> None:
    with pytest.raises(GrammarError, match=message) as err:
        Grammar.json_schema(schema)
    assert isinstance(err.value, KleidipyError) and "\n" not in str(err.value)


def test_response_formats() -> None:
    assert response_format_grammar({"type": "text"}) is None
    assert response_format_grammar({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}})
    for bad, message in [
        ("json", "must be an object"),
        ({"type": "yaml"}, "must be one of text, json_object, json_schema"),
        ({"type": "json_schema"}, "json_schema must be an object"),
    ]:
        with pytest.raises(GrammarError, match=message):
            response_format_grammar(bad)


def test_gbnf(tokenizer: Tokenizer) -> None:
    grammar = Grammar.gbnf('root ::= "yes" | "no"')
    text, gen = run(tokenizer, grammar, RANDOM, seed=1)
    assert text in ("yes", "no") and gen.finish_reason == "stop"
    with pytest.raises(GrammarError, match="invalid grammar"):
        Grammar.gbnf("root ::= (")
