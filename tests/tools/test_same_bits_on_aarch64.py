"""Issue 18: the same model, target and prompt give the same greedy text and bit-identical logits on this x86 host
and on emulated aarch64 (``scripts/qemu-aarch64``), for every architecture kleidipy runs and the I8MM and SME2
targets.

Each test runs ``greedy_bits.py`` (the prompt's last logits and 8 greedy steps, hashed row by row): here with the
compiled plan, under QEMU op by op (the reference execution; the two are bit-identical on each host,
tests/graph/test_plan.py), on a CPU of the target's tier — ``max,sme=off`` (NEON with I8MM) for i8mm and
``max,sme-default-vector-length=64`` (SME2, SVL 512) for sme2. The two QEMU runs of a model go side by side. The
emulation cache is built on first use (``scripts/qemu-aarch64 --setup``: Debian and PyPI downloads); every kleidipy
source change makes the emulated numba compile everything again, a few minutes per CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from emulator import SCRIPT, TIERS_GROUP, ensure_emulator
from greedy_bits import greedy_bits
from model_files import GEMMA3, QWEN25, SMOLLM2, model_file

pytestmark = TIERS_GROUP

TOOL = Path(__file__).resolve().parent / "greedy_bits.py"
#: target -> the QEMU CPU of its tier
CPUS = {"i8mm": "max,sme=off", "sme2:svl=512": "max,sme-default-vector-length=64"}
PROMPT = "The capital of France is"


@pytest.mark.parametrize("name", [SMOLLM2, QWEN25, GEMMA3], ids=["llama", "qwen2", "gemma3"])
def test_greedy_text_and_logits_bits_match_emulated_aarch64(name: str) -> None:
    ensure_emulator()
    model = str(model_file(name))
    runs = {
        target: subprocess.Popen(
            [sys.executable, str(SCRIPT), "--cpu", cpu, "--python", "--", str(TOOL), model, target, PROMPT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for target, cpu in CPUS.items()
    }
    here = {target: greedy_bits(model, target, PROMPT, 8, graph=True) for target in CPUS}
    for target, proc in runs.items():
        out, err = proc.communicate(timeout=3600)
        assert proc.returncode == 0, f"{target} under QEMU: {err.strip()[-800:]}"
        there = json.loads(out.strip().splitlines()[-1])
        assert there["tokens"] == here[target]["tokens"], (target, there["text"], here[target]["text"])
        assert there["logits_sha256"] == here[target]["logits_sha256"], target
