"""Where the tests' data lives: the shared golden and llama.cpp reference data beside the checkout, and the
tests' own data and snapshots."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED = TESTS.parents[1] / "shared"
GOLDEN = SHARED / "golden"
REFERENCE = SHARED / "reference"
DATA = TESTS / "data"
SNAPSHOTS = TESTS / "snapshots"
