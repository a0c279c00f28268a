"""The Q4_0 SME1 kernels as native tiles for FEAT_SME without SME2 (``kernels/qsi8d32p_qsi4c32p/sme.py``).

On any host: both tiles cross-compile for ``aarch64-sme`` (``+sme``, no ``+sme2``) to KleidiAI's instruction
sequence (``lsl``/``and`` nibble extraction, 4-way ``smopa`` into ZA0.S–ZA3.S and ``mova`` out of ZA for the MOPA
GEMM, indexed ``sdot`` for the GEMV), with no SME2 instruction (no ``luti4``, ZT0, multi-vector operand or
predicate-as-counter), no widening NEON code nor calls of the SME ABI's routines, and their block loops execute at
most the instructions of KleidiAI's. Under QEMU (``scripts/qemu-aarch64``, SVL 128 and 512): both kernels bound to
the host's SVL run on the tiles, bit for bit the numpy reference (``sme_tiles_check.py``). QEMU 11 has no CPU with
SME but not SME2 (no ``sme2`` property), so the emulated CPU is ``max``: the tiles run there as SME1 code only
(they are compiled for ``+sme``: LLVM cannot select an SME2 instruction for them, and the listing has none).
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
from emulator import SME_GROUP, ensure_emulator, run_emulated

from kleidipy.core import native
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit, sme, ukernels, vnni_s4s0
from kleidipy.tools import asm

pytestmark = SME_GROUP

CHECK = Path(__file__).resolve().parent / "sme_tiles_check.py"
ISA = native.ISAS["aarch64-sme"]
#: executed instructions per block (32 K values) of KleidiAI's kernels at VL = SVL/32 lanes, counted in their
#: ``_asm.S``: MOPA 8 + 4 × 32 (packets) + 5 + 2 + VL × 43 (rows out of ZA, the FMLA path); DOT 5 + 2 × 46 + 26
KLEIDIAI_PER_BLOCK = {sme.MOPA: lambda vl: 143 + 43 * vl, sme.DOT: lambda vl: 123}
#: what SME2 adds, none of which an SME1 tile may hold: luti2/luti4, ZT0, multi-vector operands ({z0 - z3},
#: vgx2/vgx4 groups), predicate-as-counter registers
SME2_OPERAND = re.compile(r"zt0|vgx\d|\{ z\d+\.\w - z\d+\.\w \}|\bpn\d+")


def lines(symbol: str) -> list[asm.Line]:
    return asm.parse(native.assembly(sme.tile_module(symbol), ISA))


def count(code: list[asm.Line], mnemonic: str, operands: str = ".*") -> int:
    return sum(line.mnemonic == mnemonic and re.fullmatch(operands, line.operands) is not None for line in code)


def innermost(code: list[asm.Line], *mnemonics: str) -> list[asm.Line]:
    """The instructions of the smallest loop holding all of ``mnemonics`` (inner loops once)."""
    spans = []
    for first, last in asm.loops(code):
        body = [line for line in code[first : last + 1] if line.mnemonic]
        if set(mnemonics) <= {line.mnemonic for line in body}:
            spans.append(body)
    return min(spans, key=len)


def per_block(symbol: str, vl: int) -> int:
    """Executed instructions of one block (after the first) of the tile at VL: its block loop, and for MOPA the
    loop over the rows out of ZA VL times."""
    code = lines(symbol)
    if symbol == sme.DOT:
        return len(innermost(code, "sdot", "fmla"))
    rows = innermost(code, "scvtf", "fmad")  # the rows of a block after the first: FMLA (as FMAD) into dst
    return len(innermost(code, "zero", "smopa", "fmad")) + (vl - 1) * len(rows)


def test_mopa_tile_cross_compiles_to_smopa() -> None:
    code = lines(sme.MOPA)
    # two copies of a block (the first one: FMUL), 4 packets each: 8 smopa (4-way, ZA0.S .. ZA3.S), 4 lsl, 4 and
    assert count(code, "smopa", r"za[0-3]\.s, p\d+/m, p\d+/m, z\d+\.b, z\d+\.b") == 64
    assert count(code, "lsl", r"z\d+\.b, z\d+\.b, #4") == 32 and count(code, "and", r"z\d+\.b, z\d+\.b, #0xf0") == 32
    assert count(code, "zero", r"\{za\}") == 2
    assert count(code, "mov", r"z\d+\.s, p\d+/m, za[0-3]h\.s\[w\d+, 0\]") == 8  # mova: row r of each tile
    assert count(code, "zip1") == count(code, "zip2") == 2 and count(code, "scvtf") == 8
    assert count(code, "fmlalb") == count(code, "fmlalt") == 4
    assert count(code, "fmul") == 4 and count(code, "fmla") + count(code, "fmad") == 4


def test_dot_tile_cross_compiles_to_indexed_sdot() -> None:
    code = lines(sme.DOT)
    # 4 packets per block: 8 sdot (indexed by the K group in the LHS segment) into 4 int32 vectors
    assert count(code, "sdot", r"z\d+\.s, z\d+\.b, z\d+\.b\[[0-3]\]") == 32
    assert count(code, "lsl", r"z\d+\.b, z\d+\.b, #4") == 16 and count(code, "and", r"z\d+\.b, z\d+\.b, #0xf0") == 16
    assert count(code, "ld1rqb") == 2 and count(code, "scvtf") == 4 and count(code, "fmla") == 4
    assert not [line for line in code if "za" in line.operands or line.mnemonic == "zero"]  # no ZA


@pytest.mark.parametrize("symbol", [sme.MOPA, sme.DOT])
def test_tiles_are_sme1_code_in_streaming_mode(symbol: str) -> None:
    code = lines(symbol)
    ops = collections.Counter(line.mnemonic for line in code if line.mnemonic)
    assert not [line.text for line in code if line.mnemonic and SME2_OPERAND.search(line.operands)]
    assert not ops["luti4"] and not ops["luti2"]
    assert not ops["smull"] and not ops["smull2"] and not ops["sxtl"] and not ops["smlal"]  # portable int8 code
    streaming = 2 if symbol == sme.MOPA else 1  # sm, and za for the MOPA tile: the entry point enables them
    assert ops["smstart"] == ops["smstop"] == streaming
    assert not [line for line in code if line.mnemonic == "bl" and line.operands.startswith("__arm_")]


@pytest.mark.parametrize("symbol", [sme.MOPA, sme.DOT])
@pytest.mark.parametrize("svl", [128, 256, 512])
def test_block_loop_within_kleidiai(symbol: str, svl: int) -> None:
    vl = svl // 32
    assert per_block(symbol, vl) <= KLEIDIAI_PER_BLOCK[symbol](vl)


def test_kernel_tiles_are_the_sme1_kernels() -> None:
    """The SME1 kernels have tiles on every ISA with SME (SME2 hosts run SME1 code), no other kernel has."""
    for kern in ukernels.KERNELS:
        for name, isa in native.ISAS.items():
            has = kern.name in sme.KERNELS.values() and isa.has("+sme")
            assert (sme.kernel_tile(kern, isa) is not None) == has, (kern.name, name)


def test_no_tiles_without_sme() -> None:
    """On this host (no Arm SME) nothing is installed and the SME1 chain runs the VNNI tiles or the portable jit."""
    if sme.AVAILABLE:
        pytest.fail("this test runs on hosts without Arm SME (x86 CI)")
    assert native.host_isa("aarch64-sme") is None and sme.HOST_ISA is None
    assert ukernels.SME_COMPUTE in (vnni_s4s0.compute_s4s0, jit.matmul_qsi8d32p_qsi4c32ps4s0sf16)


@pytest.mark.parametrize("svl", [128, 512])
def test_tiles_bit_exact_under_qemu(svl: int) -> None:
    ensure_emulator()
    cpu = f"max,sme-default-vector-length={svl // 8}"
    code, out, err = run_emulated(cpu, str(CHECK), python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    lines = out.strip().splitlines()
    assert lines[0] == f"native tiles: aarch64-sme, SVL {svl}"
    assert len(lines) == 4 and "DIFFERENT" not in out
    assert lines[1].endswith(f"7 calls of {sme.MOPA}") and lines[2].endswith(f"2 calls of {sme.DOT}")
    assert lines[3].endswith(" 0 tile calls")  # a kernel bound to another SVL: not the tiles
