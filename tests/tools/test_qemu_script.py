"""scripts/qemu-aarch64: kleidipy on emulated aarch64 Linux (QEMU user mode).

The fast tests run the script without emulation (help, argument errors, cache status, a download failure against a
closed loopback port). One test runs `kernels` under `-cpu cortex-a76`, building the cache first when it is missing
(`scripts/qemu-aarch64 --setup`: a few hundred MB of downloads).
"""

import ast
import os
import sys

import pytest
from emulator import SCRIPT, TIERS_GROUP, ensure_emulator, qemu_script

pytestmark = TIERS_GROUP


def test_help():
    proc = qemu_script("--help")
    assert proc.returncode == 0
    for word in ("--cpu", "max,sme=off", "cortex-a76", "sme-default-vector-length", "KLEIDIPY_QEMU_DIR", "--"):
        assert word in proc.stdout


def test_is_executable_and_standard_library_only():
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/usr/bin/env python3\n")
    tree = ast.parse(SCRIPT.read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
    }
    imported -= {"__future__", "pip"}  # pip: only probed for (the host's pip downloads the aarch64 wheels)
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to run"),
        (["run", "-p", "hello"], "put kleidipy's arguments after --"),
        (["--bogus", "--", "kernels"], "unrecognized arguments: --bogus"),
        (["--cpu", "", "--", "kernels"], "bad --cpu"),
        (["--cpu"], "expected one argument"),
    ],
)
def test_argument_errors(args, message, tmp_path):
    proc = qemu_script(*args, env={"KLEIDIPY_QEMU_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "cache").exists()  # nothing built on an argument error


def test_status_of_an_empty_cache_builds_nothing(tmp_path):
    proc = qemu_script("--status", env={"KLEIDIPY_QEMU_DIR": str(tmp_path)})
    assert proc.returncode == 1
    assert "qemu     missing" in proc.stdout and "sysroot  missing" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_download_failure_is_one_clear_line(tmp_path):
    """A mirror that answers nothing (a closed loopback port): exit 1 and a single `error:` line, no traceback."""
    proc = qemu_script(
        "--cpu",
        "cortex-a76",
        "--",
        "kernels",
        env={"KLEIDIPY_QEMU_DIR": str(tmp_path), "KLEIDIPY_QEMU_MIRROR": "http://127.0.0.1:9/debian"},
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("qemu-aarch64: error: ")
    assert proc.stdout == ""
    assert not (tmp_path / "qemu" / "qemu-aarch64").exists()


def test_kernels_under_cortex_a76():
    """The DotProd-only CPU: the target line names it, the quantized GEMM/GEMV picks are the dotprod tier (f16 runs
    on the NEON f32 kernel) and nothing of the i8mm/bf16/SME tiers is selected."""
    ensure_emulator()
    proc = qemu_script("--cpu", "cortex-a76", "--", "kernels", timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "target: DOTPROD CPU (dotprod)"
    selected = {line.split()[0]: line.split()[2] for line in lines[2:] if line.rstrip().endswith(("GEMM", "GEMV"))}
    quantized = [line.split()[0] for line in lines[2:] if any(f" {q} GEM" in line for q in ("q8_0", "q4_0", "q4_1"))]
    assert len(quantized) == 6 and all(name.endswith("_neon_dotprod") for name in quantized), quantized
    assert set(selected.values()) == {"dotprod", "neon"}, selected
    assert "x86_64" not in proc.stderr  # ran as an aarch64 host, not the x86 fallback target
