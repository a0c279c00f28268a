"""Shared test fixtures and the test session's hermetic environment.

Nothing a test run writes lands outside temporary directories: the model cache is ``$KLEIDIPY_CACHE`` when the
caller names one (``.ci/run`` points it at a fresh directory, a developer may point it at a kept one), else a
directory made for this session and removed at its end; models are pulled into it once per session by
``model_files.model_file``. matplotlib's config/cache and hypothesis's storage directories are temporary too,
hypothesis keeps no example database and pytest no cache directory (``-p no:cacheprovider`` in pyproject.toml).
"""

import os
import shutil
import tempfile

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # kernels thread themselves; keep BLAS out of the way

from pathlib import Path

import pytest
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
    _temporary_env("KLEIDIPY_CACHE", "kleidipy-test-cache-")
    _temporary_env("MPLCONFIGDIR", "kleidipy-test-mpl-")
    _temporary_env("HYPOTHESIS_STORAGE_DIRECTORY", "kleidipy-test-hypothesis-")


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
