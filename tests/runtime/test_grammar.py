"""The grammar step of the sampler chain on a tiny byte-level vocabulary (token id b = byte b): masks, acceptance,
completion, seeded reproducibility and the errors of bad schemas and response formats."""

from __future__ import annotations

import json

import llguidance
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


SELF = {"$ref": "#"}
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
INTERNALS = ("<state>", "<grammar>", "NoExtensionBias", "Parser", "Tokens")


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (SELF, "no text matches it"),
        (CYCLE, "no text matches it"),
        ({"type": "object", "properties": {"a": SELF}, "required": ["a"]}, "no finite JSON value"),
        ({"type": "array", "items": {"$ref": "#/$defs/x"}, "minItems": 1, "$defs": {"x": SELF}}, "no finite"),
        ({"type": "array", "prefixItems": [SELF], "minItems": 2}, "no finite JSON value"),
        ({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
          "$ref": "#/$defs/n"}, "no finite JSON value"),
        (False, "Unsatisfiable schema: schema is false"),
    ],
)  # fmt: skip
def test_schemas_no_text_can_match_are_refused_when_compiled(schema: object, message: str) -> None:
    """Self-referencing schemas compiled, then failed at the first token with llguidance's parser state (a 500
    carrying it); an object requiring itself generated for ever. Now each is a GrammarError of one clean line."""
    with pytest.raises(GrammarError, match=message) as err:
        Grammar.json_schema(schema)
    assert "\n" not in str(err.value) and not any(word in str(err.value) for word in INTERNALS)


def test_recursive_schemas_with_a_way_out_compile(tokenizer: Tokenizer) -> None:
    node = {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}}}
    for schema in (
        {"type": "object", "properties": {"a": SELF}},
        {"$defs": {"n": {**node, "required": ["next"]}}, "$ref": "#/$defs/n"},
        {"anyOf": [SELF, {"type": "integer"}]},
        {"type": "array", "items": SELF},
    ):
        assert Grammar.json_schema(schema).matcher(tokenizer).allowed().any()


def test_a_long_ref_chain_is_refused_before_llguidance_sees_it() -> None:
    """~950 chained $ref overflow llguidance's stack (a segfault): more than MAX_REF_DEPTH are refused."""
    defs = {f"a{i}": {"type": "array", "items": {"$ref": f"#/$defs/a{i - 1}"}} for i in range(1, 1000)}
    with pytest.raises(GrammarError, match="more than 100 deep"):
        Grammar.json_schema({"$defs": {**defs, "a0": {"type": "integer"}}, "$ref": "#/$defs/a999"})
    nested: object = {"type": "integer"}
    for _ in range(5000):
        nested = {"anyOf": [nested]}
    with pytest.raises(GrammarError, match="nested too deeply"):
        Grammar.json_schema(nested)


def test_a_failure_while_matching_carries_no_internals(tokenizer: Tokenizer) -> None:
    """A grammar that fails only while generating (a GBNF grammar meets its vocabulary there; a JSON schema's
    made here without the checks) gives our message alone."""
    unchecked = Grammar(llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SELF)))
    for grammar in (Grammar.gbnf("root ::= root"), unchecked):
        with pytest.raises(GrammarError, match="allows no token here") as err:
            grammar.matcher(tokenizer).allowed()
        assert not any(word in str(err.value) for word in INTERNALS)
    matcher = Grammar.json_schema(SCHEMA).matcher(tokenizer)
    with pytest.raises(GrammarError, match=f"^token {ord('x')} does not match the grammar$"):
        matcher.accept(ord("x"))


def test_a_grammar_may_name_its_vocabularys_special_tokens(tokenizer: Tokenizer) -> None:
    """Only a JSON schema is tried on the 256 bytes: a Lark grammar naming a special token is the vocabulary's."""
    matcher = Grammar.gbnf('%llguidance {}\nstart: "yes" <|im_end|>').matcher(tokenizer)
    assert np.flatnonzero(matcher.allowed()).tolist() == [ord("y")]
