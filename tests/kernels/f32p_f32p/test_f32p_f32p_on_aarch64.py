"""llama.cpp's SME2 F32 kernels on emulated aarch64 (``scripts/qemu-aarch64``, SME2 at SVL 512): both golden sets
(the MOPA GEMM's and the MLA GEMV's, every SVL) in the jit execution, numba's code compiled for the Arm CPU."""

from __future__ import annotations

import re

from emulator import SME_GROUP, ensure_emulator, start_emulated
from paths import F32_SME2_GOLDEN, F32P_GOLDEN

pytestmark = SME_GROUP


def test_golden_jit_passes_under_qemu() -> None:
    ensure_emulator()
    cpu = "max,sme-default-vector-length=64"
    sets = (F32P_GOLDEN, F32_SME2_GOLDEN)
    runs = {golden: start_emulated(cpu, "golden", str(golden), "--execution", "jit", "-q") for golden in sets}
    for golden, count in ((F32P_GOLDEN, 36), (F32_SME2_GOLDEN, 18)):
        out, err = runs[golden].communicate(timeout=3600)
        summary = re.search(r"(\d+) passed, (\d+) failed, (\d+) skipped", out)
        assert runs[golden].returncode == 0 and summary, f"{golden.name}: {out[-1500:]}{err[-1500:]}"
        assert summary.groups() == (str(count), "0", "0"), (golden.name, summary.group(0))
