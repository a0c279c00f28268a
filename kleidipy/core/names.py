"""Decoder for KleidiAI micro-kernel and packer names, field by field and token by token, in today's spelling and in
KleidiAI's early one.

The grammar it reads: docs/kernel-names.md."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, replace
from itertools import islice

from kleidipy.core.buffers import SVL_CHOICES, check_svl
from kleidipy.errors import KleidipyError


class KernelNameError(KleidipyError, ValueError):
    """A name that is not a KleidiAI matmul kernel or packer name."""


@dataclass(frozen=True)
class Field:
    """One ``_``-separated field of a name: its role and the tokens it is made of."""

    text: str  # in today's spelling
    role: str
    parts: tuple[tuple[str, str], ...]
    spelled: str = ""  # as the name spells it, when that is a legacy spelling

    @property
    def simple(self) -> bool:
        """A field that is a single token (``f32``, ``sme2``): shown on one line."""
        return len(self.parts) == 1 and self.parts[0][0] == self.text

    @property
    def label(self) -> str:
        """The role, and the legacy spelling the name used for this field."""
        return f"{self.role} (legacy spelling {self.spelled!r})" if self.spelled else self.role


# --------------------------------------------------------------------------------------------- vocabulary

_ENGINES = {
    "neon": "Arm Advanced SIMD (NEON), 128-bit vectors",
    "sve": "SVE, scalable vectors (llama.cpp uses its SVE kernels only at a 256-bit vector length)",
    "sve2": "SVE2, scalable vectors",
    "sve2p1": "SVE2.1, scalable vectors",
    "sme": "SME: streaming SVE mode with the ZA matrix storage, vectors of SVL bits",
    "sme2": "SME2: SME plus multi-vector instructions and the ZT0 lookup table (LUTI4)",
    "sme2p1": "SME2.1",
}
_UARCH = {"cortexa55": "scheduled for the Cortex-A55 micro-architecture"}

#: element type: (short name, meaning)
_TYPES = {
    "f32": ("f32", "32-bit IEEE floats"),
    "f16": ("fp16", "16-bit IEEE floats (fp16)"),
    "bf16": ("bf16", "bfloat16 (float32's exponent, 8-bit significand)"),
    "f64": ("f64", "64-bit IEEE floats"),
    "i32": ("int32", "signed 32-bit integers"),
    "i16": ("int16", "signed 16-bit integers"),
    "i8": ("int8", "signed 8-bit integers"),
    "u8": ("uint8", "unsigned 8-bit integers"),
    "i4": ("int4", "signed 4-bit integers, two per byte"),
    "u4": ("uint4", "unsigned 4-bit codes 0..15, two per byte (the kernels use u - 8)"),
    "i2": ("int2", "signed 2-bit integers, four per byte"),
    "u2": ("uint2", "unsigned 2-bit codes, four per byte"),
    "x32": ("32-bit", "any 32-bit element type (moved, not converted)"),
    "x16": ("16-bit", "any 16-bit element type (moved, not converted)"),
    "x8": ("8-bit", "any 8-bit element type (moved, not converted)"),
    "4": ("4-bit", "4-bit integers, two per byte (legacy spelling: rhs_zero_point 8 or 0 says unsigned or signed)"),
}
#: quantization axis: (short name, meaning)
_AXES = {
    "dx": ("per-row", "one scale and zero point per row, computed from the data when packing (per dimension)"),
    "cx": ("per-channel", "one scale per output channel (per RHS row = dst column)"),
    "d32": (
        "per-row, per-32-block",
        "one scale per row for each block of 32 K values (block length bl a multiple of 32), "
        "computed from the data when packing",
    ),
    "c32": (
        "per-channel, per-32-block",
        "one scale per output channel for each block of 32 K values (bl a multiple of 32)",
    ),
    "c16": (
        "per-channel, per-16-block",
        "one scale (and offset) per output channel for each block of 16 K values (kleidipy's own exact-weight format)",
    ),
}
_ORDERS = {
    "s1s0": "nibble order sequential: byte j holds element 2j (low nibble) and 2j+1 (high nibble)",
    "s0s1": "nibble order swapped: byte j holds element 2j in its high nibble and 2j+1 in its low nibble",
    "s16s0": "nibble order interleaved by 16: byte j of a 32-value block holds element j (low) and j+16 (high), "
    "GGML's Q4_0/Q4_1 order",
    "s4s0": "nibble order interleaved by 4: in each 8-value group byte j holds element j (low) and j+4 (high)",
    "s32s0": "nibble order interleaved by 32: byte j holds element j (low) and j+32 (high)",
}
#: KleidiAI's early spelling of a whole ``_``-separated piece
_LEGACY_WORDS = {"clip": "clamp"}
#: early packed quantized buffers have no signedness letter: packed data is signed (``qa8dxp`` is ``qai8dxp``)
_LEGACY_PACKED_WIDTH = re.compile(r"^(q[as])(\d+)(?=(?:cx|dx|d32|c32|c16)?p)")

_SIZE = r"(?:\d+vl|\d+vs|\d+|mr|nr)"
_TILE_RE = re.compile(rf"^({_SIZE})x({_SIZE})(?:x(\d+))?$")
_DESCRIPTOR_RE = re.compile(r"^(?P<quant>q[as])?(?P<type>bf16|[fiux]\d+|\d+)(?P<axis>cx|dx|d32|c32|c16)?")
_OP_RE = re.compile(
    r"^(?:(?P<mm>i?matmul)(?P<clamp>_clamp)?"
    r"|(?P<lhs>lhs)_(?P<lq>quant_)?pack"
    r"|(?P<rhs>rhs)_(?P<rq>quant_)?pack_(?P<orient>nxk|kxn))_"
)


# --------------------------------------------------------------------------------------------- sizes


class _Lanes:
    """How many elements ``n vl`` / ``n vs`` stand for, stated for one SVL or for the common ones."""

    def __init__(self, svl_bits: int | None, engine: str | None) -> None:
        self.svl_bits = None if svl_bits is None else check_svl(svl_bits)
        self.what = "SVE VL" if engine and engine.startswith("sve") else "SVL"

    def _count(self, n: int, per: int, unit: str) -> str:
        if self.svl_bits is not None:
            return f"{n * self.svl_bits // per} {unit} at {self.what} {self.svl_bits}"
        times = "" if n == 1 else f"{n} x "
        examples = "/".join(str(n * s // per) for s in SVL_CHOICES[:4])
        svls = "/".join(str(s) for s in SVL_CHOICES[:4])
        return f"{times}{self.what}/{per} {unit} ({examples} at {self.what} {svls})"

    def size(self, token: str, unit: str) -> str:
        """``token`` (``16``, ``4vl``, ``2vs``, ``mr``, ``nr``) as a count of ``unit``."""
        if token in ("mr", "nr"):
            return f"{token} {unit} (a run-time argument: the matmul kernel's {token})"
        if token.endswith("vl"):
            return f"{token[:-2]} VL = {self._count(int(token[:-2]), 32, unit)}"
        if token.endswith("vs"):
            return f"{token[:-2]} VS = {self._count(int(token[:-2]), 128, unit)}"
        return f"{token} {unit[:-1] if token == '1' else unit}"

    def header(self) -> str | None:
        if self.svl_bits is None:
            return None
        return f"{self.what} {self.svl_bits} bits: 1 VL = {self.svl_bits // 32} 32-bit lanes"


# --------------------------------------------------------------------------------------------- operands


def _scalar_suffix(rest: str) -> tuple[str, str] | None:
    """A scale/bias suffix at the start of ``rest``: (token, meaning)."""
    m = re.match(r"(scale|bias)(bf16|f16|f32)", rest)
    if m:
        kind = "scales" if m[1] == "scale" else "biases (one per output column)"
        return m[0], f"{_TYPES[m[2]][0]} {kind} stored in the packed buffer (legacy spelling)"
    m = re.match(r"(s|b)(bf16|f16|f32|i32|x32)", rest)
    if m:
        kind = "scales" if m[1] == "s" else "biases (one per output column)"
        return m[0], f"{_TYPES[m[2]][0]} {kind} stored in the packed buffer"
    if rest.startswith("sb"):
        return "sb", "scales (and biases where the format has them) stored in the packed buffer (legacy, untyped)"
    if rest.startswith("b"):
        return "b", "biases, one per output column, at the start of each packed group (legacy untyped 'b')"
    return None


def _operand(m: re.Match[str], side: str, lanes: _Lanes, is_folder: bool) -> list[tuple[str, str]]:
    """Tokens of one operand descriptor (``m``: its :data:`_DESCRIPTOR_RE` match). ``side`` is "LHS" or "RHS"
    for a matmul operand, "" otherwise; ``is_folder`` for the buffers of a folder name, which give no layout."""
    text = m.string
    parts: list[tuple[str, str]] = []
    if m["quant"]:
        parts.append(("q", "quantized: small integers with scale factors"))
        if m["quant"][1] == "s":
            parts.append(("s", "symmetric: value = scale x q, no zero point"))
        else:
            parts.append(("a", "asymmetric: value = scale x (q - zero point), or scale x q + offset"))
    parts.append((m["type"], _TYPES[m["type"]][1]))
    if m["axis"]:
        parts.append((m["axis"], _AXES[m["axis"]][1]))
    unit, width_name = ("columns", "nr") if side == "RHS" else ("rows", "mr" if side == "LHS" else "width")
    rest = text[m.end() :]
    packed_at = None
    has_layout = False
    while rest:
        order = re.match(r"s1s0|s0s1|s4s0|s16s0|s32s0", rest)
        layout = re.match(rf"({_SIZE})x(\d+)", rest)
        superblock = re.match(r"k(\d+)", rest)
        suffix = _scalar_suffix(rest)
        if rest[0] == "p":
            packed_at = len(parts)
            parts.append(("p", "packed: rearranged into the micro-kernel's interleaved layout"))
            rest = rest[1:]
        elif order:
            parts.append((order[0], _ORDERS[order[0]]))
            rest = rest[order.end() :]
        elif layout:
            has_layout = True
            size = lanes.size(layout[1], unit)
            if layout[1] != width_name:
                size = f"{width_name} = {size}"
            parts.append((layout[1], f"{size} interleaved per packed group"))
            parts.append(
                (
                    f"x{layout[2]}",
                    f"{layout[2]} consecutive K values of one {unit[:-1]} stored together per interleave "
                    "step (the block depth)",
                )
            )
            rest = rest[layout.end() :]
        elif superblock:
            parts.append((superblock[0], f"super-blocks of {superblock[1]} K values"))
            rest = rest[superblock.end() :]
        elif suffix:
            parts.append(suffix)
            rest = rest[len(suffix[0]) :]
        else:
            raise KernelNameError(f"unknown descriptor suffix {rest!r} in {text!r}")
    if packed_at is not None and not has_layout:
        if is_folder:
            group = "packed; each kernel of the folder names its own packed layout"
        else:
            group = "packed; the group sizes (mr or nr, kr, sr) are run-time arguments taken from the matmul kernel"
        parts[packed_at] = ("p", group)
    return parts


# --------------------------------------------------------------------------------------------- name fields


def _tile(m: re.Match[str], lanes: _Lanes) -> Field:
    parts = [
        (m[1], f"m_step = {lanes.size(m[1], 'dst rows')} per step"),
        (f"x{m[2]}", f"n_step = {lanes.size(m[2], 'dst columns')} per step"),
    ]
    if m[3]:
        parts.append((f"x{m[3]}", f"{m[3]} K values accumulated per inner-loop iteration (legacy third tile number)"))
    return Field(m[0], "tile: m_step x n_step, the block of dst computed per step", tuple(parts))


_TECHS = ("dot", "sdot", "dotprod", "i8mm", "mmla", "mla", "mopa", "fexpa", "mop4_mopa")


def _instruction(tech: str, engine: str, types: set[str]) -> str:
    integer = bool(types & {"i8", "i4", "u4", "4"})
    bf16 = "bf16" in types
    if tech == "mopa":
        if integer:
            return "SMOPA: 4-way int8 outer products accumulated into the ZA tiles (int32)"
        return "BFMOPA: bf16 outer products accumulated into the ZA tiles (f32)" if bf16 else "FMOPA outer products"
    if tech in ("dot", "sdot"):
        what = "SDOT: 4-way int8 dot products" if integer else "BFDOT: bf16 pair dot products" if bf16 else "FDOT"
        if engine == "sme2":
            what += ", multi-vector form accumulating into ZA vector groups"
        return what + (" ('sdot' is the legacy spelling of 'dot')" if tech == "sdot" else "")
    return {
        "dotprod": "FEAT_DotProd: SDOT, 4-way int8 dot products into int32 lanes",
        "i8mm": "FEAT_I8MM: SMMLA, int8 2x8 by 8x2 matrix multiply-accumulate",
        "mmla": "matrix multiply-accumulate (BFMMLA for bf16: 2x4 by 4x2)",
        "mla": "vector multiply-accumulate (FMLA)",
        "fexpa": "FEXPA exponential accelerator",
        "mop4_mopa": "quarter-tile outer products (MOP4A) and MOPA",
    }[tech]


def _split_tail(fields: list[str]) -> tuple[list[str], str | None, str | None, str | None]:
    """Peel ``[_engine][_tech][_uarch]`` off the end: (rest, engine, tech, uarch)."""
    rest = list(fields)
    uarch = rest.pop() if rest and rest[-1] in _UARCH else None
    if rest[-2:] == ["mop4", "mopa"]:
        rest[-2:] = ["mop4_mopa"]
    tech = rest.pop() if len(rest) >= 2 and rest[-2] in _ENGINES and rest[-1] in _TECHS else None
    engine = rest.pop() if rest and rest[-1] in _ENGINES else None
    return rest, engine, tech, uarch


def _operation(op: re.Match, engine: str | None) -> tuple[Field, list[str], list[str]]:
    """The operation field, plus the matmul side ("LHS"/"RHS"/"") and default role of each operand."""
    if op["mm"]:
        parts = [
            (
                op["mm"],
                "indirect matrix multiplication (LHS rows read through a table of pointers)"
                if op["mm"] == "imatmul"
                else "matrix multiplication: dst[m x n] = LHS[m x k] x RHS[k x n]",
            )
        ]
        if op["clamp"]:
            parts.append(("clamp", "the result is clamped to [scalar_min, scalar_max]"))
        sides = ["", "LHS", "RHS"]
        roles = ["destination dst (m x n)", "LHS operand (m x k, activations)", "RHS operand (k x n, weights)"]
    else:
        side = "LHS" if op["lhs"] else "RHS"
        if side == "LHS":
            parts = [("lhs", "LHS packer: prepares the left operand (activations, m x k) for a matmul kernel")]
        else:
            parts = [("rhs", "RHS packer: prepares the right operand (weights, n x k) once, for a matmul kernel")]
        if op["lq"] or op["rq"]:
            how = "quantizes the floats" if side == "LHS" else "converts the element type"
            parts.append(("quant", f"{how} while packing (legacy operation name)"))
        where = "" if engine else " (no engine suffix: portable C)"
        parts.append(("pack", f"writes the layout the matmul kernel reads{where}"))
        if op["orient"] == "nxk":
            parts.append(("nxk", "source is N x K: one row of K values per output column (GGML's weight layout)"))
        elif op["orient"] == "kxn":
            parts.append(("kxn", "source is K x N: row k holds the k-th weight of every output column"))
        sides = [side, ""]
        roles = [f"packed {side} (this packer's output)", f"{side} source (the packer's input)"]
    return Field(op[0].rstrip("_"), "operation", tuple(parts)), sides, roles


def _input_roles(n_extra: int, packed_parts: list[tuple[str, str]]) -> list[str]:
    """Roles of a packer's inputs after the main source, from KleidiAI's argument order."""
    if n_extra == 3:  # qai4c32 packers: (rhs, zero, bias, scale)
        return ["zero-point/offset input", "bias input", "scale input"]
    if n_extra == 1 and any("biases" in meaning for _, meaning in packed_parts):
        return ["bias input"]
    return ["additional input"] * n_extra


def _respell(piece: str) -> str:
    """One ``_``-separated piece of a name in today's spelling (itself when already current)."""
    piece = piece.lower()
    return _LEGACY_WORDS.get(piece) or _LEGACY_PACKED_WIDTH.sub(r"\1i\2", piece)


@dataclass(frozen=True)
class _Parsed:
    """A name (in today's spelling) cut into its fields, before they are explained."""

    prefix: tuple[str, ...]  # "kai", "run"
    op: re.Match[str]
    operands: list[re.Match[str]]  # each operand's _DESCRIPTOR_RE match (.string is the whole operand)
    tile: re.Match[str] | None
    engine: str | None
    tech: str | None
    uarch: str | None

    @property
    def is_folder(self) -> bool:
        """A matmul name without tile and engine names a KleidiAI folder, not a kernel."""
        return bool(self.op["mm"]) and not self.tile and not self.engine


def _parse(name: str) -> _Parsed:
    """Respell ``name`` the way KleidiAI writes names today and cut it into fields (KernelNameError if it cannot)."""
    text = "_".join(_respell(piece) for piece in name.strip().split("_"))
    prefix = []
    for word in ("kai", "run"):
        if text.startswith(f"{word}_"):
            prefix.append(word)
            text = text[len(word) + 1 :]
    op = _OP_RE.match(text)
    if not op:
        raise KernelNameError(
            f"{name!r} is not a KleidiAI matmul or packer name (expected kai_[run_]matmul[_clamp]_..., "
            "kai_[run_]lhs_[quant_]pack_... or kai_[run_]rhs_[quant_]pack_{nxk|kxn}_...)"
        )
    rest, engine, tech, uarch = _split_tail(text[op.end() :].split("_"))
    stray = next((i for i, piece in enumerate(rest) if piece in _ENGINES), None)
    if stray is not None:  # the engine is not last: what follows it is no instruction or tuning KleidiAI has
        raise _not_a_name(name, f"unknown token {'_'.join(rest[stray + 1 :])!r} after the engine {rest[stray]!r}")
    tile = _TILE_RE.match(rest[-1]) if op["mm"] and rest else None
    if tile:
        rest.pop()
    if len(rest) < (3 if op["mm"] else 2) or not all(rest):
        raise KernelNameError(f"{name!r} lacks the operand fields of a KleidiAI {op[0].rstrip('_')} name")
    operands = []
    for operand in rest:
        m = _DESCRIPTOR_RE.match(operand)
        if not m:
            raise _not_a_name(name, f"unknown operand descriptor {operand!r}")
        if m["type"] not in _TYPES:
            raise _not_a_name(name, f"unknown element type {m['type']!r} in {operand!r}")
        operands.append(m)
    return _Parsed(tuple(prefix), op, operands, tile, engine, tech, uarch)


def _not_a_name(name: str, why: str) -> KernelNameError:
    return KernelNameError(f"{name!r} is not a KleidiAI name: {why}")


_PREFIXES = {
    "kai": Field("kai", "prefix", (("kai", "KleidiAI micro-kernel"),)),
    "run": Field("run", "entry point", (("run", "kai_run_<name> is the function that does the work"),)),
}


def decode(name: str, svl_bits: int | None = None) -> list[Field]:
    """The fields of a KleidiAI matmul or packer name (with or without ``kai_`` / ``kai_run_``), or of a
    matmul folder name, in today's spelling; a field written the legacy way keeps that spelling in ``spelled``."""
    parsed = _parse(name)
    lanes = _Lanes(svl_bits, parsed.engine)
    operation, sides, roles = _operation(parsed.op, parsed.engine)
    rest = [m.string for m in parsed.operands]
    sides += [""] * (len(rest) - len(sides))
    try:
        operands = [_operand(m, side, lanes, parsed.is_folder) for m, side in zip(parsed.operands, sides, strict=True)]
    except KernelNameError as exc:
        raise _not_a_name(name, str(exc)) from None
    if parsed.op["mm"]:
        roles += ["additional input"] * (len(rest) - len(roles))
    else:
        roles += _input_roles(len(rest) - len(roles), operands[0])
    fields = [_PREFIXES[word] for word in parsed.prefix] + [operation]
    fields += [Field(t, role, tuple(parts)) for t, role, parts in zip(rest, roles, operands, strict=True)]
    if parsed.tile:
        fields.append(_tile(parsed.tile, lanes))
    if parsed.engine:
        fields.append(Field(parsed.engine, "engine", ((parsed.engine, _ENGINES[parsed.engine]),)))
    if parsed.tech:
        types = {tok for parts in operands for tok, _ in parts}
        meaning = _instruction(parsed.tech, parsed.engine or "", types)
        fields.append(Field(parsed.tech, "instruction", ((parsed.tech, meaning),)))
    if parsed.uarch:
        fields.append(Field(parsed.uarch, "tuning", ((parsed.uarch, _UARCH[parsed.uarch]),)))
    pieces = iter(name.strip().split("_"))
    spelled = ["_".join(islice(pieces, field.text.count("_") + 1)) for field in fields]
    return [
        field if old == field.text else replace(field, spelled=old) for field, old in zip(fields, spelled, strict=True)
    ]


def current_name(name: str) -> str:
    """``name`` as KleidiAI spells it today, ``kai_run_`` shortened to ``kai_`` (``name`` itself if current)."""
    pieces = [_respell(piece) for piece in name.strip().split("_")]
    if pieces[:2] == ["kai", "run"]:
        del pieces[1]
    return "_".join(pieces)


def is_legacy(name: str) -> bool:
    """Whether ``name`` uses one of KleidiAI's early spellings (``clip``, ``qa8dxP4X8``, ``S1S0``, ...)."""
    return any(_respell(piece) != piece for piece in name.strip().split("_"))


def kind(name: str) -> str:
    """What ``name`` names: "kernel", "packer" or "folder" (a matmul name without tile and engine)."""
    parsed = _parse(name)
    return "folder" if parsed.is_folder else "kernel" if parsed.op["mm"] else "packer"


def folder(name: str) -> str | None:
    """The KleidiAI folder a matmul kernel lives in (``matmul_clamp_f32_qai8dxp_qsi4cxp``; a folder name gives
    itself, in today's spelling), None for a packer."""
    parsed = _parse(name)
    if not parsed.op["mm"]:
        return None
    buffers = [m.string[: m.end() + m.string.startswith("p", m.end())] for m in parsed.operands]
    return "_".join([parsed.op[0].rstrip("_"), *buffers])


def _gist(m: re.Match[str]) -> str:
    """An operand in a few words: ``qai8dxp4x8`` -> "int8 (per-row asymmetric)"."""
    element = _TYPES[m["type"]][0]
    if not m["quant"]:
        return element
    axis = f"{_AXES[m['axis']][0]} " if m["axis"] else ""
    return f"{element} ({axis}{'symmetric' if m['quant'] == 'qs' else 'asymmetric'})"


def summary(name: str) -> str:
    """What the kernel (or packer) computes, in one line: what its descriptors say, not what prose around a
    name may say (``qai8dxp`` LHS activations are int8 per-row asymmetric, ``qsi4cxp`` weights int4 symmetric)."""
    parsed = _parse(name)
    gists = [_gist(m) for m in parsed.operands]
    if parsed.op["mm"]:
        clamp = ", clamped to [scalar_min, scalar_max]" if parsed.op["clamp"] else ""
        what = "a KleidiAI folder: its kernels compute" if parsed.is_folder else "computes"
        return f"{what} dst {gists[0]} = LHS activations {gists[1]} x RHS weights {gists[2]}{clamp}"
    what = "LHS activations" if parsed.op["lhs"] else "RHS weights"
    return f"packs {what}: {gists[1]} -> {gists[0]}"


def _rows(fields: list[Field], indent: str) -> list[tuple[str, str]]:
    """(token, meaning) rows: each field, then (indented) the tokens it is made of; a one-token field is one row."""
    rows: list[tuple[str, str]] = []
    for field in fields:
        if field.simple:
            rows.append((field.text, f"{field.label}: {field.parts[0][1]}"))
        else:
            rows.append((field.text, field.label))
            rows.extend((indent + tok, meaning) for tok, meaning in field.parts)
    return rows


def explain(name: str, svl_bits: int | None = None) -> list[tuple[str, str]]:
    """(token, meaning) pairs: each field of the name followed by the tokens it is made of (a one-token
    field such as ``f32`` or ``sme2`` is one pair, "role: meaning").

    ``svl_bits`` (128..2048) turns ``vl``/``vs`` sizes into concrete numbers (1VL = 16 rows at SVL 512).
    """
    return _rows(decode(name, svl_bits), "")


def format_explanation(name: str, svl_bits: int | None = None, width: int = 110) -> str:
    """A compact aligned text block explaining ``name`` (what ``kleidipy kernels --explain`` prints): its
    tokens, what it computes, and for a legacy name today's name."""
    fields = decode(name, svl_bits)
    rows = _rows(fields, "  ")
    col = max(len(tok) for tok, _ in rows) + 3
    lines = [name.strip()]
    engine = next((f.text for f in fields if f.role == "engine"), None)
    uses_vl = any(re.search(r"\d(vl|vs)", tok) for tok, _ in rows)
    header = _Lanes(svl_bits, engine).header()
    if header and uses_vl:
        lines.append(f"({header})")
    lines.append("")
    for tok, meaning in rows:
        wrapped = textwrap.wrap(meaning, max(40, width - col - 2)) or [""]
        lines.append(f"  {tok.ljust(col)}{wrapped[0]}")
        lines.extend(f"  {' ' * col}{more}" for more in wrapped[1:])
    lines.append("")
    lines += textwrap.wrap(summary(name), width, subsequent_indent="  ")
    if is_legacy(name):
        lines.append(f"legacy name; today: {current_name(name)}")
    return "\n".join(lines)
