"""Chat prompts: render a GGUF's ``tokenizer.chat_template`` (Jinja2, sandboxed) the way llama-cpp-python does.

The environment matches llama-cpp-python's ``Jinja2ChatFormatter`` (immutable sandbox, ``trim_blocks`` and
``lstrip_blocks``), and the template sees ``messages``, ``bos_token`` / ``eos_token`` (the vocabulary texts of
the BOS / EOS ids), ``add_generation_prompt``, ``raise_exception`` and ``strftime_now``, plus ``tools`` and
friends (None unless given). A GGUF without a template gets ChatML. The rendered prompt is meant to be tokenized
with ``parse_special=True`` so that the markers become their control tokens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import gguf
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kleidipy.errors import KleidipyError
from kleidipy.model.gguf_file import GGUFContainer
from kleidipy.model.tokenizer import gguf_metadata

TEMPLATE_KEY = "tokenizer.chat_template"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(KleidipyError, ValueError):
    """A chat template that does not compile, fails while rendering, or calls ``raise_exception``."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template with the BOS / EOS texts it may refer to."""

    def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML_TEMPLATE
        self.from_model = bool(source)  # False: the ChatML fallback for a GGUF without a template
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ChatTemplate:
        """From GGUF metadata: ``tokenizer.chat_template`` (ChatML if absent) and the BOS / EOS token texts."""
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def text(key: str) -> str:
            token = metadata.get(f"tokenizer.ggml.{key}")
            return tokens[int(token)] if token is not None and int(token) < len(tokens) else ""

        return cls(metadata.get(TEMPLATE_KEY), text("bos_token_id"), text("eos_token_id"))

    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | GGUFContainer | gguf.GGUFReader) -> ChatTemplate:
        """From a GGUF file path, an open :class:`GGUFContainer` / ``GGUFFile`` or a ``gguf.GGUFReader``."""
        return cls.from_metadata(gguf_metadata(source))

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        """The prompt text for ``messages`` (dicts with ``role`` and ``content``); ``variables`` (``tools``,
        ``documents``, ...) are passed to the template as they are."""
        context: dict[str, Any] = {"functions": None, "function_call": None, "tools": None, "tool_choice": None}
        context.update(variables)
        context.update(
            messages=[dict(m) for m in messages],
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
            raise_exception=_raise_exception,
            strftime_now=_strftime_now,
        )
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None
