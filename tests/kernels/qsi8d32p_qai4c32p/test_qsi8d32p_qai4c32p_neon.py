"""The Q4_1 NEON kernels as native aarch64 tiles (``kernels/qsi8d32p_qai4c32p/neon.py``).

On any host: each tile cross-compiles for DotProd and I8MM with the instruction it is written for, and its hot loop
takes at most 1.25x the instructions per 1,024 MACs of KleidiAI's own kernel. Under QEMU (``scripts/qemu-aarch64``,
on a DotProd-only CPU and on one with I8MM): every NEON kernel of the family on the native tiles is bit for bit the
numpy reference (``native_tiles_check.py``); the golden runs are checked by ``kleidipy golden`` under QEMU the
same way.
"""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest
from emulator import SCRIPT, ensure_emulator

from kleidipy.core import native
from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.qsi8d32p_qai4c32p import neon, ukernels
from kleidipy.tools import asm
from kleidipy.tools.kernel_asm import kleidiai_counts

CHECK = Path(__file__).resolve().parent / "native_tiles_check.py"
NEON_KERNELS = [k for k in ukernels.KERNELS if k.rhs_packer.neon]


def mnemonics(text: str) -> collections.Counter:
    return collections.Counter(
        line.split()[0] for line in text.splitlines() if line.startswith("\t") and not line.lstrip().startswith(".")
    )


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
    widening = [line for line in text.splitlines() if line.split()[:1] in (["smull"], ["smull2"], ["smlal"], ["sxtl"])]
    vector_mul = [line for line in text.splitlines() if line.split()[:1] in (["mul"], ["mla"]) and "\tv" in line]
    assert not widening and not vector_mul  # what LLVM makes of portable int8 code


@pytest.mark.parametrize("kern", NEON_KERNELS, ids=lambda k: k.name)
def test_hot_loop_within_budget_of_kleidiai(kern: MatmulKernel) -> None:
    """The kernel's tile on its own ISA: at most 1.25x the instructions per 1,024 MACs of KleidiAI's block loop."""
    target = native.ISAS["aarch64-i8mm" if kern.tier == "i8mm" else "aarch64-dotprod"]
    module = neon.kernel_tile(kern, target)
    assert module is not None and neon.kernel_tile(kern, native.ISAS["x86-vnni"]) is None
    loop = asm.hot_loop(native.assembly(module, target))
    kai = kleidiai_counts()["kernels"][kern.name]
    assert loop is not None and loop.per_1024_macs() <= 1.25 * kai["instructions"] * 1024 / kai["macs_at_svl512"]


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
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", cpu, "--python", "--", str(CHECK)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"native tiles: {'aarch64-dotprod' if cpu == 'cortex-a76' else 'aarch64-i8mm'}"
    assert len(lines) == 7 and "DIFFERENT" not in proc.stdout
    assert sum(line.endswith("portable") for line in lines) == 2  # the SME2 kernels through neon.matmul
    assert sum(line.endswith("smmla") for line in lines) == (cpu != "cortex-a76")  # the I8MM GEMM
