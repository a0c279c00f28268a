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
