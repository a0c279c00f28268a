"""kleidipy.core.hwcaps: the NUMBA_CPU_FEATURES that keeps numba's LLVM from compiling SVE code on aarch64 (an
assertion abort in llvmlite's aarch64 LLVM), set only on a Linux aarch64 host with SVE and never over the user's."""

from __future__ import annotations

import os

import pytest

from kleidipy.core import hwcaps


def test_features_without_sve_or_sme() -> None:
    neoverse_v1 = frozenset({"fp", "asimd", "aes", "sha2", "crc32", "atomics", "asimdhp", "dotprod", "sve", "i8mm"})
    value = hwcaps.numba_features(neoverse_v1 | {"bf16", "sve2", "sme", "sme2"})
    assert value == "+fp-armv8,+neon,+aes,+sha2,+crc,+lse,+fullfp16,+dotprod,+i8mm,+bf16"
    assert "sve" not in value and "sme" not in value
    assert hwcaps.numba_features(frozenset({"fp", "asimd", "dotprod"})) is None  # no SVE: numba's own choice


def test_pinned_only_on_linux_arm64_with_sve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    monkeypatch.setattr(hwcaps, "is_linux_arm64", lambda: True)
    monkeypatch.setattr(hwcaps, "arm_features", lambda: (frozenset({"asimd", "sve", "dotprod"}), None))
    hwcaps.pin_numba_features()
    assert os.environ["NUMBA_CPU_FEATURES"] == "+neon,+dotprod"
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+neon")  # the user's choice stays
    hwcaps.pin_numba_features()
    assert os.environ["NUMBA_CPU_FEATURES"] == "+neon"
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
    monkeypatch.setattr(hwcaps, "is_linux_arm64", lambda: False)
    hwcaps.pin_numba_features()
    assert "NUMBA_CPU_FEATURES" not in os.environ
