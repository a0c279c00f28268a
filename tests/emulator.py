"""scripts/qemu-aarch64 for the tests: run it, and build its emulation cache when missing (never a skip)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "qemu-aarch64"

# The emulated tests' groups for pytest-xdist (a module's ``pytestmark``): one worker runs a group's tests in turn,
# so that the numba cache they share (one per CPU but for the SVL: scripts/qemu-aarch64) is compiled under QEMU
# once, while the other worker runs the rest. tests/conftest.py starts these groups first, in this order.
#: tests on ``max,sme-default-vector-length=N`` CPUs (SME, SME2)
SME_GROUP = pytest.mark.xdist_group("qemu-sme")
#: tests on ``cortex-a76`` (DotProd) and ``max,sme=off`` (I8MM, BF16) CPUs
NEON_GROUP = pytest.mark.xdist_group("qemu-neon")
#: tests that run several CPUs side by side
TIERS_GROUP = pytest.mark.xdist_group("qemu-tiers")
GROUPS = ("qemu-sme", "qemu-neon", "qemu-tiers")


def qemu_script(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the script with ``args`` (stdout/stderr captured as text)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


def ensure_emulator() -> None:
    """Build the emulation cache (Debian's QEMU, an arm64 sysroot, PyPI's aarch64 wheels) when it is missing; a
    failed build is one clear assertion."""
    if qemu_script("--status").returncode == 0:
        return
    proc = qemu_script("--setup", timeout=1800)
    assert proc.returncode == 0, f"scripts/qemu-aarch64 --setup failed: {proc.stderr.strip()[-500:]}"


def start_emulated(cpu: str, *args: str, python: bool = False) -> subprocess.Popen:
    """Start ``scripts/qemu-aarch64 --cpu CPU [--python] -- ARGS`` (kleidipy's arguments, or with ``python`` a script
    and its arguments) with stdout and stderr piped as text: runs on several CPUs go side by side."""
    flags = ["--python"] if python else []
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--cpu", cpu, *flags, "--", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_emulated(cpu: str, *args: str, python: bool = False, timeout: float = 3600) -> tuple[int, str, str]:
    """:func:`start_emulated` and wait: (return code, stdout, stderr)."""
    proc = start_emulated(cpu, *args, python=python)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
