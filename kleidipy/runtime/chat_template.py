"""Chat prompts: render a GGUF's ``tokenizer.chat_template`` (Jinja2, sandboxed) the way llama-cpp-python does; a
GGUF without a template gets ChatML. A template is untrusted code: a render has a budget and size limits, and any
error it raises becomes a :class:`ChatTemplateError` of one line.

The environment and the limits: docs/chat-templates.md."""

from __future__ import annotations

import functools
import inspect
import os
import re
import string
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any, NoReturn

import gguf
import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum

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
#: characters (and list items) one render may make in all: strings and lists made by calls, filters, operators,
#: ``~``, blocks and output values (copies of a prompt made a few times over stay far below it)
MAX_MADE = 1 << 26
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
        self.made = MAX_MADE
        self.deadline = time.monotonic() + MAX_SECONDS

    def spend(self, items: int) -> None:
        self.items -= items
        if self.items < 0:
            raise ChatTemplateError(f"chat template makes more than {MAX_ITEMS} items (range(), repetition or sum)")
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template takes more than {MAX_SECONDS:g} s to render")

    def make(self, size: int) -> None:
        """Count a string or list of ``size`` characters or items made."""
        self.made -= size
        if self.made < 0:
            raise ChatTemplateError(f"chat template makes more than {MAX_MADE} characters or items in all")

    def range(self, *args: int) -> range:
        items = range(*args)
        self.spend(len(items))
        return items


#: the budget of the compile or render under way (out of the template's reach, unlike a context variable)
_BUDGET: ContextVar[_Budget] = ContextVar("chat_template_budget")


def _spend(items: int = 0) -> None:
    """Spend ``items`` of the current budget, and check its time."""
    _BUDGET.get().spend(items)


def _text_size(value: Any, indent: int = 0) -> int:
    """About how many characters ``str(value)`` has (a container's repr, or its JSON with ``indent``), counted
    without making it and only until it is past :data:`MAX_OUTPUT`: what a join, ``string``, ``tojson`` or an
    output would make of a list holding one long string many times."""
    size, stack = 0, [(value, 0)]
    while stack and size <= MAX_OUTPUT:
        item, depth = stack.pop()
        if isinstance(item, str | bytes):
            size += len(item) + 2
        elif isinstance(item, int):
            size += item.bit_length() // 3 + 2
        elif isinstance(item, Namespace):
            stack.append((item._Namespace__attrs, depth))  # what its repr shows (its own, allowed name)
        elif isinstance(item, Mapping):
            size += 2 + len(item) * (4 + indent * (depth + 1))
            stack += [(part, depth + 1) for pair in item.items() for part in pair]
        elif isinstance(item, Collection):
            size += 2 + len(item) * (2 + indent * (depth + 1))
            stack += [(part, depth + 1) for part in item]
        else:
            size += 32
    return size


def _check_size(size: int, what: str) -> None:
    """Refuse to make a string or list of ``size`` characters or items, past the output limit."""
    if size > MAX_OUTPUT:
        raise ChatTemplateError(f"chat template {what} more than {MAX_OUTPUT} characters or items")


def _measured(value: Any) -> Any:
    """``value``, once a string or container a call, filter or operator made is found within the limits."""
    if isinstance(value, str | bytes | Collection):
        _check_size(len(value), "makes a string or list of")
        _BUDGET.get().make(len(value))
    return value


def _text(value: Any) -> str:
    """``str(value)``, once its size is known to be within the limit."""
    _check_size(_text_size(value), "makes a text of")
    return value if isinstance(value, str) else str(value)


def _width(value: Any) -> int:
    """The characters an argument adds where it is inserted: a number of spaces, or a string's (None: one)."""
    return value if isinstance(value, int) else 1 if value is None else _text_size(value)


def _check_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse a number too large to be a size a template needs (``center(10**9)``, ``batch(10**9)``, ...)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and abs(value) > MAX_ITEMS:
            raise ChatTemplateError(f"chat template passes {value} to a function (at most {MAX_ITEMS})")


def _check_format(fmt: Any) -> None:
    """Refuse a format string with a width or precision of 7 digits or more."""
    if isinstance(fmt, str) and re.search(r"\d{7}", fmt):
        raise ChatTemplateError("chat template formats with a width or precision of a million or more")


def _check_formatted(fmt: str, values: Iterable[Any], percent: bool) -> None:
    """Refuse a ``%`` (``percent``) or ``str.format`` formatting that would make more than the output limit: each
    field at most the widest value (or a width taken from the values, ``*`` or ``{:{}}``), plus the widths and
    precisions written in the fields."""
    values = list(values)
    if percent:
        fields = re.findall(r"%[^a-zA-Z%]*", fmt)
        dynamic = "*" in fmt
    else:
        fields = [spec for _, name, spec, _ in string.Formatter().parse(fmt) if name is not None]
        dynamic = any("{" in (spec or "") for spec in fields)
    widest = max(map(_text_size, values), default=0)
    if dynamic:
        widest = max([widest, *(value for value in values if isinstance(value, int))])
    written = sum(int(number) for field in fields for number in re.findall(r"\d+", field or ""))
    _check_size(len(fmt) + len(fields) * widest + written, "formats")


def _percent_values(args: Any) -> tuple[Any, ...]:
    """What a ``%`` formatting takes its fields from: a tuple's items, else the value itself."""
    return args if isinstance(args, tuple) else (args,)


def _check_join(arguments: dict[str, Any]) -> None:
    arguments["value"] = pieces = list(arguments["value"])
    _check_size(_text_size(pieces) + len(pieces) * _width(arguments["d"]), "joins")


def _check_indent(arguments: dict[str, Any]) -> None:
    arguments["s"] = text = _text(arguments["s"])
    _check_size(len(text) + (text.count("\n") + 1) * _width(arguments["width"]), "indents")


def _replaced_size(text: str | bytes, old: Any, new: Any, count: Any) -> int:
    """The length of ``text.replace(old, new, count)``, without making it."""
    found = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * (len(new) - len(old))


def _check_replace(arguments: dict[str, Any]) -> None:
    text, old, new = (_text(arguments[name]) for name in ("s", "old", "new"))
    _check_size(_replaced_size(text, old, new, arguments["count"]), "replaces to")


def _check_format_filter(arguments: dict[str, Any]) -> None:
    _check_format(arguments["value"])
    values = arguments["kwargs"].values() if arguments["kwargs"] else arguments["args"]
    _check_formatted(_text(arguments["value"]), values, percent=True)


def _check_text(arguments: dict[str, Any]) -> None:
    value = arguments["s" if "s" in arguments else "value"]
    _check_size(_text_size(value, _width(arguments.get("indent") or 0)), "makes a text of")


def _check_wordwrap(arguments: dict[str, Any]) -> None:
    text = _text(arguments["s"])
    _check_size((len(text) + 1) * (1 + _width(arguments["wrapstring"])), "wraps to")


def _check_urlize(arguments: dict[str, Any]) -> None:
    text = _text(arguments["value"])
    link = 40 + _width(arguments["target"]) + _width(arguments["rel"])
    _check_size(2 * len(text) + len(text.split()) * link, "links to")


def _check_sum(arguments: dict[str, Any]) -> None:
    """A sum of lists copies what it has so far at every step: it spends items as it would copy them."""
    values = list(arguments["iterable"])
    if arguments["attribute"] is not None:
        getter = jinja2.filters.make_attrgetter(arguments["environment"], arguments["attribute"])
        values, arguments["attribute"] = [getter(value) for value in values], None
    arguments["iterable"] = values
    lengths = [len(value) for value in (arguments["start"], *values) if isinstance(value, list | tuple)]
    _spend(len(values) * sum(lengths))


#: filters whose result may be far larger than their arguments: a check of the size it would have, which may
#: replace an argument (an iterable it has to read first)
_FILTER_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "join": _check_join,
    "indent": _check_indent,
    "replace": _check_replace,
    "format": _check_format_filter,
    "string": _check_text,
    "pprint": _check_text,
    "tojson": _check_text,
    "wordwrap": _check_wordwrap,
    "urlize": _check_urlize,
    "sum": _check_sum,
}


def _limited_filter(name: str, apply: Any) -> Any:
    check = _FILTER_CHECKS.get(name)
    signature = inspect.signature(apply) if check else None

    @functools.wraps(apply)  # keeps Jinja's pass_context / pass_eval_ctx marks
    def limited(*args: Any, **kwargs: Any) -> Any:
        _spend()
        _check_arguments(args, kwargs)
        if signature is not None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            check(bound.arguments)
            args, kwargs = bound.args, bound.kwargs
        return _measured(apply(*args, **kwargs))

    return limited


def _limited_join(pieces: Any) -> str:
    """``~``: Jinja's ``str_join``, refusing a string longer than the output may be."""
    texts = [_text(piece) for piece in pieces]
    if sum(map(len, texts)) > MAX_OUTPUT:
        raise ChatTemplateError(f"chat template joins a string of more than {MAX_OUTPUT} characters")
    return _measured("".join(texts))


def _limited_concat(pieces: Iterable[str]) -> str:
    """The text of a block (a macro's, ``{% set %}``'s, ``{% filter %}``'s, a ``caller()``'s) from its output
    pieces, refusing one longer than the output may be."""
    texts = list(pieces)
    _check_size(sum(map(len, texts)), "makes a block of")
    return _measured("".join(texts))


def _finalize(value: Any) -> Any:
    """Every ``{{ ... }}`` value, before it is made text: refuse one whose text would be too long, and count the
    text made of one that is not a string already."""
    size = _text_size(value)
    _check_size(size, "outputs a value of")
    if not isinstance(value, str):
        _BUDGET.get().make(size)
    return value


def _lipsum(*args: Any, **kwargs: Any) -> str:
    """Jinja's ``lipsum(n, html, min, max)``, refusing more words than the output may hold."""
    arguments = inspect.signature(generate_lorem_ipsum).bind(*args, **kwargs)
    arguments.apply_defaults()
    n, most = arguments.arguments["n"], arguments.arguments["max"]
    if isinstance(n, int) and isinstance(most, int):
        _check_size(n * most * 16, "makes lorem ipsum of")
    return generate_lorem_ipsum(*arguments.args, **arguments.kwargs)


#: ``str`` / ``bytes`` methods that multiply a string by an argument the size checks do not follow
_UNSAFE_TEXT_METHODS = frozenset({"translate", "maketrans", "expandtabs"})


def _check_text_method(method: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """Check the size ``str.join`` / ``str.replace`` (and ``bytes``') would make; the arguments to call with (an
    iterable to join read first)."""
    text, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(text, str | bytes):
        return args
    if name == "join" and len(args) == 1:
        pieces = list(args[0])
        _check_size(_text_size(pieces) + len(pieces) * len(text), "joins")
        return (pieces,)
    if name == "replace" and len(args) >= 2:
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        _check_size(_replaced_size(text, args[0], args[1], count), "replaces to")
    return args


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the limits of docs/chat-templates.md (the budget is the current ``_BUDGET``):
    every ``for`` loop's iterable goes through :meth:`budgeted`, every call and filter checks the time and the
    sizes, ``{{ ... }}`` values pass :func:`_finalize` and block texts :func:`_limited_concat`."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})
    concat = staticmethod(_limited_concat)

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=_finalize, **options)
        self.filters = {name: _limited_filter(name, apply) for name, apply in self.filters.items()}
        self.globals["lipsum"] = _lipsum

    def from_string(self, source: str, *args: Any, **kwargs: Any) -> jinja2.Template:
        template = super().from_string(source, *args, **kwargs)
        template.root_render_func.__globals__["str_join"] = _limited_join  # the template module's own namespace
        return template

    def compile(self, source: str | nodes.Template, *args: Any, **kwargs: Any) -> Any:
        """Compile with every ``for`` loop's iterable wrapped in :meth:`budgeted`."""
        tree = self.parse(source) if isinstance(source, str) else source
        for loop in tree.find_all(nodes.For):
            budgeted = nodes.EnvironmentAttribute("budgeted", lineno=loop.iter.lineno)
            loop.iter = nodes.Call(budgeted, [loop.iter], [], None, None, lineno=loop.iter.lineno)
        return super().compile(tree, *args, **kwargs)

    def budgeted(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """A loop's items, the time checked at every step."""
        for item in iterable:
            _spend()
            yield item

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        _spend()
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(count, int) and count > 0:
                    _spend(len(seq) * count)
            if isinstance(left, int) and isinstance(right, int) and left and right:  # noqa: SIM102
                if abs(left).bit_length() + abs(right).bit_length() > MAX_POWER_BITS:
                    raise ChatTemplateError(f"chat template computes a product of more than {MAX_POWER_BITS} bits")
        elif operator == "+":
            if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
                _check_size(len(left) + len(right), "adds up to")
        elif operator == "%":
            _check_format(left)
            if isinstance(left, str):
                _check_formatted(left, _percent_values(right), percent=True)
        elif isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:  # noqa: SIM102
            if right * abs(left).bit_length() > MAX_POWER_BITS:
                raise ChatTemplateError(f"chat template computes a power of more than {MAX_POWER_BITS} bits")
        return _measured(super().call_binop(context, operator, left, right))

    def call(self, context: jinja2.runtime.Context, obj: Any, *args: Any, **kwargs: Any) -> Any:
        _spend()
        _check_arguments(args, kwargs)
        args = _check_text_method(obj, args, kwargs)
        return _measured(super().call(context, obj, *args, **kwargs))

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str | bytes) and attr in _UNSAFE_TEXT_METHODS:
            return False
        return super().is_safe_attribute(obj, attr, value)

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)  # None unless value is a str's format / format_map
        if wrapped is None:
            return None
        fmt = value.__self__
        _check_format(fmt)

        def limited(*args: Any, **kwargs: Any) -> str:
            _check_formatted(fmt, [*args, *kwargs.values()], percent=False)  # format_map: its mapping's size
            return _measured(wrapped(*args, **kwargs))

        return limited


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(f"chat template: {_one_line(_text(message))}")


def _strftime_now(fmt: str) -> str:
    _check_size(len(_text(fmt)) * 16, "formats a date of")  # at most ~12 characters a format character (%c)
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template with the BOS / EOS texts it may refer to."""

    def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML_TEMPLATE
        self.from_model = bool(source)  # False: the ChatML fallback for a GGUF without a template
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = _Sandbox(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
        budget = _BUDGET.set(_Budget())  # Jinja computes constant expressions as it compiles
        try:
            self._template = env.from_string(self.source)
        except _TEMPLATE_FAILURES as exc:
            raise ChatTemplateError(f"chat template does not compile: {_describe(exc)}") from None
        finally:
            _BUDGET.reset(budget)

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
        )
        pieces, size = [], 0
        token = _BUDGET.set(budget)
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
        finally:
            _BUDGET.reset(token)
        return "".join(pieces)


def _one_line(text: str) -> str:
    """``text`` on one line of at most 200 characters."""
    text = " ".join(text.split())
    return text if len(text) <= 200 else f"{text[:197]}..."


def _describe(exc: BaseException) -> str:
    """One line about a template's error: Jinja's message, or the Python error's name and message."""
    if isinstance(exc, jinja2.TemplateError):
        return _one_line(str(exc))
    text = _one_line(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
