"""The Q8_0 SME2 kernels as native SME2 tiles (``kernels/qai8dxp_qsi8cxp/sme2.py``).

On any host: both tiles cross-compile to KleidiAI's instruction sequence (4-way ``smopa`` into ZA.S tiles for the MOPA
GEMM, multi-vector indexed ``sdot`` into ZA vector groups for the GEMV, ``mova`` out of ZA, the integer zero-point
``mla`` and each kernel's float epilogue), without widening NEON code nor calls of the SME ABI's routines; their block
loops and their epilogues execute at most 1.25× the instructions of KleidiAI's per int8 MAC (per row, per tile). Under
QEMU (``scripts/qemu-aarch64``, SME2 at SVL 128, 256 and 512): both kernels bound to the host's SVL run on the tiles
through the family's tile chain (``ukernels.MATMUL_COMPUTE``, ``matmul_tiled``), bit for bit the numpy reference and the
portable jit, and the other layouts fall back without a tile call (``sme2_tiles_check.py``).
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
from emulator import SME_GROUP, ensure_emulator, run_emulated

from kleidipy.core import native
from kleidipy.kernels.qai8dxp_qsi8cxp import sme2
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam
from kleidipy.tools import asm

pytestmark = SME_GROUP

CHECK = Path(__file__).resolve().parent / "sme2_tiles_check.py"
ISA = native.ISAS["aarch64-sme2"]
#: executed instructions of KleidiAI's kernels (their inline assembly), at VL = SVL/32 lanes: the block loop per 32 K
#: values (MOPA: 8 × 11 per K group of 4; SDOT: 2 × 20 per 16 K) and the epilogue (MOPA: 29 per row, the
#: ``label_4`` loop; SDOT: 28 after the block loop and 12 before it, per row and group of 4·VL columns)
KLEIDIAI_BLOCK = {sme2.MOPA: 88, sme2.SDOT: 40}
KLEIDIAI_EPILOGUE = {sme2.MOPA: 29, sme2.SDOT: 40}
#: int8 MACs per block of 32 K values: VL rows (MOPA) or one × 4·VL columns × 32
MACS_PER_BLOCK = {sme2.MOPA: lambda vl: 128 * vl * vl, sme2.SDOT: lambda vl: 128 * vl}
MAX_RATIO = 1.25


def listing(symbol: str) -> list[asm.Line]:
    return asm.parse(native.assembly(sme2.tile_module(symbol), ISA))


def count(lines: list[asm.Line], mnemonic: str, operands: str = ".*") -> int:
    return sum(line.mnemonic == mnemonic and bool(re.fullmatch(operands, line.operands)) for line in lines)


def innermost(lines: list[asm.Line], mnemonic: str, operands: str = ".*") -> tuple[int, int]:
    """(first, last) of the innermost loop holding an instruction ``mnemonic operands``."""
    found = [(first, last) for first, last in asm.loops(lines) if count(lines[first : last + 1], mnemonic, operands)]
    return min(found, key=lambda span: span[1] - span[0])


def executed(lines: list[asm.Line], span: tuple[int, int]) -> int:
    return sum(line.mnemonic is not None for line in lines[span[0] : span[1] + 1])


def counts(symbol: str) -> tuple[int, int]:
    """Executed instructions of the tile's block loop (one iteration: 32 K values) and of its epilogue (MOPA: the
    loop over the rows, one iteration; SDOT: the row loop's instructions outside the block loop)."""
    lines = listing(symbol)
    block = innermost(lines, "smopa" if symbol == sme2.MOPA else "sdot")
    if symbol == sme2.MOPA:
        return executed(lines, block), executed(lines, innermost(lines, "mov", r"\{.*\}, za0h\.b\[.*"))
    rows = innermost(lines, "zero", r"\{za\}")
    return executed(lines, block), executed(lines, rows) - executed(lines, block)


def test_mopa_tile_cross_compiles_to_smopa() -> None:
    lines = listing(sme2.MOPA)
    # the block loop: 8 K groups of 4 smopa (4-way, ZA0.S .. ZA3.S), the LHS vector and 4 RHS vectors (one ld1b)
    first, last = innermost(lines, "smopa")
    block = lines[first : last + 1]
    assert count(lines, "smopa", r"za[0-3]\.s, p\d+/m, p\d+/m, z\d+\.b, z\d+\.b") == count(block, "smopa") == 32
    assert count(block, "ld1b", r"\{ z\d+\.b, z\d+\.b, z\d+\.b, z\d+\.b \}, pn\d+/z, .*") == 8
    assert count(lines, "zero", r"\{za\}") == 1
    # per row: mova of row r of the 4 tiles, the zero-point mla, scvtf, f32(f32(F·S) + bias)
    assert count(lines, "mov", r"\{ z\d+\.b - z\d+\.b \}, za0h\.b\[w\d+, 0:3\]") == 1
    assert count(lines, "mla") == 4 and count(lines, "scvtf", r"\{.*") == 1
    assert count(lines, "fmul") == 8 and count(lines, "fadd") == 4
    assert not count(lines, "fmla") and not count(lines, "fmad")  # FMUL_FADD: never fused


def test_sdot_tile_cross_compiles_to_multi_vector_sdot() -> None:
    lines = listing(sme2.SDOT)
    # 32 K values per iteration: 2 ld1rqb of 16 LHS bytes, per K group 4 RHS vectors and an indexed sdot
    assert count(lines, "sdot", r"za\.s\[w\d+, 0, vgx4\], \{ z\d+\.b - z\d+\.b \}, z\d+\.b\[[0-3]\]") == 8
    assert count(lines, "ld1rqb") == 2
    assert count(lines, "ld1b", r"\{ z\d+\.b - z\d+\.b \}, pn\d+/z, .*") == 8
    assert count(lines, "mov", r"\{ z\d+\.[sd] - z\d+\.[sd] \}, za\.[sd]\[w\d+, 0, vgx4\]") == 1
    assert count(lines, "zero", r"\{za\}") == 1 and count(lines, "mla") == 4 and count(lines, "scvtf", r"\{.*") == 1
    assert count(lines, "fmul") == 4 and count(lines, "fmla") + count(lines, "fmad") == 4  # FMA_BIAS
    assert not count(lines, "fadd")


@pytest.mark.parametrize("symbol", [sme2.MOPA, sme2.SDOT])
def test_tiles_are_sme2_code_in_streaming_mode(symbol: str) -> None:
    ops = collections.Counter(line.mnemonic for line in listing(symbol) if line.mnemonic)
    assert not any(ops[m] for m in ("smull", "smull2", "sxtl", "sxtl2", "smlal", "smlal2"))  # portable int8 code
    assert ops["smstart"] == ops["smstop"] == 2  # sm and za: the entry point enables both
    assert not [line for line in listing(symbol) if line.mnemonic == "bl" and line.operands.startswith("__arm_")]


@pytest.mark.parametrize("symbol", [sme2.MOPA, sme2.SDOT])
@pytest.mark.parametrize("svl", [128, 256, 512])
def test_within_a_quarter_of_kleidiai(symbol: str, svl: int) -> None:
    """Per 1,024 MACs: the block loop, and the epilogue (per row of a VL × 4·VL tile, or per 1 × 4·VL tile) for
    the MACs of one block (the epilogue's share shrinks with K: it is the same work as KleidiAI's per tile)."""
    macs = MACS_PER_BLOCK[symbol](svl // 32)
    block, epilogue = counts(symbol)
    assert block * 1024 / macs <= MAX_RATIO * KLEIDIAI_BLOCK[symbol] * 1024 / macs
    assert epilogue <= MAX_RATIO * KLEIDIAI_EPILOGUE[symbol]


def test_kernel_tiles_are_the_sme_and_sme2_kernels() -> None:
    """The SME2 kernels' tiles, which also run the SME kernels of the same layouts on an SME2 host."""
    for kern in fam.KERNELS:
        for name, isa in native.ISAS.items():
            has = kern.is_sme and name == "aarch64-sme2"
            assert (sme2.kernel_tile(kern, isa) is not None) == has, (kern.name, name)


def test_no_tiles_without_sme2() -> None:
    """On this host (no Arm SME2) nothing is installed."""
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
    assert len(lines) == 4 and "DIFFERENT" not in out
    assert lines[1].endswith(f"14 of {sme2.MOPA}") and lines[2].endswith(f"14 of {sme2.SDOT}")
    assert lines[3].endswith(" 0 tile calls")  # other SVLs, the other recipe, a NEON layout: not the tiles
