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
    # (set, then deleted: monkeypatch then restores the variable as it was before the test, whatever
    # pin_numba_features writes to os.environ itself — a value left here would reach every later subprocess)
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "")
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
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


#: ``sysctl hw.optional`` of an Apple M4 (SME2, SVL 512) — the keys kleidipy reads, and others it ignores
M4_SYSCTL = {
    "hw.optional.floatingpoint": 1,
    "hw.optional.AdvSIMD": 1,
    "hw.optional.arm.FEAT_FP16": 1,
    "hw.optional.arm.FEAT_DotProd": 1,
    "hw.optional.arm.FEAT_I8MM": 1,
    "hw.optional.arm.FEAT_BF16": 1,
    "hw.optional.arm.FEAT_SME": 1,
    "hw.optional.arm.FEAT_SME2": 1,
    "hw.optional.arm.sme_max_svl_b": 64,
    "hw.optional.arm.FEAT_SHA3": 1,
}


def test_macos_features_from_sysctl() -> None:
    feats, svl = hwcaps._sysctl_features(lambda name: M4_SYSCTL.get(name, 0))
    assert feats == {"fp", "asimd", "asimdhp", "dotprod", "i8mm", "bf16", "sme", "sme2"}
    assert svl == 512
    m1 = {k: v for k, v in M4_SYSCTL.items() if "SME" not in k and "sme" not in k and "I8MM" not in k}
    feats, svl = hwcaps._sysctl_features(lambda name: m1.get(name, 0))
    assert "sme" not in feats and "i8mm" not in feats and "dotprod" in feats and svl is None


def test_macos_host_is_detected_and_never_pins_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Apple silicon Mac is an Arm host (target and native tiles from sysctl); it has no SVE, so numba's
    features are its own choice."""
    from kleidipy import target
    from kleidipy.core import native

    monkeypatch.setattr(hwcaps.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(hwcaps.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(hwcaps, "_sysctl_int", lambda name: M4_SYSCTL.get(name, 0))
    assert hwcaps.is_arm64_host() and not hwcaps.is_linux_arm64()
    found = target.detect_target()
    assert (found.name, found.svl_bits, found.virtual) == ("sme2", 512, False)
    assert native.host_isa("aarch64-sme2", "aarch64-i8mm") is native.ISAS["aarch64-sme2"]
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    hwcaps.pin_numba_features()
    assert "NUMBA_CPU_FEATURES" not in os.environ
