"""scripts/qemu-aarch64: kleidipy on emulated aarch64 Linux (QEMU user mode).

The fast tests run the script without emulation (help, argument errors, where its cache goes and its status, a
download failure against a closed loopback port). One test runs `kernels` under `-cpu cortex-a76`, building the cache
first when it is missing (`scripts/qemu-aarch64 --setup`: a few hundred MB of downloads).
"""

import ast
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from emulator import SCRIPT, TIERS_GROUP, ensure_emulator, qemu_script

from kleidipy.runtime.pull import cache_dir as models_dir

pytestmark = TIERS_GROUP


def load_script() -> ModuleType:
    """The script as a module (it has no .py suffix), its ``main`` not run."""
    loader = importlib.machinery.SourceFileLoader("qemu_aarch64_script", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


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


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"KLEIDIPY_QEMU_DIR": "/q", "KLEIDIPY_CACHE": "/k", "XDG_CACHE_HOME": "/x"}, "/q"),
        ({"KLEIDIPY_CACHE": "/k", "XDG_CACHE_HOME": "/x"}, "/k/qemu-aarch64"),
        ({"KLEIDIPY_QEMU_DIR": "", "KLEIDIPY_CACHE": "/k"}, "/k/qemu-aarch64"),
        ({"XDG_CACHE_HOME": "/x"}, "/x/kleidipy/qemu-aarch64"),
        ({"XDG_CACHE_HOME": "relative"}, "/home/u/.cache/kleidipy/qemu-aarch64"),  # not absolute: ignored (XDG spec)
        ({}, "/home/u/.cache/kleidipy/qemu-aarch64"),
    ],
)
def test_cache_dir_follows_kleidipy_cache(env, want, monkeypatch):
    """$KLEIDIPY_QEMU_DIR, else qemu-aarch64/ beside the models in kleidipy's cache ($KLEIDIPY_CACHE, else the user
    cache directory platformdirs gives kleidipy)."""
    for name in ("KLEIDIPY_QEMU_DIR", "KLEIDIPY_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/home/u")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    got = load_script().cache_dir()
    assert got == Path(want)
    if not env.get("KLEIDIPY_QEMU_DIR"):
        assert got.parent == models_dir().parent  # the same cache as kleidipy's models


def test_status_names_the_cache_in_kleidipy_cache(tmp_path):
    """The script run as the tests run it: with no $KLEIDIPY_QEMU_DIR its cache is $KLEIDIPY_CACHE/qemu-aarch64
    (tests/conftest.py points $KLEIDIPY_CACHE at a temporary directory unless the caller names one), and asking
    for the status creates nothing."""
    proc = qemu_script("--status", env={"KLEIDIPY_QEMU_DIR": "", "KLEIDIPY_CACHE": str(tmp_path)})
    assert proc.returncode == 1
    assert f"cache    {tmp_path / 'qemu-aarch64'}" in proc.stdout.splitlines()
    assert list(tmp_path.iterdir()) == []
    session = qemu_script("--status")  # this session's own environment
    where = session.stdout.splitlines()[-1].removeprefix("cache    ")
    chosen = os.environ.get("KLEIDIPY_QEMU_DIR") or os.path.join(os.environ["KLEIDIPY_CACHE"], "qemu-aarch64")
    assert Path(where) == Path(chosen).absolute()


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
    assert lines[0] == "target: DOTPROD CPU (dotprod), llama.cpp's master kernel table"
    selected = {line.split()[0]: line.split()[2] for line in lines[2:] if line.rstrip().endswith(("GEMM", "GEMV"))}
    quantized = [line.split()[0] for line in lines[2:] if any(f" {q} GEM" in line for q in ("q8_0", "q4_0", "q4_1"))]
    assert len(quantized) == 6 and all(name.endswith("_neon_dotprod") for name in quantized), quantized
    assert set(selected.values()) == {"dotprod", "neon"}, selected
    assert "x86_64" not in proc.stderr  # ran as an aarch64 host, not the x86 fallback target
