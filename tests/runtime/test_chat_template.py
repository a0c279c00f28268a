"""Chat templates: the reference chat prompts reproduced exactly from the GGUFs' own templates and tokenized to
llama.cpp's ids; ChatML fallback; sandboxing and template errors as typed exceptions."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from model_files import QWEN25, SMOLLM2, model_file

from kleidipy.errors import KleidipyError
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
