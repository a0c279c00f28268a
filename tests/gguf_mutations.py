"""Mutated GGUF files for the fuzzers: truncations, byte flips in every region of the file, lies told in the header's
own fields (counts, lengths, dims, offsets, types) and lies told through a rewritten model (keys, vocabulary,
hyper-parameters, chat template, tensors). Every case is made from a seed alone, so any one can be replayed."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from tiny_models import model_parts, write_model

_SCALAR_SIZE = {V.UINT8: 1, V.INT8: 1, V.BOOL: 1, V.UINT16: 2, V.INT16: 2, V.UINT32: 4, V.INT32: 4, V.FLOAT32: 4}
_SCALAR_SIZE.update({V.UINT64: 8, V.INT64: 8, V.FLOAT64: 8})
#: (architecture, 2-D weight type) of the models the mutations start from
BASES = [("llama", T.Q4_0), ("qwen2", T.Q8_0), ("llama", T.F16), ("qwen2", T.Q4_1), ("llama", T.Q5_0)]
NASTY_TEMPLATES = [
    "{% for i in range(10**9) %}x{% endfor %}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{{ 'a' * 10**10 }}",
    "{{ messages[0]['content'] * 100000000 }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{{ raise_exception('no') }}",
    "{{ 1 / 0 }}",
    "{{ messages|map(attribute='x')|join|int(base=99) }}",
    "{% for m in messages %}{{ m.content|center(10**12) }}{% endfor %}",
    "{{ '%999999999s' % 'x' }}",
    "{{ (2 ** 64) ** 64 }}",
    "{% if",
    "{{ undefined_thing.x.y }}",
    "{{ messages.__class__.__mro__ }}",
    "{{ bos_token[10**9] }}",
    "",
]


@dataclass(frozen=True)
class Field:
    """A header field: where it is, its width, what it is."""

    offset: int
    size: int
    kind: str  # count | length | type | dims | offset | value


@dataclass(frozen=True)
class Layout:
    """The regions of a GGUF file and its header fields."""

    regions: dict[str, tuple[int, int]]
    fields: list[Field]


def layout(data: bytes) -> Layout:
    """Walk a valid GGUF v3 file (as written by gguf-py): its regions and fields."""
    fields = [Field(8, 8, "count"), Field(16, 8, "count")]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string() -> None:
        nonlocal pos
        fields.append(Field(pos, 8, "length"))
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]

    def value(vtype: int, kind: str) -> None:
        nonlocal pos
        if vtype == V.STRING:
            string()
        else:
            fields.append(Field(pos, _SCALAR_SIZE[V(vtype)], kind))
            pos += _SCALAR_SIZE[V(vtype)]

    for _ in range(n_kv):
        string()
        fields.append(Field(pos, 4, "type"))
        vtype = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if vtype != V.ARRAY:
            value(vtype, "value")
            continue
        fields += [Field(pos, 4, "type"), Field(pos + 4, 8, "count")]
        item, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        for _ in range(count):
            value(item, "item")
    kv_end = pos
    for _ in range(n_tensors):
        string()
        fields.append(Field(pos, 4, "dims"))
        n_dims = struct.unpack_from("<I", data, pos)[0]
        fields += [Field(pos + 4 + 8 * i, 8, "dims") for i in range(n_dims)]
        pos += 4 + 8 * n_dims
        fields += [Field(pos, 4, "type"), Field(pos + 4, 8, "offset")]
        pos += 12
    data_start = -(-pos // 32) * 32
    regions = {
        "preamble": (0, 24),
        "metadata": (24, kv_end),
        "tensor_infos": (kv_end, pos),
        "padding": (pos, max(pos + 1, data_start)),
        "data": (data_start, len(data)),
    }
    return Layout(regions, [f for f in fields if f.kind != "item"])  # array items: the byte flips reach them


def _lie(rng: random.Random, original: int, size: int) -> int:
    top = (1 << (8 * size)) - 1
    choices = [0, 1, 2, 3, top, top >> 1, (top >> 1) + 1, original + 1, original - 1, original * 2, original * 1000]
    if size >= 4:
        choices += [0xFFFF, 0x10000, 1 << 31, 255]
    return rng.choice(choices) & top


def mutate_bytes(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """One byte-level mutation of ``data``: (description, mutated bytes)."""
    lay = layout(data)
    kind = rng.choice(["truncate", "flip", "flip", "lie", "lie", "lie"])
    if kind == "truncate":
        region = rng.choice(list(lay.regions))
        lo, hi = lay.regions[region]
        cut = rng.randrange(lo, max(lo + 1, hi))
        return f"truncate at {cut} ({region})", data[:cut]
    buf = bytearray(data)
    if kind == "flip":
        region = rng.choice(list(lay.regions))
        lo, hi = lay.regions[region]
        hi = min(max(lo + 1, hi), len(buf))
        spots = [rng.randrange(lo, hi) for _ in range(rng.choice([1, 1, 2, 4, 16]))]
        for at in spots:
            buf[at] ^= rng.randrange(1, 256)
        return f"flip {len(spots)} byte(s) in {region}", bytes(buf)
    what = rng.choice(sorted({f.kind for f in lay.fields}))
    field = rng.choice([f for f in lay.fields if f.kind == what])
    fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[field.size]
    original = struct.unpack_from(fmt, buf, field.offset)[0]
    value = _lie(rng, original, field.size)
    struct.pack_into(fmt, buf, field.offset, value)
    return f"{what} field at {field.offset}: {original} -> {value}", bytes(buf)


def _odd_value(rng: random.Random) -> object:
    return rng.choice(
        [0, 1, 2, 7, 3.5, -1.0, 2**31 - 1, 2**32 - 1, 10**6, float("nan"), float("inf"), "x", True, [1, 2]]
    )


def rewrite(rng: random.Random, path: Path, arch: str, weights: T) -> str:
    """Write at ``path`` a model that lies through its content; returns what it changed."""
    meta, tensors = model_parts(arch, seed=rng.randrange(100))
    kind = rng.choice(["key", "vocab", "hparam", "template", "template", "tensor"])
    kv: dict = {}
    drop: tuple[str, ...] = ()
    changed: dict = {}
    if kind == "key":
        key = rng.choice(sorted(meta))
        if rng.random() < 0.5:
            drop = (key,)
        else:
            kv = {key: None, key[:-1] + rng.choice("xyz._"): meta[key]}
        what = f"key {key}: {'dropped' if drop else 'renamed'}"
    elif kind == "vocab":
        tokens = list(meta["tokenizer.ggml.tokens"])
        lie = rng.choice(["duplicate", "short", "empty", "types", "merges", "scores", "special", "pre"])
        if lie == "duplicate":
            tokens[rng.randrange(len(tokens))] = tokens[rng.randrange(len(tokens))]
            kv = {"tokenizer.ggml.tokens": tokens}
        elif lie == "short":
            kv = {"tokenizer.ggml.tokens": tokens[: rng.randrange(1, len(tokens))]}
        elif lie == "empty":
            kv = {"tokenizer.ggml.tokens": [""] * len(tokens)}
        elif lie == "types":
            kv = {"tokenizer.ggml.token_type": [rng.randrange(0, 10) for _ in tokens]}
        elif lie == "merges":
            kv = {"tokenizer.ggml.merges": ["", " ", "a", "Ġ Ġ Ġ", "\x00 \x00"]}
        elif lie == "scores":
            kv = {"tokenizer.ggml.scores": [float("nan")] * rng.randrange(len(tokens) + 2)}
        elif lie == "special":
            key = rng.choice(["bos", "eos", "unknown", "eot", "padding"]) + "_token_id"
            kv = {f"tokenizer.ggml.{key}": rng.choice([len(tokens), 2**32 - 1, "1", 1.5, 0])}
        else:
            kv = {"tokenizer.ggml.pre": rng.choice(["no-such-pre", "", "llama3", "gpt-2"])}
        what = f"vocab: {lie}"
    elif kind == "hparam":
        key = rng.choice([k for k in meta if k.startswith(f"{arch}.")])
        kv = {key: _odd_value(rng)}
        what = f"hparam {key} = {kv[key]!r}"
    elif kind == "template":
        source = meta["tokenizer.chat_template"]
        if rng.random() < 0.5:
            source = rng.choice(NASTY_TEMPLATES)
        else:
            at = rng.randrange(len(source))
            source = source[:at] + rng.choice(["{{", "}}", "{%", "%}", "'", "\\", "{# ", "|", ""]) + source[at + 1 :]
        kv = {"tokenizer.chat_template": source}
        what = f"template {source[:40]!r}"
    else:
        name = rng.choice(sorted(tensors))
        lie = rng.choice(["drop", "shape", "extra", "nan"])
        if lie == "drop":
            changed = {name: None}
        elif lie == "shape":
            changed = {name: np.zeros(tuple(d * 2 for d in tensors[name].shape), np.float32)}
        elif lie == "extra":
            changed = {f"blk.9.{name}": tensors[name]}
        else:
            bad = tensors[name].copy()
            bad.flat[rng.randrange(bad.size)] = rng.choice([np.nan, np.inf, -np.inf])
            changed = {name: bad}
        what = f"tensor {name}: {lie}"
    write_model(path, arch, weights, kv=kv, tensors=changed, drop=drop)
    return what


def make_case(seed: int, case: int, base_files: dict[tuple[str, T], bytes], path: Path) -> str:
    """Write mutated case ``case`` of run ``seed`` at ``path``; returns what was done."""
    rng = random.Random(seed * 1_000_003 + case)
    arch, weights = rng.choice(BASES)
    if rng.random() < 0.3:
        return f"{arch}/{weights.name} " + rewrite(rng, path, arch, weights)
    what, data = mutate_bytes(rng, base_files[(arch, weights)])
    path.write_bytes(data)
    return f"{arch}/{weights.name} {what}"
