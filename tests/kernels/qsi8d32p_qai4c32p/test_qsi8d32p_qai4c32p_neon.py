"""The Q4_1 NEON kernels as native aarch64 tiles (``kernels/qsi8d32p_qai4c32p/neon.py``).

On any host: each tile cross-compiles for DotProd and I8MM with the instruction it is written for, and its hot loop
takes at most 1.25x the instructions per 1,024 MACs of KleidiAI's own kernel. Under QEMU (``scripts/qemu-aarch64``,
on a DotProd-only CPU and on one with I8MM): every NEON kernel of the family on the native tiles is bit for bit the
numpy reference (``native_tiles_check.py``); the golden runs are checked by ``kleidipy golden`` under QEMU the
same way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from emulator import NEON_GROUP, ensure_emulator, run_emulated
from kernel_helpers import mnemonics, portable_int8_lines

from kleidipy.core import native
from kleidipy.kernels.qsi8d32p_qai4c32p import neon, ukernels
from kleidipy.tools import asm

pytestmark = NEON_GROUP

CHECK = Path(__file__).resolve().parent / "native_tiles_check.py"
NEON_KERNELS = [k for k in ukernels.KERNELS if k.rhs_packer.neon]


@pytest.mark.parametrize("isa", ["aarch64-dotprod", "aarch64-i8mm"])
@pytest.mark.parametrize(("mr", "kr"), neon.SHAPES, ids=str)
def test_tiles_cross_compile_to_their_instruction(isa: str, mr: int, kr: int) -> None:
    target = native.ISAS[isa]
    text = native.assembly(neon.tile_module(mr, kr, target), target)
    ops = mnemonics(text)
    used = neon.instruction(mr, kr, target)
    assert used == ("smmla" if (isa, mr, kr) == ("aarch64-i8mm", 4, 16) else "sdot")
    macs = mr * 4 * 32  # one block of a tile: smmla 32 MACs, sdot 16
    assert ops[used] * (32 if used == "smmla" else 16) == macs
    assert ops["scvtf"] == ops["fmul"] == mr  # one conversion and one scale product per row and block
    loop = asm.hot_loop(text)
    assert loop is not None and loop.macs == macs and loop.counts["fmla"] == 2 * mr  # zero term, scale term: fused
    assert not portable_int8_lines(text)


def test_no_tiles_for_the_sme2_kernels() -> None:
    assert all(neon.kernel_tile(k, native.ISAS["aarch64-i8mm"]) is None for k in ukernels.KERNELS if k.is_sme)


def test_no_tiles_without_dotprod() -> None:
    """On this host (no Arm DotProd) nothing is installed and the jit runs the numba code."""
    if neon.AVAILABLE:
        pytest.fail("this test runs on hosts without Arm DotProd (x86 CI)")
    assert native.host_isa(*native.ISAS) is None
    assert ukernels.NEON_COMPUTE is not neon.compute


@pytest.mark.parametrize("cpu", ["cortex-a76", "max,sme=off"], ids=["dotprod", "i8mm"])
def test_tiles_bit_exact_under_qemu(cpu: str) -> None:
    ensure_emulator()
    code, out, err = run_emulated(cpu, str(CHECK), python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    lines = out.strip().splitlines()
    assert lines[0] == f"native tiles: {'aarch64-dotprod' if cpu == 'cortex-a76' else 'aarch64-i8mm'}"
    assert len(lines) == 7 and "DIFFERENT" not in out
    assert sum(line.endswith("portable") for line in lines) == 2  # the SME2 kernels through ukernels.SME2_COMPUTE
    assert sum(line.endswith("smmla") for line in lines) == (cpu != "cortex-a76")  # the I8MM GEMM
