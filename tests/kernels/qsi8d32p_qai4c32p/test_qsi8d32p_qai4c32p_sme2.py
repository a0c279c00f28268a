"""The Q4_1 SME2 kernels as native SME2 tiles (``kernels/qsi8d32p_qai4c32p/sme2.py``).

On any host: both tiles cross-compile to KleidiAI's instruction sequence (4-way ``smopa`` into ZA.S tiles with ``luti4``
for the MOPA GEMM, multi-vector ``sdot`` into ZA vector groups with ``luti4`` for the GEMV, ``mova`` out of ZA) and its
float steps (per row and block: the scale product ``fmul``, the zero term then the scale term fused, the first block's
zero term an ``fmul`` in the GEMM; the bias ``fadd`` once), without widening NEON code nor calls of the SME ABI's
routines, and their block loops execute at most 1.25× the instructions of KleidiAI's per int8 MAC. Under QEMU
(``scripts/qemu-aarch64``, SME2 at SVL 128, 256 and 512): both kernels bound to the host's SVL run on the tiles through
the family's SME2 chain (``ukernels.SME2_COMPUTE``), bit for bit the numpy reference (``sme2_tiles_check.py``), and
everything else runs elsewhere, with the same bits.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
from emulator import SME_GROUP, ensure_emulator, run_emulated

from kleidipy.core import native
from kleidipy.kernels.qsi8d32p_qai4c32p import sme2, ukernels

pytestmark = SME_GROUP

CHECK = Path(__file__).resolve().parent / "sme2_tiles_check.py"
ISA = native.ISAS["aarch64-sme2"]
#: executed instructions per block (32 K values) of KleidiAI's kernels at VL = SVL/32 lanes, counted in their
#: inline assembly: MOPA 2 + 8 × 12 (K groups) + 9 + VL × 25 (rows out of ZA) + 2; DOT 2 + 2 × 20 + 23
KLEIDIAI_PER_BLOCK = {sme2.MOPA: lambda vl: 109 + 25 * vl, sme2.DOT: lambda vl: 65}
#: int8 MACs per block: VL rows (MOPA) or one × 4·VL columns × 32
MACS_PER_BLOCK = {sme2.MOPA: lambda vl: 128 * vl * vl, sme2.DOT: lambda vl: 128 * vl}


def instructions(asm: str) -> list[str]:
    """The instructions and labels (``"label:"``) of an assembly listing, in order."""
    out = []
    for line in asm.splitlines():
        if re.match(r"^\.?[\w.]+:", line):
            out.append(line.split(":")[0] + ":")
        elif line.startswith("\t") and not line.lstrip().startswith("."):
            out.append(line.strip())
    return out


def tile(symbol: str) -> list[str]:
    return instructions(native.assembly(sme2.tile_module(symbol), ISA))


def count(lines: list[str], pattern: str) -> int:
    return sum(bool(re.match(pattern, line)) for line in lines)


def loop(lines: list[str], inside: str) -> tuple[int, int]:
    """(label index, back-branch index) of the innermost loop whose body has the last instruction matching
    ``inside``."""
    at = max(i for i, line in enumerate(lines) if re.match(inside, line))
    found = []
    for end, line in enumerate(lines):
        target = line.split()[-1] if line.startswith("b") else ""
        if f"{target}:" in lines[:end] and lines.index(f"{target}:") < at < end:
            found.append((lines.index(f"{target}:"), end))
    return max(found)


def per_block(symbol: str, vl: int) -> int:
    """Executed instructions of one block (after the first) of the tile at VL: its block loop, the loop over the
    rows out of ZA (MOPA) VL times."""
    lines = tile(symbol)
    start, end = loop(lines, r"zero\t\{za\}")
    total = sum(not line.endswith(":") for line in lines[start : end + 1])
    if symbol == sme2.MOPA:
        row_start, row_end = loop(lines, r"mov\t\{.*za0h\.b")
        total += (vl - 1) * sum(not line.endswith(":") for line in lines[row_start : row_end + 1])
    return total


def test_mopa_tile_cross_compiles_to_smopa_and_luti4() -> None:
    lines = tile(sme2.MOPA)
    # two copies of a block (the first one: FMUL of the zero term), 8 K groups each: 4 smopa (4-way), 2 luti4
    assert count(lines, r"smopa\tza[0-3]\.s, p\d+/m, p\d+/m, z\d+\.b, z\d+\.b$") == 64
    assert count(lines, r"luti4\t\{ z\d+\.b, z\d+\.b \}, zt0, z\d+\[0\]$") == 32
    assert count(lines, r"ldr\tzt0, ") == 1 and count(lines, r"zero\t\{za\}$") == 2
    assert count(lines, r"mov\t\{ z\d+\.b - z\d+\.b \}, za0h\.b\[w\d+, 0:3\]$") == 2  # mova: row r of the 4 tiles
    assert count(lines, r"scvtf\t\{") == 2
    # per row: 4 scale products (both copies), 4 zero-term FMULs (first block), 4 + 8 fused steps, 4 bias FADDs
    assert count(lines, r"fmul\t") == 12 and count(lines, r"fm(la|ad)\t") == 12 and count(lines, r"fadd\t") == 4


def test_dot_tile_cross_compiles_to_multi_vector_sdot() -> None:
    lines = tile(sme2.DOT)
    # 8 K groups per block: 2 multi-vector sdot (indexed) per 2 K groups, 4 luti4
    assert count(lines, r"sdot\tza\.s\[w\d+, 0, vgx4\], \{ z\d+\.b - z\d+\.b \}, z\d+\.b\[[0-3]\]$") == 8
    assert count(lines, r"luti4\t\{ z\d+\.b, z\d+\.b \}, zt0, z\d+\[0\]$") == 16
    assert count(lines, r"ld1rqb\t") == 2 and count(lines, r"ld1b\t\{ z\d+\.b, z\d+\.b, z\d+\.b, z\d+\.b \}") == 4
    assert count(lines, r"mov\t\{ z\d+\.[sd] - z\d+\.[sd] \}, za\.[sd]\[w\d+, 0, vgx4\]$") == 1
    assert count(lines, r"zero\t\{za\}$") == 1 and count(lines, r"scvtf\t\{") == 1
    assert count(lines, r"fmul\t") == 4 and count(lines, r"fm(la|ad)\t") == 8 and count(lines, r"fadd\t") == 4


@pytest.mark.parametrize("symbol", [sme2.MOPA, sme2.DOT])
def test_tiles_are_sme2_code_in_streaming_mode(symbol: str) -> None:
    lines = tile(symbol)
    ops = collections.Counter(line.split()[0] for line in lines)
    assert not ops["smull"] and not ops["smull2"] and not ops["sxtl"] and not ops["smlal"]  # portable int8 code
    assert ops["smstart"] == ops["smstop"] == 2  # sm and za: the entry point enables both
    assert not [line for line in lines if line.startswith("bl\t__arm_")]  # no SME ABI support routine


@pytest.mark.parametrize("symbol", [sme2.MOPA, sme2.DOT])
@pytest.mark.parametrize("svl", [128, 256, 512])
def test_block_loop_within_a_quarter_of_kleidiai(symbol: str, svl: int) -> None:
    vl = svl // 32
    ours, theirs = per_block(symbol, vl), KLEIDIAI_PER_BLOCK[symbol](vl)
    assert ours * 1024 / MACS_PER_BLOCK[symbol](vl) <= 1.25 * theirs * 1024 / MACS_PER_BLOCK[symbol](vl)


def test_kernel_tile_only_for_the_sme2_kernels_on_sme2() -> None:
    by_name = {k.name: k for k in ukernels.KERNELS}
    for symbol, name in sme2.KERNELS.items():
        assert sme2.kernel_tile(by_name[name], ISA) == sme2.tile_module(symbol)
        assert sme2.kernel_tile(by_name[name], native.ISAS["aarch64-i8mm"]) is None
    assert all(sme2.kernel_tile(k, ISA) is None for k in ukernels.KERNELS if k.name not in sme2.KERNELS.values())


def test_no_tiles_without_sme2() -> None:
    """On this host (no Arm SME2) nothing is installed: the tiles are not available."""
    if sme2.AVAILABLE:
        pytest.fail("this test runs on hosts without Arm SME2 (x86 CI)")
    assert native.host_isa("aarch64-sme2") is None and sme2.HOST_ISA is None


@pytest.mark.parametrize("svl", [128, 256, 512])
def test_tiles_bit_exact_under_qemu(svl: int) -> None:
    ensure_emulator()
    cpu = f"max,sme-default-vector-length={svl // 8}"
    code, out, err = run_emulated(cpu, str(CHECK), python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    lines = out.strip().splitlines()
    assert lines[0] == f"native tiles: aarch64-sme2, SVL {svl}"
    assert len(lines) == 5 and "DIFFERENT" not in out
    # each shape through the family's SME2 chain (the jit's and the plan's routine's): 8 GEMM shapes, 4 GEMV ones
    assert lines[1].endswith(f"8 calls of {sme2.MOPA}") and lines[2].endswith(f"4 calls of {sme2.DOT}")
    assert lines[3].endswith(" 0 tile calls") and lines[4].endswith(" 0 tile calls")  # another SVL; NEON kernels
