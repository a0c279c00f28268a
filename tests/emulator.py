"""scripts/qemu-aarch64 for the tests: run it, and build its emulation cache when missing (never a skip)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "qemu-aarch64"


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
