"""Chat prompts: render a GGUF's ``tokenizer.chat_template`` (Jinja2, sandboxed) the way llama-cpp-python does.

The environment matches llama-cpp-python's ``Jinja2ChatFormatter`` (immutable sandbox, ``trim_blocks`` and
``lstrip_blocks``), and the template sees ``messages``, ``bos_token`` / ``eos_token`` (the vocabulary texts of
the BOS / EOS ids), ``add_generation_prompt``, ``raise_exception`` and ``strftime_now``, plus ``tools`` and
friends (None unless given). A GGUF without a template gets ChatML. The rendered prompt is meant to be tokenized
with ``parse_special=True`` so that the markers become their control tokens.

A template comes from the model file, so it is untrusted code: besides the sandbox, a render has a budget (the
items ``range()`` and repetition ``*`` make, the time), nothing may grow past a size limit (a power ``**``, a
string joined with ``~``, a number handed to a function or filter such as ``center(n)``, a format width, the
output), and any error it raises (a bad operation, a recursion too deep, memory) becomes a
:class:`ChatTemplateError`.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import gguf
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kleidipy.errors import KleidipyError
from kleidipy.runtime.gguf_file import GGUFContainer
from kleidipy.runtime.tokenizer import gguf_metadata, special_token_id

TEMPLATE_KEY = "tokenizer.chat_template"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


#: What one render may do: items made by range() and ``*`` repetitions, bits of a ``**`` result, characters of
#: output (a prompt is far smaller than any of these), seconds.
MAX_ITEMS = 1 << 20
MAX_POWER_BITS = 1 << 12
MAX_OUTPUT = 1 << 22
MAX_SECONDS = 10.0
#: Errors a template's own operations raise (Jinja's, and Python's for a bad operation inside the sandbox).
_TEMPLATE_FAILURES = (
    jinja2.TemplateError,
    ArithmeticError,
    LookupError,
    TypeError,
    ValueError,
    RecursionError,
    MemoryError,
)


class ChatTemplateError(KleidipyError, ValueError):
    """A chat template that does not compile, fails while rendering, calls ``raise_exception``, or goes over
    its render budget."""


class _Budget:
    """What is left of one render's budget (items made, time)."""

    def __init__(self) -> None:
        self.items = MAX_ITEMS
        self.deadline = time.monotonic() + MAX_SECONDS

    def spend(self, items: int) -> None:
        self.items -= items
        if self.items < 0:
            raise ChatTemplateError(f"chat template makes more than {MAX_ITEMS} items (range() or repetition)")
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template takes more than {MAX_SECONDS:g} s to render")

    def range(self, *args: int) -> range:
        items = range(*args)
        self.spend(len(items))
        return items


def _check_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse a number too large to be a size a template needs (``center(10**9)``, ``batch(10**9)``, ...)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and abs(value) > MAX_ITEMS:
            raise ChatTemplateError(f"chat template passes {value} to a function (at most {MAX_ITEMS})")


def _check_format(fmt: Any) -> None:
    """Refuse a format string with a width or precision of 7 digits or more."""
    if isinstance(fmt, str) and re.search(r"\d{7}", fmt):
        raise ChatTemplateError("chat template formats with a width or precision of a million or more")


def _limited_filter(apply: Any) -> Any:
    @functools.wraps(apply)  # keeps Jinja's pass_context / pass_eval_ctx marks
    def limited(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(args, kwargs)
        if apply is jinja2.filters.do_format:
            _check_format(args[0])
        return apply(*args, **kwargs)

    return limited


def _limited_join(pieces: Any) -> str:
    """``~``: Jinja's ``str_join``, refusing a string longer than the output may be."""
    texts = [str(piece) for piece in pieces]
    if sum(map(len, texts)) > MAX_OUTPUT:
        raise ChatTemplateError(f"chat template joins a string of more than {MAX_OUTPUT} characters")
    return "".join(texts)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the limits of the module docstring (the render budget is ``budget`` in the
    context)."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _limited_filter(apply) for name, apply in self.filters.items()}

    def from_string(self, source: str, *args: Any, **kwargs: Any) -> jinja2.Template:
        template = super().from_string(source, *args, **kwargs)
        template.root_render_func.__globals__["str_join"] = _limited_join  # the template module's own namespace
        return template

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(count, int) and count > 0:
                    context["budget"].spend(len(seq) * count)
        elif operator == "%":
            _check_format(left)
        elif isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:  # noqa: SIM102
            if right * abs(left).bit_length() > MAX_POWER_BITS:
                raise ChatTemplateError(f"chat template computes a power of more than {MAX_POWER_BITS} bits")
        return super().call_binop(context, operator, left, right)

    def call(self, context: jinja2.runtime.Context, obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_arguments(args, kwargs)
        return super().call(context, obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)  # None unless value is a str's format / format_map
        if wrapped is not None:
            _check_format(value.__self__)
        return wrapped


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
        env = _Sandbox(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
        try:
            self._template = env.from_string(self.source)
        except _TEMPLATE_FAILURES as exc:
            raise ChatTemplateError(f"chat template does not compile: {_describe(exc)}") from None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ChatTemplate:
        """From GGUF metadata: ``tokenizer.chat_template`` (ChatML if absent) and the BOS / EOS token texts."""
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def text(key: str) -> str:
            token = special_token_id(metadata, key, len(tokens))
            return "" if token is None else tokens[token]

        return cls(metadata.get(TEMPLATE_KEY), text("bos_token_id"), text("eos_token_id"))

    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | GGUFContainer | gguf.GGUFReader) -> ChatTemplate:
        """From a GGUF file path, an open :class:`GGUFContainer` / ``ModelFile`` or a ``gguf.GGUFReader``."""
        return cls.from_metadata(gguf_metadata(source))

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        """The prompt text for ``messages`` (dicts with ``role`` and ``content``); ``variables`` (``tools``,
        ``documents``, ...) are passed to the template as they are."""
        context: dict[str, Any] = {"functions": None, "function_call": None, "tools": None, "tool_choice": None}
        context.update(variables)
        budget = _Budget()
        context.update(
            messages=[dict(m) for m in messages],
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
            raise_exception=_raise_exception,
            strftime_now=_strftime_now,
            range=budget.range,
            budget=budget,
        )
        pieces, size = [], 0
        try:
            for piece in self._template.generate(**context):
                size += len(piece)
                if size > MAX_OUTPUT:
                    raise ChatTemplateError(f"chat template outputs more than {MAX_OUTPUT} characters")
                budget.spend(0)
                pieces.append(piece)
        except ChatTemplateError:
            raise
        except _TEMPLATE_FAILURES as exc:
            raise ChatTemplateError(f"chat template failed: {_describe(exc)}") from None
        return "".join(pieces)


def _describe(exc: BaseException) -> str:
    """One line about a template's error: Jinja's message, or the Python error's name and message."""
    if isinstance(exc, jinja2.TemplateError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
