"""Hot loops of machine code: what ``kleidipy kernels --asm`` shows. Owns the reading of assembly text (LLVM's, and
KleidiAI's ``_asm.S`` sources) into instructions (:func:`parse`), its loops (:func:`loops`), the hot loop of an int8
matmul (:func:`hot_loop`) and its :class:`LoopCount`.

Hand-written: no maintained library reads both LLVM's and KleidiAI's assembly into loops, and what counts as one
block of work is this project's definition.

Definitions: docs/hot-loops.md."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

#: dot-product instructions: int8 (aarch64 NEON/SME, x86 AVX-512 VNNI) and the widening F16 ``fmopa`` (2-way, FP16
#: to FP32: an F16 kernel's dot; the non-widening ``fmopa`` of float32 vectors counts no MACs, :func:`dot_macs`)
DOT_MNEMONICS = frozenset(
    {"sdot", "udot", "usdot", "sudot", "smmla", "ummla", "usmmla", "smopa", "umopa", "usmopa", "sumopa"}
    | {"vpdpbusd", "vpdpbusds", "fmopa"}
)
_FMA = re.compile(r"^(fmla|fmad|fmadd|fmopa|bfmopa|vfmadd\d{3}[ps]s)$")
_LABEL = re.compile(r"^([.\w$]+):")
_KAI_LABEL = re.compile(r"KAI_ASM_LABEL\((\w+)\)")
_KAI_INST = re.compile(r"KAI_ASM_INST\(0x[0-9a-fA-F]+\)\s*//\s*(.*)")
_C_ASM = re.compile(r'^\s*"(.*?)\s*(?:\\n)?"\s*(?://.*)?$')
_C_INST = re.compile(r"\s*\.inst\s+0x[0-9a-fA-F]+\s*//\s*(.*)")


@dataclass(frozen=True)
class Line:
    """A label (``label`` set) or an instruction (``mnemonic`` and ``operands``) of an assembly listing."""

    text: str
    label: str | None = None
    mnemonic: str | None = None
    operands: str = ""


def parse(text: str) -> list[Line]:
    """Labels and instructions of assembly text (directives, comments and macros other than KleidiAI's label and
    instruction macros are dropped)."""
    out = []
    for raw in text.splitlines():
        if m := _C_ASM.match(raw):  # a line of a C inline-asm block: " .inst 0x... // mnemonic ... \n"
            body = m.group(1)
            if inst := _C_INST.match(body):
                out.append(_instruction(raw, inst.group(1)))
                continue
            raw_line = body
        else:
            raw_line = raw
        line = raw_line.split("//")[0] if "KAI_ASM_INST" not in raw_line else raw_line
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";", "/*", "*")):
            continue
        if m := _KAI_LABEL.search(stripped):
            out.append(Line(raw, label=m.group(1)))
        elif m := _KAI_INST.search(stripped):
            out.append(_instruction(raw, m.group(1)))
        elif stripped.startswith("KAI_ASM"):
            continue
        elif m := _LABEL.match(stripped):
            out.append(Line(raw, label=m.group(1)))
        elif not stripped.startswith("."):
            out.append(_instruction(raw, stripped))
    return out


def _instruction(raw: str, text: str) -> Line:
    mnemonic, *rest = text.split(None, 1)
    return Line(raw, mnemonic=mnemonic, operands=rest[0].strip() if rest else "")


def _branch_target(line: Line) -> str | None:
    m = line.mnemonic or ""
    arm = m in ("b", "cbz", "cbnz", "tbz", "tbnz") or m.startswith("b.") or m in _ARM_COND
    if arm or (m.startswith("j") and m != "jmpq"):
        target = line.operands.split(",")[-1].strip()
        return target or None
    return None


_ARM_COND = {f"b{c}" for c in ("eq", "ne", "gt", "ge", "lt", "le", "hi", "hs", "lo", "ls", "mi", "pl", "cs", "cc")}


def loops(lines: list[Line]) -> list[tuple[int, int]]:
    """(first, last) line indices of every loop: a label and a later branch back to it (GNU local labels: ``4b`` is
    the nearest ``4:`` before the branch)."""
    out = []
    for j, line in enumerate(lines):
        target = _branch_target(line) if line.mnemonic else None
        if target is None:
            continue
        name = target[:-1] if re.fullmatch(r"\d+b", target) else target
        first = next((i for i in range(j, -1, -1) if lines[i].label == name), None)
        if first is not None:
            out.append((first, j))
    return out


def dot_macs(line: Line, svl_bits: int) -> int:
    """Multiply-accumulates of one dot-product instruction (0 for others): int8, or F16 for the widening ``fmopa``."""
    m, ops = line.mnemonic or "", line.operands
    if m not in DOT_MNEMONICS:
        return 0
    if m == "fmopa":  # widening FP16 to FP32 (z*.h sources): 2-way outer product into a ZA.S tile
        return (svl_bits // 32) ** 2 * 2 if re.search(r"z\d+\.h", ops) else 0
    if m.startswith("vpdpbusd"):  # 4 bytes per 32-bit lane of the register width
        return 64 if "%zmm" in ops else 32 if "%ymm" in ops else 16
    lanes = svl_bits // 32
    if m.endswith("mopa"):  # 4-way outer product into a ZA.S tile
        return lanes * lanes * 4
    if "za" in ops:  # multi-vector dot into ZA vector groups: {z0.b-z3.b} etc.
        group = re.search(r"vgx(\d)", ops, re.IGNORECASE)
        return (int(group.group(1)) if group else 1) * lanes * 4
    if m.endswith("mmla"):
        return 32
    return 16  # NEON dot: 4 lanes of 4 bytes


#: integer multiplies of portable code (no dot-product instruction): x86 (SSE/AVX, with the bits of a product lane)
#: and aarch64 NEON mnemonics
_X86_MULS = {"pmaddwd": 16, "pmaddubsw": 8, "pmulld": 32, "pmullw": 16, "pmuludq": 64, "pmuldq": 64}
_ARM_MULS = frozenset({"mul", "mla", "mls", "smull", "smull2", "umull", "umull2", "smlal", "smlal2", "umlal", "umlal2"})
MUL_MNEMONICS = frozenset(_X86_MULS) | frozenset(f"v{m}" for m in _X86_MULS) | _ARM_MULS | {"imul", "imulq", "imull"}
_ARRANGEMENT = re.compile(r"\.(\d+)[bhsd]\b")


def mul_macs(line: Line) -> int:
    """Integer multiplies (lanes) of one multiply instruction of portable code (0 for others): an x86 vector
    multiply's lanes from its register width and element size, a NEON one's from its destination's arrangement
    (``smull v0.8h`` 8), a scalar multiply 1."""
    m, ops = line.mnemonic or "", line.operands
    if m not in MUL_MNEMONICS:
        return 0
    if (bits := _X86_MULS.get(m.removeprefix("v"))) is not None:
        width = 512 if "%zmm" in ops else 256 if "%ymm" in ops else 128
        return width // bits
    lanes = _ARRANGEMENT.search(ops.split(",")[0])
    return int(lanes.group(1)) if lanes else 1


@dataclass(frozen=True)
class LoopCount:
    """One loop's instructions: ``lines``, ``counts`` per mnemonic, the int8 ``macs`` of its dot instructions."""

    lines: tuple[Line, ...]
    counts: Counter
    macs: int

    @property
    def instructions(self) -> int:
        return sum(self.counts.values())

    @property
    def dots(self) -> int:
        return sum(n for m, n in self.counts.items() if m in DOT_MNEMONICS)

    @property
    def multiplies(self) -> int:
        """Integer multiply instructions (portable code's stand-in for dot instructions)."""
        return sum(n for m, n in self.counts.items() if m in MUL_MNEMONICS)

    def per_1024_macs(self, count: int | None = None) -> float:
        """Instructions (or ``count`` of them) per 1,024 int8 MACs."""
        return (self.instructions if count is None else count) * 1024 / self.macs


def _vnni_accumulators(body: list[Line]) -> int:
    """Registers a loop's ``vpdpbusd`` instructions accumulate into (AT&T: the last operand). A matmul tile keeps
    several; a loop whose dots all go into one is a reduction — the LHS's per-block sums, ``vnni.neg_block_sums``,
    with 32 dots in a row — and is not taken for the hot loop while a tile's loop is there."""
    return len({line.operands.rsplit(",", 1)[-1].strip() for line in body if line.mnemonic.startswith("vpdpbus")})


def hot_loop(text: str, svl_bits: int = 512, block_loops: bool = True, portable: bool = False) -> LoopCount | None:
    """The hot loop of an int8 matmul listing (docs/hot-loops.md), or None without one: of the loops holding dot
    instructions and a float multiply-add with no such loop inside them (failing those, or without
    ``block_loops``: loops holding dot instructions), the one with the most MACs (the main tile, not a tail), then
    the shortest; on x86 a loop whose dots all accumulate into one register only when no other is there.
    ``block_loops=False`` suits code whose float epilogue runs after the whole K loop (kleidipy's VNNI tiles): a
    loop around it holding both would be a loop over tiles. With ``portable`` (code without dot instructions) the
    integer multiplies stand in for them (:func:`mul_macs`)."""
    macs_of = mul_macs if portable else lambda line: dot_macs(line, svl_bits)
    lines = parse(text)
    spans = {True: [], False: []}
    for first, last in loops(lines):
        body = [line for line in lines[first : last + 1] if line.mnemonic]
        if any(macs_of(line) for line in body):
            fma = block_loops and any(_FMA.match(line.mnemonic) for line in body)
            spans[fma].append((first, last, body))
    found = spans[True] or spans[False]
    if not found:
        return None
    inner = [s for s in found if not any(o is not s and s[0] <= o[0] and o[1] <= s[1] for o in found)]
    tiles = [s for s in inner if _vnni_accumulators(s[2]) != 1] or inner
    counted = [(sum(macs_of(line) for line in body), body) for _, _, body in tiles]
    macs, body = max(counted, key=lambda c: (c[0], -len(c[1])))
    return LoopCount(tuple(body), Counter(line.mnemonic for line in body), macs)
