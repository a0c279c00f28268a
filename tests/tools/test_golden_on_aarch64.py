"""Issue 17: the golden set on emulated aarch64 (``scripts/qemu-aarch64``), jit execution, on a CPU of each tier —
``cortex-a76`` (DotProd), ``max,sme=off`` (I8MM) and ``max,sme-default-vector-length=64`` (SME2 at SVL 512) — so the
native tiles each CPU compiles for itself (``sdot``, ``smmla``, SME2) are checked against KleidiAI's own outputs.

The three runs go side by side (each compiles the kernels under emulation: several minutes after a source change).
"""

from __future__ import annotations

import re
from pathlib import Path

from emulator import TIERS_GROUP, ensure_emulator, start_emulated

pytestmark = TIERS_GROUP

CPUS = ("cortex-a76", "max,sme=off", "max,sme-default-vector-length=64")


def test_golden_jit_passes_on_each_arm_tier(golden_dir: Path) -> None:
    ensure_emulator()
    runs = {cpu: start_emulated(cpu, "golden", str(golden_dir), "--execution", "jit", "-q") for cpu in CPUS}
    for cpu, proc in runs.items():
        out, err = proc.communicate(timeout=3600)
        summary = re.search(r"(\d+) passed, (\d+) failed", out)
        assert proc.returncode == 0 and summary, f"{cpu}: {out[-1500:]}{err[-1500:]}"
        assert int(summary.group(1)) >= 496 and summary.group(2) == "0", (cpu, summary.group(0))
