"""The Q8_0 SME1 kernels as native tiles for FEAT_SME without SME2 (``kernels/qai8dxp_qsi8cxp/sme.py``).

On any host: both tiles cross-compile for ``aarch64-sme`` (``+sme``, no ``+sme2``) to KleidiAI's instruction
sequence (4-way ``smopa`` into ZA0.S–ZA3.S and single-vector ``mova`` out of ZA for the MOPA GEMM, indexed SVE
``sdot`` for the DOT GEMV, the integer zero-point ``mla`` and each kernel's float epilogue), with no SME2
instruction (no ``luti4``, ZT0, multi-vector operand or predicate-as-counter), no widening NEON code nor calls of the
SME ABI's routines, and their block loops execute fewer instructions than KleidiAI's per 32 K values. Under QEMU
(``scripts/qemu-aarch64``, SVL 128): both kernels bound to the host's SVL run on the tiles, bit for bit the numpy
reference and the portable jit (``sme_tiles_check.py``). QEMU has no CPU with SME but not SME2 (``max,sme2=off``:
no such property), so the emulated CPU is ``max`` and the check installs the tiles itself, compiled for ``+sme``.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
from emulator import SME_GROUP, ensure_emulator, run_emulated

from kleidipy.core import native
from kleidipy.kernels.qai8dxp_qsi8cxp import sme
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as fam
from kleidipy.tools import asm

pytestmark = SME_GROUP

CHECK = Path(__file__).resolve().parent / "sme_tiles_check.py"
ISA = native.ISAS["aarch64-sme"]
#: executed instructions per block loop iteration of 32 K values of KleidiAI's kernels (their ``_asm.S``):
#: MOPA ``label_3`` 13 per K group of 4, DOT ``label_3`` 45 per 16 K values
KLEIDIAI_BLOCK = {sme.MOPA: 8 * 13, sme.DOT: 2 * 45}
#: what SME2 adds, none of which an SME1 tile may hold: ZT0, multi-vector operands ({z0 - z3}, vgx2/vgx4 groups),
#: predicate-as-counter registers
SME2_OPERAND = re.compile(r"zt0|vgx\d|\{ z\d+\.\w - z\d+\.\w \}|\bpn\d+")


def lines(symbol: str) -> list[asm.Line]:
    return asm.parse(native.assembly(sme.tile_module(symbol), ISA))


def count(code: list[asm.Line], mnemonic: str, operands: str = ".*") -> int:
    return sum(line.mnemonic == mnemonic and re.fullmatch(operands, line.operands) is not None for line in code)


def innermost(code: list[asm.Line], mnemonic: str) -> list[asm.Line]:
    """The instructions of the smallest loop holding ``mnemonic``."""
    spans = [[line for line in code[a : b + 1] if line.mnemonic] for a, b in asm.loops(code)]
    return min((s for s in spans if any(line.mnemonic == mnemonic for line in s)), key=len)


def test_mopa_tile_cross_compiles_to_smopa() -> None:
    code = lines(sme.MOPA)
    block = innermost(code, "smopa")  # 8 K groups: 4 smopa (4-way, ZA0.S .. ZA3.S) on 1 LHS and 4 RHS vectors
    assert count(block, "smopa", r"za[0-3]\.s, p\d+/m, p\d+/m, z\d+\.b, z\d+\.b") == count(code, "smopa") == 32
    assert count(block, "ldr", r"z\d+, .*") + count(block, "ld1b") == 40
    assert count(code, "zero", r"\{za\}") == 1
    # per row: mova of row r of each tile, the zero-point mla, scvtf, f32(f32(F·S) + bias)
    assert count(code, "mov", r"z\d+\.s, p\d+/m, za[0-3]h\.s\[w\d+, 0\]") == 4
    assert count(code, "mla") == count(code, "scvtf") == 4
    assert count(code, "fmul") == 8 and count(code, "fadd") == 4
    assert not count(code, "fmla") and not count(code, "fmad")  # FMUL_FADD: never fused


def test_dot_tile_cross_compiles_to_indexed_sdot() -> None:
    code = lines(sme.DOT)
    block = innermost(code, "sdot")  # 32 K values: 2 ld1rqb of 16 LHS bytes, per K group 4 RHS vectors, 4 sdot
    assert count(block, "sdot", r"z\d+\.s, z\d+\.b, z\d+\.b\[[0-3]\]") == count(code, "sdot") == 32
    assert count(block, "ld1rqb") == 2 and count(block, "ldr", r"z\d+, .*") + count(block, "ld1b") == 32
    assert not count(code, "zero") and not [line for line in code if "za" in line.operands]  # no ZA
    assert count(code, "mla") == count(code, "scvtf") == 4
    assert count(code, "fmul") == 4 and count(code, "fmla") + count(code, "fmad") == 4  # FMA_BIAS
    assert not count(code, "fadd")


@pytest.mark.parametrize("symbol", [sme.MOPA, sme.DOT])
def test_tiles_are_sme1_code_in_streaming_mode(symbol: str) -> None:
    code = lines(symbol)
    assert not [line.text for line in code if line.mnemonic and SME2_OPERAND.search(line.operands)]
    ops = collections.Counter(line.mnemonic for line in code if line.mnemonic)
    assert not any(ops[m] for m in ("luti2", "luti4", "smull", "smull2", "sxtl", "sxtl2", "smlal", "smlal2"))
    assert ops["smstart"] == ops["smstop"] == (2 if symbol == sme.MOPA else 1)  # sm, and za for MOPA
    assert not [line for line in code if line.mnemonic == "bl" and line.operands.startswith("__arm_")]


@pytest.mark.parametrize("symbol", [sme.MOPA, sme.DOT])
def test_block_loop_within_kleidiai(symbol: str) -> None:
    """Executed instructions per 32 K values (the same MACs at any SVL): at most KleidiAI's."""
    assert len(innermost(lines(symbol), "smopa" if symbol == sme.MOPA else "sdot")) <= KLEIDIAI_BLOCK[symbol]


def test_kernel_tiles_are_the_sme_kernels_on_sme1() -> None:
    """The SME kernels' tiles for ``aarch64-sme`` only (on SME2 the SME2 tiles run them)."""
    for kern in fam.KERNELS:
        for name, isa in native.ISAS.items():
            has = kern.name in sme.KERNELS.values() and name == "aarch64-sme"
            assert (sme.kernel_tile(kern, isa) is not None) == has, (kern.name, name)


def test_no_tiles_without_sme_or_with_sme2() -> None:
    """On this host (no Arm SME, or SME2) nothing is installed."""
    if sme.AVAILABLE:
        pytest.fail("this test runs on hosts without Arm SME or with SME2 (x86 CI)")
    assert sme.HOST_ISA is None


def test_tiles_bit_exact_under_qemu() -> None:
    ensure_emulator()
    code, out, err = run_emulated("max,sme-default-vector-length=16", str(CHECK), python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    lines_ = out.strip().splitlines()
    assert lines_[0].startswith("native tiles: aarch64-sme ") and lines_[0].endswith("SVL 128")
    assert len(lines_) == 4 and "DIFFERENT" not in out
    assert lines_[1].endswith(f"12 of {sme.MOPA}") and lines_[2].endswith(f"12 of {sme.DOT}")
    assert lines_[3].endswith(" 0 tile calls")
