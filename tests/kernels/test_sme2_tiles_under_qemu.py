"""The native SME2 tiles of the families with golden sets in the repository (``kernels/<family>/sme2.py``) under QEMU
(``scripts/qemu-aarch64``, SME2 at SVL 128, 256 and 512): the kernel bound to the host's SVL runs on the tile, bit
for bit the golden data of that SVL and the numpy reference at 1 and 2 threads (``sme2_tile_check.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from emulator import SME_GROUP, ensure_emulator, run_emulated

pytestmark = SME_GROUP

CHECK = Path(__file__).resolve().parent / "sme2_tile_check.py"
#: family -> its golden runs at one SVL
GOLDEN_RUNS = {"f16p_qsi4c32p": 10, "f32p_f32p": 12, "f32_f32p": 6}


@pytest.mark.parametrize("svl", [128, 256, 512])
@pytest.mark.parametrize("family", sorted(GOLDEN_RUNS))
def test_tile_bit_exact_under_qemu(family: str, svl: int) -> None:
    ensure_emulator()
    code, out, err = run_emulated(f"max,sme-default-vector-length={svl // 8}", str(CHECK), family, python=True)
    assert code == 0, out[-2000:] + err[-2000:]
    runs = GOLDEN_RUNS[family]
    assert out.strip().splitlines() == [
        f"native tile: aarch64-sme2, SVL {svl}",
        f"golden runs at SVL {svl}: {runs} of {runs} bit-exact",
        "random shapes: 8 of 8 bit-exact at 1 and 2 threads",
    ]
