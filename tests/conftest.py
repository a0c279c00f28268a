"""Shared test fixtures: where the shared golden/reference data lives."""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # kernels thread themselves; keep BLAS out of the way

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
GOLDEN = SHARED / "golden"
REFERENCE = SHARED / "reference"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    assert (GOLDEN / "manifest.json").is_file(), f"golden data missing at {GOLDEN}"
    return GOLDEN


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    assert (REFERENCE / "README.md").is_file(), f"reference data missing at {REFERENCE}"
    return REFERENCE


@pytest.fixture(autouse=True)
def split_even_small_matmuls(monkeypatch):
    """Tests use small shapes: let threads > 1 split them anyway, so the thread split is what gets tested."""
    from kleidipy.kernels import interface

    monkeypatch.setattr(interface, "MIN_SPLIT_MACS", 0)
