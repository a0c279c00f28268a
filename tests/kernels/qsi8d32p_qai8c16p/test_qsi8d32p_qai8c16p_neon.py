"""The exact-weight family's kernels as native aarch64 tiles (``kernels/qsi8d32p_qai8c16p/neon.py``).

On any host: each tile cross-compiles for DotProd with ``sdot`` in its hot loop (``kleidipy kernels --asm``; KleidiAI
has no such kernel to compare with) and no portable int8 code. Under QEMU (``scripts/qemu-aarch64`` on a DotProd
CPU): both kernels on the native tiles are bit for bit the numpy reference, and so is the jit execution at 1 and 2
threads (``native_tiles_check.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from emulator import NEON_GROUP, ensure_emulator, run_emulated
from kernel_helpers import mnemonics, portable_int8_lines

from kleidipy.core import native
from kleidipy.kernels.qsi8d32p_qai8c16p import neon, ukernels
from kleidipy.tools.kernel_asm import listing

pytestmark = NEON_GROUP

CHECK = Path(__file__).resolve().parent / "native_tiles_check.py"


@pytest.mark.parametrize(("mr", "kr"), neon.SHAPES, ids=str)
def test_tiles_cross_compile_to_sdot(mr: int, kr: int) -> None:
    """Per 16-block: mr × 16 sdot for the dots (4 quads × 4 column vectors) and, when some offset is not ±0, 4 for
    Σq; per row and vector one scvtf, two fmul (scale·rc, offset·rc) and two fused fmla."""
    target = native.ISAS["aarch64-dotprod"]
    text = native.assembly(neon.tile_module(mr, kr, target), target)
    ops = mnemonics(text)
    assert ops["sdot"] == 4 + 16 * mr and ops["fmla"] == ops["fmul"] == 8 * mr and ops["scvtf"] == 1 + 4 * mr
    kern = next(k for k in ukernels.KERNELS if k.mr == mr)
    loop = listing(kern, "aarch64-dotprod").loop
    assert loop.counts["sdot"] >= 16 * mr and loop.counts["fmla"] >= 4 * mr
    assert not portable_int8_lines(text)


def test_no_tiles_without_dotprod() -> None:
    """On this host (no Arm DotProd) nothing is installed and the jit runs the VNNI tile or the numba loops."""
    if neon.AVAILABLE:
        pytest.fail("this test runs on hosts without Arm DotProd (x86 CI)")
    assert ukernels.COMPUTE is not neon.compute
    assert neon.kernel_tile(ukernels.KERNELS[0], native.ISAS["x86-vnni"]) is None


def test_tiles_bit_exact_under_qemu() -> None:
    ensure_emulator()
    code, out, err = run_emulated("cortex-a76", str(CHECK), python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    lines = out.strip().splitlines()
    assert lines[0] == "native tiles: aarch64-dotprod"
    assert len(lines) == 3 and "DIFFERENT" not in out
