"""Issue 17: the compiled plan's MUL_MAT routines on emulated aarch64 (``scripts/qemu-aarch64``) run the native tiles
and give the reference's bits: ``plan_matmul_check.py`` on an SME2 CPU at SVL 512, which also has DotProd and I8MM
(the NEON kernels on their sdot/smmla tiles, the SME2 ones on theirs; the routing is the same code on every CPU,
and each tile's bits on each CPU are checked by the families' tile tests). Compiling the graph's matmul
dispatcher under emulation takes a few minutes."""

from __future__ import annotations

from pathlib import Path

from emulator import SME_GROUP, ensure_emulator, run_emulated

pytestmark = SME_GROUP

CHECK = Path(__file__).resolve().parent / "plan_matmul_check.py"
CPU = "max,sme-default-vector-length=64"


def test_plan_matmul_bits_on_arm() -> None:
    ensure_emulator()
    code, out, err = run_emulated(CPU, str(CHECK), python=True)
    assert code == 0, f"{out[-1500:]}{err[-1500:]}"
    assert "DIFFERENT" not in out and "PORTABLE" not in out and len(out.strip().splitlines()) >= 15, out
