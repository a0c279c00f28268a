"""Tokenizer built from GGUF metadata, giving exactly llama.cpp's token ids (llama-vocab / unicode rules): byte-level
BPE (``gpt2``) and SentencePiece (``llama``) vocabularies with llama.cpp's pre-tokenizers and token attributes;
metadata that contradicts itself is refused with a :class:`TokenizerError`.

Details: docs/tokenizer.md."""

from __future__ import annotations

import enum
import functools
import heapq
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gguf

from kleidipy.errors import KleidipyError
from kleidipy.runtime.gguf_file import GGUFContainer


class TokenizerError(KleidipyError, ValueError):
    """GGUF tokenizer metadata that llama.cpp would reject (unknown model/pre-tokenizer, duplicates, ...)."""


class TokenAttr(enum.IntFlag):
    """llama.cpp's token attributes (``llama_token_attr``); GGUF token types map onto them."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


# plain ints in the per-token tables (IntFlag arithmetic is slow over 10^5 tokens)
_NORMAL, _CONTROL_ATTR, _USER_DEFINED, _BYTE = map(
    int, (TokenAttr.NORMAL, TokenAttr.CONTROL, TokenAttr.USER_DEFINED, TokenAttr.BYTE)
)
# tokenizer.ggml.token_type values (llama_token_type: NORMAL=1 ... BYTE=6) -> attribute
_TYPE_TO_ATTR = {
    token_type: int(TokenAttr[name])
    for token_type, name in enumerate(("NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"), 1)
}
_SPECIAL_ATTRS = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)  # not rendered unless unparse_special
_CACHED_ATTRS = _SPECIAL_ATTRS | _USER_DEFINED  # matched as whole tokens before splitting

# Texts llama.cpp recognises at load time: (metadata key of the id, candidate texts). A kind whose id is not
# given in the metadata takes the first token with one of these texts and forces it to CONTROL.
_DETECTED_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "eot",
        (
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|end_of_text|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "<｜end▁of▁sentence｜>",
            "<end_of_utterance>",
        ),
    ),
    ("eom", ("<|eom_id|>",)),
    (
        "fim_pre",
        (
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ),
    ),
    (
        "fim_suf",
        (
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ),
    ),
    (
        "fim_mid",
        (
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ),
    ),
    ("fim_pad", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    ("fim_rep", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    ("fim_sep", ("<|file_sep|>",)),
)
# Metadata keys of the ids above (the deprecated prefix/suffix/middle keys fill the FIM ids too).
_ID_KEYS = {
    "eot": ("eot_token_id",),
    "eom": ("eom_token_id",),
    "fim_pre": ("fim_pre_token_id", "prefix_token_id"),
    "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
    "fim_mid": ("fim_mid_token_id", "middle_token_id"),
    "fim_pad": ("fim_pad_token_id",),
    "fim_rep": ("fim_rep_token_id",),
    "fim_sep": ("fim_sep_token_id",),
}
# Texts that end generation (and are forced to CONTROL).
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    }
)
_ALWAYS_RENDERED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})  # gpt-oss

# ---------------------------------------------------------------------------------------------------------
# Unicode code point classes (llama.cpp's unicode_cpt_flags)

_UNDEFINED, _NUMBER, _LETTER, _SEPARATOR, _MARK, _PUNCTUATION, _SYMBOL, _CONTROL = (1 << i for i in range(8))
_WHITESPACE = 1 << 8
_MAJOR_CATEGORY = {
    "L": _LETTER,
    "M": _MARK,
    "N": _NUMBER,
    "P": _PUNCTUATION,
    "S": _SYMBOL,
    "Z": _SEPARATOR,
    "C": _CONTROL,
}
# Unicode White_Space code points
_WHITESPACE_CPTS = frozenset([*range(0x09, 0x0E), *range(0x2000, 0x200B), 0x20, 0x85, 0xA0, 0x1680]) | {
    0x2028,
    0x2029,
    0x202F,
    0x205F,
    0x3000,
}


@functools.cache
def _cpt_flags(ch: str) -> int:
    """Category flag of one code point (Cn is UNDEFINED, other C* CONTROL), plus the whitespace flag."""
    category = unicodedata.category(ch)
    flags = _UNDEFINED if category == "Cn" else _MAJOR_CATEGORY[category[0]]
    return flags | (_WHITESPACE if ord(ch) in _WHITESPACE_CPTS else 0)


# Collapsed text: ASCII stays, non-ASCII whitespace becomes \v, other code points one byte per category.
_COLLAPSED_CHAR = {_NUMBER: "\xd1", _LETTER: "\xd2", _PUNCTUATION: "\xd3", _MARK: "\xd4", _SYMBOL: "\xd5"}
# \p{..} in a regex -> its collapsed byte plus the ASCII code points of the category
_CATEGORY_CLASS = {
    "N": "\xd1" + "0-9",
    "L": "\xd2" + "A-Za-z",
    "P": "\xd3" + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": "\xd4",
    "S": "\xd5" + r"\$\+<->\^`\|",
}
_CATEGORY_CLASS.update({name: _CATEGORY_CLASS["L"] for name in ("Lu", "Ll", "Lt", "Lm", "Lo")})


@functools.cache
def _collapse_char(ch: str) -> str:
    if ord(ch) < 128:
        return ch
    flags = _cpt_flags(ch)
    if flags & _WHITESPACE:
        return "\x0b"
    return _COLLAPSED_CHAR.get(flags & 0xFF, "\xd0")


@functools.cache
def _blank_non_ascii_space(ch: str) -> str:
    return "\x0b" if ord(ch) >= 128 and _cpt_flags(ch) & _WHITESPACE else ch


# ---------------------------------------------------------------------------------------------------------
# Pre-tokenizer splitting. A stage maps the current pieces (code point spans) of ``text`` to finer pieces.

Spans = list[tuple[int, int]]


class _Cursor:
    """A piece being split: code points and flags, with out-of-piece positions reading as None / 0."""

    __slots__ = ("text", "end", "flags", "out", "prev")

    def __init__(self, text: str, flags: Sequence[int], start: int, end: int, out: Spans) -> None:
        self.text, self.flags, self.end, self.out, self.prev = text, flags, end, out, start

    def cpt(self, pos: int) -> str | None:
        return self.text[pos] if pos < self.end else None

    def flag(self, pos: int) -> int:
        return self.flags[pos] if pos < self.end else 0

    def emit(self, end: int) -> int:
        """Close the word ending at ``end``; returns ``end``."""
        if end > self.prev:
            self.out.append((self.prev, end))
        self.prev = end
        return end

    def letters_from(self, pos: int) -> int:
        while self.flag(pos) & _LETTER:
            pos += 1
        return pos

    def whitespace_tail(self, pos: int) -> int:
        """Split a whitespace run at ``pos``: ``\\s+(?!\\S)`` leaves its last blank to the next word."""
        n = 0
        while self.flag(pos + n) & _WHITESPACE:
            n += 1
        if n > 1 and pos + n < self.end:
            return self.emit(pos + n - 1)
        return self.emit(pos + max(n, 1))


def _contraction_end(cur: _Cursor, pos: int, fold: Callable[[str], str]) -> int:
    """End of an English contraction ('s 't 're 've 'm 'll 'd) at ``pos``, or 0."""
    if cur.text[pos] != "'" or pos + 1 >= cur.end:
        return 0
    c1 = fold(cur.text[pos + 1])
    if c1 in ("s", "t", "m", "d"):
        return pos + 2
    if pos + 2 < cur.end and c1 + fold(cur.text[pos + 2]) in ("re", "ve", "ll"):
        return pos + 3
    return 0


def _not_word(flags: int) -> bool:
    """``[^\\s\\p{L}\\p{N}]`` for an in-piece code point (out-of-piece positions have flags 0)."""
    return flags != 0 and not flags & (_WHITESPACE | _LETTER | _NUMBER)


def _split_gpt2(text: str, flags: Sequence[int], spans: Spans) -> Spans:
    """llama.cpp's hand-written GPT-2 splitter, for the regex
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
    """
    out: Spans = []
    for start, end in spans:
        cur = _Cursor(text, flags, start, end, out)
        pos = start
        while pos < end:
            c = text[pos]
            if stop := _contraction_end(cur, pos, str):
                pos = cur.emit(stop)
                continue
            after_space = pos + (c == " ")
            flags2 = cur.flag(after_space)
            if flags2 & _LETTER:
                pos = cur.emit(cur.letters_from(after_space))
            elif flags2 & _NUMBER:
                pos = after_space
                while cur.flag(pos) & _NUMBER:
                    pos += 1
                pos = cur.emit(pos)
            elif _not_word(flags2):
                pos = after_space
                while _not_word(cur.flag(pos)):
                    pos += 1
                pos = cur.emit(pos)
            else:
                pos = cur.whitespace_tail(pos)
    return out


def _split_llama3(text: str, flags: Sequence[int], spans: Spans) -> Spans:
    """llama.cpp's hand-written Llama-3 splitter, for the regex (?i:'s|'t|'re|'ve|'m|'ll|'d)|
    [^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+
    """
    out: Spans = []
    for start, end in spans:
        cur = _Cursor(text, flags, start, end, out)
        pos = start
        while pos < end:
            c, f = text[pos], flags[pos]
            if stop := _contraction_end(cur, pos, str.lower):
                pos = cur.emit(stop)
                continue
            if c not in "\r\n" and not f & _NUMBER and (f & _LETTER or cur.flag(pos + 1) & _LETTER):
                pos = cur.emit(cur.letters_from(pos + 1))
                continue
            if f & _NUMBER:
                group = pos
                while cur.flag(pos) & _NUMBER:
                    pos += 1
                    if pos - group >= 3:
                        group = cur.emit(pos)
                pos = cur.emit(pos)
                continue
            after_space = pos + (c == " ")
            if _not_word(cur.flag(after_space)):
                pos = after_space
                while _not_word(cur.flag(pos)):
                    pos += 1
                while cur.cpt(pos) in ("\r", "\n"):
                    pos += 1
                pos = cur.emit(pos)
                continue
            n, last_newline = 0, 0
            while cur.flag(pos + n) & _WHITESPACE:
                if text[pos + n] in "\r\n":
                    last_newline = pos + n + 1
                n += 1
            pos = cur.emit(last_newline) if last_newline else cur.whitespace_tail(pos)
    return out


@dataclass(frozen=True)
class _RegexSplit:
    """A regex stage: matches and the text between them both become pieces. Patterns using \\p{..} run on the
    collapsed text (as llama.cpp does with std::regex), others on the text with non-ASCII blanks as \\v."""

    expr: str

    @functools.cached_property
    def collapsed(self) -> bool:
        return re.search(r"\\p\{(?:N|L|P|M|S|Lu|Ll|Lt|Lm|Lo)\}", self.expr) is not None

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        expr = self.expr
        if self.collapsed:
            parts, inside, i = [], False, 0
            while i < len(expr):
                c = expr[i]
                escaped = i > 0 and expr[i - 1] == "\\"
                if c == "[" and not escaped:
                    inside = True
                elif c == "]" and inside and not escaped:
                    inside = False
                elif m := re.match(r"\\p\{(\w+)\}", expr[i:]):
                    cls = _CATEGORY_CLASS[m.group(1)]
                    parts.append(cls if inside else f"[{cls}]")
                    i += m.end()
                    continue
                parts.append(c)
                i += 1
            expr = "".join(parts)
        # C++ std::regex in the C locale: \s is exactly [ \t\n\v\f\r]
        return re.compile(expr, re.ASCII)

    def __call__(self, text: str, flags: Sequence[int], spans: Spans) -> Spans:
        subject = "".join(map(_collapse_char if self.collapsed else _blank_non_ascii_space, text))
        out: Spans = []
        for start, end in spans:
            prev = start
            for m in self.pattern.finditer(subject, start, end):
                if m.start() > prev:
                    out.append((prev, m.start()))
                out.append(m.span())
                prev = m.end()
            if prev < end:
                out.append((prev, end))
        return out


@dataclass(frozen=True)
class _PreTokenizer:
    stages: tuple[Callable[[str, Sequence[int], Spans], Spans], ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False


_GPT2_FAMILY = _PreTokenizer((_split_gpt2,))
_LLAMA3_FAMILY = _PreTokenizer((_split_llama3,), ignore_merges=True, add_bos=True)
_QWEN2_STAGES = (
    _RegexSplit(
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
_DIGITS_THEN_GPT2 = (_RegexSplit(r"\p{N}"), _split_gpt2)

# tokenizer.ggml.pre -> splitting rules and the vocab flags llama.cpp sets for it
PRE_TOKENIZERS: dict[str, _PreTokenizer] = {
    "default": _PreTokenizer(
        (_RegexSplit(r"[\p{P}\$\+<=>\^~\|]+"), _split_gpt2, _RegexSplit(r"\p{N}+"), _RegexSplit("[0-9][0-9][0-9]"))
    ),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo"), _GPT2_FAMILY),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"), _LLAMA3_FAMILY),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _PreTokenizer((_split_llama3,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _PreTokenizer(_QWEN2_STAGES, clean_spaces=False)),
    **dict.fromkeys(("stablelm2", "megrez"), _PreTokenizer(_QWEN2_STAGES)),
    **dict.fromkeys(("smollm", "command-r"), _PreTokenizer(_DIGITS_THEN_GPT2, clean_spaces=False)),
    **dict.fromkeys(("starcoder", "refact", "codeshell", "exaone", "minerva-7b"), _PreTokenizer(_DIGITS_THEN_GPT2)),
}


def _byte_to_char_table() -> list[str]:
    """GPT-2's reversible byte -> printable character map."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in printable:
        table[b] = chr(b)
    extra = 256
    for b in range(256):
        if not table[b]:
            table[b] = chr(extra)
            extra += 1
    return table


_BYTE_TO_CHAR = _byte_to_char_table()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_CHAR)}
_SPACE_ESCAPE = "\u2581"  # SentencePiece's visible space


def _decode_byte_level(text: str) -> bytes:
    """A BPE token's text -> its bytes (a character outside the byte map is spelled out as llama.cpp does)."""
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ch)
        if b is None:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8", "surrogateescape").hex().encode() + _utf8(text) + b"]"
        else:
            out.append(b)
    return bytes(out)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _clean_spaces(buf: bytearray) -> bytearray:
    """llama.cpp's detokenizer clean-up for BPE vocabs that ask for it: ' ?' ' !' ' .' ' ,' lose the space,
    a lone quote between spaces loses both, and " 's" " 'm" " 're" " 've" lose the space. Done in place over
    three passes exactly as llama.cpp does (including what earlier passes overwrite)."""

    def one_pass(step: Callable[[bytearray, int, int, int], tuple[int, int]]) -> None:
        size = len(buf)
        total = 1 if size else 0
        i = 1
        while i < size:
            total, i = step(buf, i, total, size)
            i += 1
        del buf[total:]

    def punctuation(b: bytearray, i: int, total: int, size: int) -> tuple[int, int]:
        x = b[i]
        if b[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        b[total] = x
        return total + 1, i

    def lone_quote(b: bytearray, i: int, total: int, size: int) -> tuple[int, int]:
        x = b[i]
        if x == 0x27 and i + 1 < size and b[i - 1] == 0x20 and b[i + 1] == 0x20:
            total -= 1
            i += 1
            b[i] = 0
        b[total] = x
        return total + 1, i

    def contraction(b: bytearray, i: int, total: int, size: int) -> tuple[int, int]:
        x = b[i]
        if b[i - 1] == 0x20 and x == 0x27 and i + 1 < size:
            x1 = b[i + 1]
            if x1 in b"sm" or (x1 not in b"td" and i + 2 < size and bytes((x1, b[i + 2])) in (b"re", b"ve")):
                total -= 1
        b[total] = x
        return total + 1, i

    for step in (punctuation, lone_quote, contraction):
        one_pass(step)
    return buf


# ---------------------------------------------------------------------------------------------------------
# GGUF metadata


def special_token_id(metadata: Mapping[str, Any], key: str, n_vocab: int) -> int | None:
    """The token id stored at ``tokenizer.ggml.<key>`` (None when absent); a TokenizerError when it is not an id of
    the vocabulary (not an integer, negative, or not below ``n_vocab``)."""
    value = metadata.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_vocab:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise TokenizerError(f"tokenizer.ggml.{key} = {shown} is not a token id of the vocabulary (0..{n_vocab - 1})")
    return int(value)


#: the keys a tokenizer reads: the vocabulary's, and the model's name (llama.cpp sets token attributes by it)
TOKENIZER_KEYS = ("tokenizer.", "general.name")
#: model names (lower case, contained) whose special tokens take RSTRIP in llama.cpp
_RSTRIP_MODEL_NAMES = ("phi-3", "phi3")
#: the characters C's isspace() takes (llama.cpp strips these bytes)
_C_SPACES = " \t\n\v\f\r"


def gguf_metadata(
    source: str | os.PathLike[str] | GGUFContainer | gguf.GGUFReader | Mapping[str, gguf.ReaderField],
    prefix: str | tuple[str, ...] = TOKENIZER_KEYS,
) -> dict[str, Any]:
    """The GGUF key/values whose keys start with ``prefix``, as plain Python values, of a file (a path or an open
    :class:`GGUFContainer`, e.g. a ``ModelFile``), of a ``gguf.GGUFReader`` or of a mapping of its fields. Strings
    are decoded with ``surrogateescape`` so that token texts keep their exact bytes."""
    if isinstance(source, str | os.PathLike):
        source = GGUFContainer(source)
    if isinstance(source, GGUFContainer):
        return source.metadata(prefix)
    out: dict[str, Any] = {}
    fields = source.fields if isinstance(source, gguf.GGUFReader) else source
    for key, field in fields.items():
        if not key.startswith(prefix) or not field.types:
            continue
        if field.types[-1] == gguf.GGUFValueType.STRING:
            texts = [field.parts[i].tobytes().decode("utf-8", "surrogateescape") for i in field.data]
            out[key] = texts if field.types[0] == gguf.GGUFValueType.ARRAY else texts[0]
        else:
            out[key] = field.contents()
    return out


class Tokenizer:
    """llama.cpp-exact tokenizer for ``gpt2`` (byte-level BPE) and ``llama`` (SentencePiece) vocabularies."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        """Build from GGUF tokenizer metadata (keys as in the file: ``tokenizer.ggml.tokens``, ...)."""

        def get(key: str, default: Any = None) -> Any:
            return metadata.get(f"tokenizer.ggml.{key}", default)

        self.model = get("model")
        pre_name = get("pre") or "default"
        self.clean_spaces = False
        self.ignore_merges = False
        self._pre: _PreTokenizer | None = None
        self._merge_ranks: dict[tuple[str, str], int] = {}
        if self.model == "gpt2":
            if pre_name not in PRE_TOKENIZERS:
                raise TokenizerError(f"unknown pre-tokenizer type: {pre_name!r}")
            self._pre = PRE_TOKENIZERS[pre_name]
            self.clean_spaces, self.ignore_merges = self._pre.clean_spaces, self._pre.ignore_merges
            self.add_space_prefix, self.add_bos, self.add_eos = False, self._pre.add_bos, False
            bos, unk = 11, None
            if get("merges") is None:
                raise TokenizerError("cannot find tokenizer merges in model file")
            for rank, merge in enumerate(get("merges")):
                cut = merge.find(" ", 1)
                pair = (merge[:cut], merge[cut + 1 :]) if cut >= 0 else ("", "")
                self._merge_ranks.setdefault(pair, rank)
        elif self.model == "llama":
            self.add_space_prefix, self.add_bos, self.add_eos = True, True, False
            bos, unk = 1, 0
        else:
            raise TokenizerError(f"unsupported tokenizer model: {self.model!r} (supported: gpt2, llama)")
        self.pre = pre_name if self.model == "gpt2" else "default"
        self.add_space_prefix = bool(get("add_space_prefix", self.add_space_prefix))

        texts = get("tokens")
        if not texts:
            raise TokenizerError("cannot find tokenizer vocab in model file")
        n = len(texts)
        scores = get("scores")
        types = get("token_type")
        if types is None and self.model == "llama":
            raise TokenizerError("tokenizer.ggml.token_type is missing: a SentencePiece vocabulary needs it")
        for key, values in (("scores", scores), ("token_type", types)):
            if values is not None and len(values) < n:
                raise TokenizerError(f"tokenizer.ggml.{key} has {len(values)} entries for {n} tokens")
        self._texts: list[str] = [text or f"[EMPTY_{i}]" for i, text in enumerate(texts)]
        self._scores: list[float] = [float(x) for x in scores[:n]] if scores is not None else [0.0] * n
        self._attrs: list[int] = (
            [_TYPE_TO_ATTR.get(int(t), 0) for t in types[:n]] if types is not None else [_NORMAL] * n
        )
        for i, attr in enumerate(self._attrs):
            if attr & _BYTE and not re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", self._texts[i]):
                raise TokenizerError(f"token {i} is a BYTE token but its text {self._texts[i]!r} is not <0xNN>")
        self._token_to_id: dict[str, int] = {text: i for i, text in enumerate(self._texts)}
        if len(self._token_to_id) != n:
            seen: dict[str, int] = {}
            for i, text in enumerate(self._texts):
                if text in seen:
                    raise TokenizerError(f"duplicate token in vocabulary: {text!r} has ids {seen[text]} and {i}")
                seen[text] = i

        def special_id(keys: Iterable[str], default: int | None) -> int | None:
            found = [i for i in (special_token_id(metadata, key, n) for key in keys) if i is not None]
            if found:  # the last key given wins (the FIM ids have deprecated names too)
                return found[-1]
            return default if default is not None and default < n else None

        self.bos_id = special_id(("bos_token_id",), bos)
        self.eos_id = special_id(("eos_token_id",), None)
        self.unk_id = special_id(("unknown_token_id",), unk)
        self.add_bos = bool(get("add_bos_token", self.add_bos))
        self.add_eos = bool(get("add_eos_token", self.add_eos))
        for flag, token in (("add_bos_token", self.bos_id), ("add_eos_token", self.eos_id)):
            if getattr(self, flag.removesuffix("_token")) and token is None:
                raise TokenizerError(f"tokenizer.ggml.{flag} is true, but its token id is not set")
        self._eog_ids = self._apply_overrides({kind: special_id(_ID_KEYS[kind], None) for kind in _ID_KEYS})
        if not self._eog_ids:
            raise TokenizerError("no end-of-generation token: tokenizer.ggml.eos_token_id is missing")

        # tokens matched as a whole in raw text, longest first
        self._special_cache = sorted(
            (i for i, attr in enumerate(self._attrs) if attr & _CACHED_ATTRS),
            key=lambda i: (-len(_utf8(self._texts[i])), i),
        )
        # llama.cpp's token attribute by model name: a Phi-3 strips the whitespace after its special tokens and
        # </s>, but not after <unk>, <s> and <|endoftext|> (llama_vocab::impl::load, RSTRIP)
        self._rstrip: frozenset[int] = frozenset()
        if any(name in str(metadata.get("general.name", "")).lower() for name in _RSTRIP_MODEL_NAMES):
            ids = {*self._special_cache, *(self._token_to_id[t] for t in ("</s>",) if t in self._token_to_id)}
            self._rstrip = frozenset(ids - {self._token_to_id.get(t) for t in ("<unk>", "<s>", "<|endoftext|>")})
        self._pieces: dict[int, bytes] = {}
        self._bpe_cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | GGUFContainer | gguf.GGUFReader) -> Tokenizer:
        """Build from a GGUF file path, an open :class:`GGUFContainer` / ``ModelFile`` or a ``gguf.GGUFReader``."""
        return cls(gguf_metadata(source))

    def _apply_overrides(self, ids: dict[str, int | None]) -> frozenset[int]:
        """llama.cpp's load-time token fix-ups; returns the end-of-generation ids."""
        attrs, present = self._attrs, self._token_to_id
        for kind, texts in _DETECTED_KINDS:
            found = sorted(present[text] for text in texts if text in present)
            if ids[kind] is None and found:
                ids[kind] = found[0]
                attrs[found[0]] |= _CONTROL_ATTR
        eog = {ids[kind] for kind in ("fim_pad", "fim_rep", "fim_sep") if ids[kind] is not None}
        for text in _EOG_TEXTS & present.keys():
            eog.add(present[text])
            attrs[present[text]] |= _CONTROL_ATTR
        for text in _ALWAYS_RENDERED & present.keys():
            attrs[present[text]] = _USER_DEFINED
        eog |= {i for i in (self.eos_id, ids["eot"], ids["eom"]) if i is not None}
        by_text = {self._texts[i]: i for i in eog}
        # harmony-style vocabularies: <|end|> ends a message, not the generation
        has_call = "<|call|>" in by_text or "<|calls|>" in by_text
        if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
            eog.discard(by_text["<|end|>"])
            attrs[by_text["<|end|>"]] = _USER_DEFINED
        if "</s>" in by_text and "<|tool_response>" in by_text:
            eog.discard(by_text["</s>"])
            attrs[by_text["</s>"]] = _NORMAL
        return frozenset(eog)

    # --- vocabulary -----------------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._texts)

    def token_text(self, token: int) -> str:
        """The vocabulary text of ``token`` (BPE tokens in GPT-2's byte characters, SPM ones with U+2581)."""
        return self._texts[token]

    def token_attr(self, token: int) -> TokenAttr:
        return TokenAttr(self._attrs[token])

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary text is ``text``, or None."""
        return self._token_to_id.get(text)

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, <|im_end|>-like tokens, FIM pad/repo/sep)."""
        return token in self._eog_ids

    @property
    def eog_ids(self) -> frozenset[int]:
        return self._eog_ids

    # --- encoding -------------------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """``llama_tokenize``: BOS/EOS as the vocab's flags say when ``add_special``; control tokens written in
        the text become single tokens only with ``parse_special`` (user-defined ones always do)."""
        output: list[int] = []
        if add_special and self.add_bos:
            output.append(self.bos_id)
        prev_special = True
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                output.append(fragment)
                prev_special = True
            elif self.model == "gpt2":
                output.extend(self._encode_bpe(fragment))
            else:
                prefix = " " if self.add_space_prefix and prev_special else ""
                output.extend(self._encode_spm((prefix + fragment).replace(" ", _SPACE_ESCAPE)))
                prev_special = False
        if add_special and self.add_eos:
            output.append(self.eos_id)
        return output

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut whole special tokens out of ``text`` (longest token texts first), keeping the text between (without
        its leading whitespace after a token with RSTRIP)."""
        fragments: list[str | int] = [text] if text else []
        for token in self._special_cache:
            special = self._texts[token]
            if (not parse_special and self._attrs[token] & _SPECIAL_ATTRS) or special not in text:
                continue
            split: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or special not in fragment:
                    split.append(fragment)
                    continue
                for k, piece in enumerate(fragment.split(special)):
                    if k:
                        split.append(token)
                        piece = piece.lstrip(_C_SPACES) if token in self._rstrip else piece
                    if piece:
                        split.append(piece)
            fragments = split
        return fragments

    def _encode_bpe(self, text: str) -> list[int]:
        spans: Spans = [(0, len(text))]
        flags = [_cpt_flags(ch) for ch in text]
        for stage in self._pre.stages:
            spans = stage(text, flags, spans)
        output: list[int] = []
        for start, end in spans:
            word = "".join(_BYTE_TO_CHAR[b] for b in _utf8(text[start:end]))
            ids = self._bpe_cache.get(word)
            if ids is None:
                if len(self._bpe_cache) > 1 << 16:
                    self._bpe_cache.clear()
                ids = self._bpe_cache[word] = tuple(self._bpe_word(word))
            output.extend(ids)
        return output

    def _bpe_word(self, word: str) -> list[int]:
        """Merge one byte-encoded word by rank (lowest first, leftmost first) and map the pieces to ids."""
        if self.ignore_merges and word in self._token_to_id:
            return [self._token_to_id[word]]
        pieces = _merge(list(word), lambda a, b: self._merge_ranks.get((a, b)))
        output = []
        for piece in pieces:
            token = self._token_to_id.get(piece)
            if token is not None:
                output.append(token)
            else:  # a piece without token: its bytes one by one, where a one-byte text is a token
                singles = (self._token_to_id.get(bytes((b,)).decode("utf-8", "surrogateescape")) for b in _utf8(piece))
                output.extend(t for t in singles if t is not None)
        return output

    def _encode_spm(self, text: str) -> list[int]:
        """Merge adjacent pieces while the merged text is a token (highest score first, leftmost first); a
        piece that is no token (only single characters can be) becomes its <0xNN> byte tokens."""

        def priority(a: str, b: str) -> float | None:
            token = self._token_to_id.get(a + b)
            return None if token is None else -self._scores[token]

        output = []
        for piece in _merge(list(text), priority):
            token = self._token_to_id.get(piece)
            output.extend([token] if token is not None else (self._byte_token(b) for b in _utf8(piece)))
        return output

    def _byte_token(self, byte: int) -> int:
        token = self._token_to_id.get(f"<0x{byte:02X}>")
        if token is None and byte < 128:
            token = self._token_to_id.get(chr(byte))
        if token is None:
            raise TokenizerError(f"the vocabulary has no token for byte 0x{byte:02X}")
        return token

    # --- decoding -------------------------------------------------------------------------------------------

    def token_to_piece(self, token: int, unparse_special: bool = True, lstrip: bool = False) -> bytes:
        """The bytes ``token`` stands for (``llama_token_to_piece``): control/unknown tokens give nothing
        unless ``unparse_special``; ``lstrip`` drops one leading space."""
        if not unparse_special and self._attrs[token] & _SPECIAL_ATTRS:
            return b""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(self._texts[token], self._attrs[token])
        return piece[1:] if lstrip and piece.startswith(b" ") else piece

    def _piece(self, text: str, attr: int) -> bytes:
        if attr & _CACHED_ATTRS:
            return _utf8(text)
        if attr & _NORMAL:
            return _decode_byte_level(text) if self.model == "gpt2" else _utf8(text.replace(_SPACE_ESCAPE, " "))
        if attr & _BYTE:
            return bytes((int(text[3:5], 16),))
        return b""

    def decode_bytes(self, ids: Sequence[int], remove_special: bool = False, unparse_special: bool = True) -> bytes:
        """``llama_detokenize`` as bytes (may end inside a UTF-8 character)."""
        ids = list(ids)
        strip_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            strip_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        out = bytearray()
        for k, token in enumerate(ids):
            out += self.token_to_piece(token, unparse_special, lstrip=strip_space and k == 0)
        return bytes(_clean_spaces(out) if self.clean_spaces else out)

    def decode(self, ids: Sequence[int], remove_special: bool = False, unparse_special: bool = True) -> str:
        """``llama_detokenize``: ``remove_special`` drops a leading BOS / trailing EOS the vocab adds;
        ``unparse_special`` renders control tokens as their text. Invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")

    def detokenizer(self, unparse_special: bool = True) -> StreamDetokenizer:
        """A streaming detokenizer for generated ids (pieces as ``token_to_piece``, no dummy-space strip)."""
        return StreamDetokenizer(self, unparse_special)


def _merge(symbols: list[str], priority: Callable[[str, str], float | None]) -> list[str]:
    """Repeatedly merge the adjacent pair with the lowest ``priority`` (ties: leftmost) until no pair has one.
    Entries whose pieces have changed since they were queued are skipped, as in llama.cpp's work queue."""
    n = len(symbols)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    queue: list[tuple[float, int, int, int]] = []

    def push(left: int, right: int) -> None:
        if left >= 0 and right < n:
            p = priority(symbols[left], symbols[right])
            if p is not None:
                heapq.heappush(queue, (p, left, right, len(symbols[left]) + len(symbols[right])))

    for i in range(n - 1):
        push(i, i + 1)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not symbols[left] or not symbols[right] or len(symbols[left]) + len(symbols[right]) != size:
            continue
        symbols[left] += symbols[right]
        symbols[right] = ""
        nxt[left] = nxt[right]
        if nxt[left] < n:
            prv[nxt[left]] = left
        push(prv[left], left)
        push(left, nxt[left])
    return [s for s in symbols if s]


class StreamDetokenizer:
    """Turns generated ids into text pieces as they come, never splitting a UTF-8 character: bytes of an
    unfinished character are held back until the next token completes them (or ``flush``)."""

    def __init__(self, tokenizer: Tokenizer, unparse_special: bool = True) -> None:
        self.tokenizer = tokenizer
        self.unparse_special = unparse_special
        self._pending = bytearray()

    def push(self, token: int) -> str:
        """Add one token; returns the text that is now complete (possibly empty)."""
        self._pending += self.tokenizer.token_to_piece(token, self.unparse_special)
        cut = _complete_utf8_prefix(self._pending)
        text = self._pending[:cut].decode("utf-8", "replace")
        del self._pending[:cut]
        return text

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character becomes U+FFFD)."""
        text = self._pending.decode("utf-8", "replace")
        self._pending.clear()
        return text

    def feed(self, tokens: Iterable[int]) -> Iterator[str]:
        """Push ``tokens`` one by one, yielding every non-empty piece, and finally what ``flush`` returns."""
        for token in tokens:
            if text := self.push(token):
                yield text
        if text := self.flush():
            yield text


def _complete_utf8_prefix(buf: bytes | bytearray) -> int:
    """Length of ``buf`` without a trailing, still incomplete UTF-8 sequence."""
    for back in range(1, min(4, len(buf)) + 1):
        lead = buf[-back]
        if lead & 0xC0 == 0x80:
            continue  # continuation byte: keep looking for the lead
        need = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if 0xF0 <= lead <= 0xF4 else 1
        return len(buf) - back if need > back else len(buf)
    return len(buf)
