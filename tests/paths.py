"""Where the tests' data lives: the shared golden and llama.cpp reference data beside the checkout, and the
tests' own data (golden sets of the repository's own) and snapshots."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED = TESTS.parents[1] / "shared"
GOLDEN = SHARED / "golden"
REFERENCE = SHARED / "reference"
DATA = TESTS / "data"
#: the golden sets kept in the repository (made by scripts/kleidiai-golden): the F16-LHS Q4_0 family's
F16P_GOLDEN = DATA / "golden" / "f16p_qsi4c32p"
#: llama.cpp's SME2 F32 kernels: the MOPA GEMM's and the MLA GEMV's (scripts/kleidiai-golden/make_f32p_golden.py)
F32P_GOLDEN = DATA / "golden" / "f32p_f32p"
F32_SME2_GOLDEN = DATA / "golden" / "f32_f32p"
SNAPSHOTS = TESTS / "snapshots"
