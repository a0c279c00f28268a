"""Shared test fixtures and the test session's hermetic environment.

Nothing a test run writes lands outside temporary directories: the model cache is ``$KLEIDIPY_CACHE`` when the
caller names one (``.ci/run`` points it at a fresh directory, a developer may point it at a kept one), else a
directory made for this session and removed at its end; models are pulled into it once per session by
``model_files.model_file``. ``scripts/qemu-aarch64`` builds its emulation cache (QEMU, the arm64 sysroot, the aarch64
wheels: ~380 MB) in ``$KLEIDIPY_CACHE/qemu-aarch64`` unless ``$KLEIDIPY_QEMU_DIR`` names another place, so it is
warm across one CI run and for a developer who keeps a cache, and never under the user's home by default. matplotlib's
config/cache and hypothesis's storage directories are temporary too, hypothesis keeps no example database and pytest
no cache directory (``-p no:cacheprovider`` in pyproject.toml).

The tests run on two pytest-xdist workers (``-n auto --dist loadgroup`` in pyproject.toml; ``-n 0`` runs them
in this process): each test module is a unit one worker runs whole, and the emulated tests' groups
(``emulator.GROUPS``) go first, so that the worker that takes the longest one (the SME CPUs') never waits behind
another. Two workers, because the machine CI runs on has two cores and a QEMU run takes one.
"""

import os
import shutil
import tempfile

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # kernels thread themselves; keep BLAS out of the way
# a first run's compiled plan is built in the foreground here (no process outlives a test); tests of the background
# build set it themselves
os.environ["KLEIDIPY_BACKGROUND_COMPILE"] = "0"
# the model a test loads when it names none: SmolLM2 135M, which the tests were written for (fast on two cores); the
# tests of the default model itself (README's examples) unset it
os.environ["KLEIDIPY_MODEL"] = "smollm2-135m-instruct"

from pathlib import Path

import pytest
from emulator import GROUPS
from hypothesis import settings
from paths import GOLDEN, REFERENCE  # noqa: E402

settings.register_profile("hermetic", database=None)  # nothing written to .hypothesis/ in the checkout
settings.load_profile("hermetic")

_SESSION_DIRS: list[str] = []


def _temporary_env(name: str, prefix: str) -> None:
    if not os.environ.get(name):
        path = tempfile.mkdtemp(prefix=prefix)
        _SESSION_DIRS.append(path)
        os.environ[name] = path


def pytest_configure(config: pytest.Config) -> None:
    _temporary_env("KLEIDIPY_CACHE", "kleidipy-test-cache-")  # models, repack cache and the QEMU emulation cache
    _temporary_env("MPLCONFIGDIR", "kleidipy-test-mpl-")
    _temporary_env("HYPOTHESIS_STORAGE_DIRECTORY", "kleidipy-test-hypothesis-")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers (or one on one core) — more would each load their models for little gain."""
    return min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@pytest.hookimpl(tryfirst=True)  # (before xdist's own hook reads the groups)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in an xdist group: its module's unless it names one; the emulated groups first, in GROUPS' order
    (the rest keep theirs)."""
    order = {name: i for i, name in enumerate(GROUPS)}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: order.get(item.get_closest_marker("xdist_group").args[0], len(order)))


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _SESSION_DIRS:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    assert (GOLDEN / "manifest.json").is_file(), f"golden data missing at {GOLDEN}"
    return GOLDEN


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    assert (REFERENCE / "README.md").is_file(), f"reference data missing at {REFERENCE}"
    return REFERENCE
