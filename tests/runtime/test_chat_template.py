"""Chat templates: the reference chat prompts reproduced exactly from the GGUFs' own templates and tokenized to
llama.cpp's ids; ChatML fallback; sandboxing and template errors as typed exceptions."""

from __future__ import annotations

import json
import time
import tracemalloc
from datetime import datetime
from pathlib import Path

import pytest
from model_files import QWEN25, SMOLLM2, model_file

from kleidipy.errors import KleidipyError
from kleidipy.runtime import chat_template
from kleidipy.runtime.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from kleidipy.runtime.tokenizer import Tokenizer, gguf_metadata

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _gguf(name: str) -> Path:
    return model_file(SMOLLM2 if name == "smollm2" else QWEN25)


@pytest.mark.parametrize(("name", "model"), [("smollm2", "smollm2-q4_0"), ("qwen25", "qwen25-q4_0")])
def test_reference_chat_prompt(name: str, model: str, reference_dir: Path) -> None:
    metadata = gguf_metadata(_gguf(name))
    template = ChatTemplate.from_metadata(metadata)
    assert template.source == metadata["tokenizer.chat_template"]
    ref = json.loads((reference_dir / "logits" / f"{model}__chat_capital__default.json").read_text())
    assert ref["messages"] == QUESTION
    prompt = template.render(ref["messages"], add_generation_prompt=True)
    assert prompt == ref["prompt_text"]
    assert Tokenizer(metadata).encode(prompt, parse_special=True) == ref["token_ids"]


def test_from_gguf_reads_template_and_special_texts() -> None:
    template = ChatTemplate.from_gguf(_gguf("smollm2"))
    assert (template.bos_token, template.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert template.render(QUESTION, add_generation_prompt=False).endswith("France?<|im_end|>\n")


def test_chatml_fallback() -> None:
    template = ChatTemplate.from_metadata({"tokenizer.ggml.tokens": ["<s>", "</s>"], "tokenizer.ggml.eos_token_id": 1})
    assert template.source == CHATML_TEMPLATE and template.eos_token == "</s>" and template.bos_token == ""
    messages = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert template.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(messages, add_generation_prompt=False).endswith("France?<|im_end|>\n")


def test_template_variables() -> None:
    source = (
        "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}\n{% endfor %}"
        "{% if tools %}tools={{ tools | length }}{% endif %}{{ strftime_now('%Y') }}"
    )
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    out = template.render(QUESTION, tools=[{"name": "f"}])
    assert out == f"<s>user:What is the capital of France?</s>\ntools=1{datetime.now():%Y}"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ raise_exception('only user and assistant roles') }}", "only user and assistant roles"),
        ("{% for m in messages %}", "does not compile"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed"),  # sandbox
        ("{% set _ = messages.append(1) %}", "failed"),  # immutable sandbox
    ],
)
def test_template_errors(source: str, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message) as exc:
        ChatTemplate(source).render(QUESTION)
    assert isinstance(exc.value, KleidipyError) and "\n" not in str(exc.value)


# hostile templates (issue 50): each ends within the render budget with one line, without filling the memory

#: a string of 2**21 characters, made within the limits (``*`` would spend the item budget)
BIG = "{% set ns = namespace(s='x') %}{% for i in range(21) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"


def _refused(source: str, message: str) -> str:
    """Render ``source`` expecting a ChatTemplateError matching ``message``: its one line (at most 256 MiB
    allocated on the way)."""
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError, match=message) as exc:
            ChatTemplate(source).render(QUESTION)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(exc.value) and peak < 256 << 20, (str(exc.value), peak)
    return str(exc.value)


@pytest.mark.parametrize(
    "source",
    [
        "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}",
        "{% set l = [1] * 1000 %}{% for a in l %}{% for b in l %}{% for c in l %}{% for d in l %}"
        "{% endfor %}{% endfor %}{% endfor %}{% endfor %}",
        "{% set l = [1] * 1000 %}{% for a in l %}{% for b in l %}{% for c in l %}{% if a > b %}{% endif %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        "{% set l = [1] * 1000 %}{% for a in l %}{% for b in l %}{% for c in l %}{% set x = a * b %}{% endfor %}"
        "{% endfor %}{% endfor %}",
    ],
)
def test_a_render_ends_within_its_time(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recursive macro and loops without output went on past 25 s: the time was checked only in range(), ``*``
    and between output pieces. Now every call, operator and loop step checks it."""
    monkeypatch.setattr(chat_template, "MAX_SECONDS", 0.5)
    start = time.monotonic()
    _refused(source, "takes more than 0.5 s to render")
    assert time.monotonic() - start < 5


def test_four_nested_ranges_end_on_the_item_budget() -> None:
    loops = "".join(f"{{% for {v} in range(1000) %}}" for v in "abcd") + "{% endfor %}" * 4
    _refused(loops, "makes more than 1048576 items")


def test_raise_exception_is_one_line() -> None:
    assert _refused("{{ raise_exception('a\\nb') }}", "chat template: a b") == "chat template: a b"
    assert len(_refused("{{ raise_exception('x' ~ ('y' * 1000)) }}", "chat template: xy")) < 256


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "adds up to more than"),
        ("{% set ns.l = [1] %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", "adds up to"),
        ("{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "more than 4194304 characters"),
        ("{{ ([ns.s] * 1000)|join }}", "joins more than"),
        ("{{ (['a'] * 1000)|join(ns.s) }}", "joins more than"),
        ("{{ ns.s.join(['a'] * 1000) }}", "joins more than"),
        ("{{ ('\\n' * 500000)|indent(1000) }}", "indents more than"),
        ("{{ ('\\n' * 500000)|indent('x' * 100) }}", "indents more than"),
        ("{{ ns.s|replace('x', 'yyy') }}", "replaces to more than"),
        ("{{ ns.s.replace('x', 'yyy') }}", "replaces to more than"),
        ("{{ ('{0}' * 1000).format(ns.s) }}", "formats more than"),
        ("{{ '{a}{a}{a}'.format_map({'a': ns.s}) }}", "formats more than"),
        ("{{ ('%s' * 3) % (ns.s, ns.s, ns.s) }}", "formats more than"),
        ("{{ '%*s' % (10**9, '') }}", "formats more than"),
        ("{{ ('%999999s' * 100)|format(*([1] * 100)) }}", "formats more than"),
        ("{{ ([ns.s] * 1000)|string }}", "makes a text of more than"),
        ("{{ ([ns.s] * 1000)|tojson }}", "makes a text of more than"),
        ("{{ ([ns.s] * 1000)|pprint }}", "makes a text of more than"),
        ("{{ [ns.s] * 1000 }}", "outputs a value of more than"),
        ("{{ {'a': [ns.s] * 1000}.items() }}", "outputs a value of more than"),
        ("{% set n = namespace(a=[ns.s] * 1000) %}{{ n }}", "outputs a value of more than"),
        ("{{ ([ns.s] * 1000)|map('upper')|list|length }}", "makes more than 67108864 characters or items in all"),
        ("{% for i in range(100) %}{% set t = ns.s ~ 'y' %}{% endfor %}", "67108864 characters or items in all"),
        ("{% macro m() %}{% for i in range(1000) %}{{ ns.s }}{% endfor %}{% endmacro %}{{ m() }}", "block of"),
        ("{% set x %}{% for i in range(1000) %}{{ ns.s }}{% endfor %}{% endset %}", "makes a block of"),
        ("{{ ('a ' * 500000)|wordwrap(1, wrapstring='xxxxxxxxxx') }}", "wraps to more than"),
        ("{{ ('a.co ' * 200000)|urlize(target='x' * 100) }}", "links to more than"),
        ("{{ ([[1]] * 1000000)|sum(start=[]) }}", "makes more than 1048576 items"),
        ("{{ lipsum(1000000) }}", "lorem ipsum of more than"),
        ("{{ strftime_now('%c' * 300000) }}", "formats a date of more than"),
        ("{{ raise_exception([ns.s] * 1000) }}", "makes a text of more than"),
        ("{% set ns.n = 3 %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}", "product of more"),
        ("{{ 'aaa'.translate({97: ns.s}) }}", "'translate' of 'str' object is unsafe"),
        ("{{ 'aaa'.maketrans({97: ns.s}) }}", "'maketrans' of 'str' object is unsafe"),
        ("{{ ('\\t' * 1000).expandtabs(999999) }}", "'expandtabs' of 'str' object is unsafe"),
    ],
)
def test_nothing_grows_past_the_size_limit(source: str, message: str) -> None:
    """String / list ``+``, ``|join`` and ``|indent`` made strings of gigabytes (4.2 GB before a MemoryError, or a
    1 GB indent that rendered): every string or list that grows is measured before it is made, and all a render
    makes is counted."""
    _refused(BIG + source, message)


def test_ordinary_uses_of_the_checked_operations_still_render() -> None:
    source = (
        "{{ 'x' + 'y' }} {{ [1] + [2] }} {{ 2 * 3 }} {{ 'ab' * 2 }} {{ ', '.join(['a', 'b']) }}"
        " {{ 'ab'|replace('a', 'c') }} {{ 'ab'.replace('a', 'c') }} {{ 'x'|indent(2, true) }}"
        " {{ '%d-%s' % (1733000000, 'a') }} {{ '{a}'.format_map({'a': 1}) }}"
        " {{ [[1], [2]]|sum(start=[]) }} {{ {'a': [1]}|tojson }} {{ [1, 2]|string }} {{ 'abc'|wordwrap(2) }}"
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{{ caller() if caller else '' }}{% endmacro %}"
        " {{ f(3) }}{% call f(0) %}C{% endcall %}{% filter upper %}b{% endfilter %}{% set x %}s{% endset %}{{ x }}"
        "{% for m in messages recursive %}{{ loop.index }}/{{ loop.length }}{{ loop.cycle('a', 'b') }}{% endfor %}"
    )
    assert ChatTemplate(source).render(QUESTION) == (
        'xy [1, 2] 6 abab a, b cb cb   x 1733000000-a 1 [1, 2] {"a": [1]} [1, 2] ab\nc 01230CBs1/1a'
    )
