"""The Arm CPU features of this host (Linux's HWCAP/HWCAP2, or macOS's ``sysctl hw.optional.arm.FEAT_*``), the SME
vector length, and the code-generation features numba is given on such a host (:func:`pin_numba_features`: a
workaround for an LLVM bug on SVE hosts).

Details: docs/host-features.md."""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable

# Linux arm64 auxiliary-vector entries and bits (asm/hwcap.h).
_AT_HWCAP, _AT_HWCAP2 = 16, 26
_HWCAP_BITS = {
    "fp": 1 << 0,
    "asimd": 1 << 1,
    "aes": 1 << 3,
    "sha2": 1 << 6,
    "crc32": 1 << 7,
    "atomics": 1 << 8,
    "asimdhp": 1 << 10,
    "dotprod": 1 << 20,
    "sve": 1 << 22,
}
_HWCAP2_BITS = {"sve2": 1 << 1, "i8mm": 1 << 13, "bf16": 1 << 14, "sme": 1 << 23, "sme2": 1 << 37}
_PR_SME_GET_VL, _PR_SME_VL_LEN_MASK = 64, 0xFFFF
#: macOS arm64: the sysctl that reports each feature (as its HWCAP name), and the SME vector length in bytes
_SYSCTL_FEATURES = {
    "fp": "hw.optional.floatingpoint",
    "asimd": "hw.optional.AdvSIMD",
    "asimdhp": "hw.optional.arm.FEAT_FP16",
    "dotprod": "hw.optional.arm.FEAT_DotProd",
    "i8mm": "hw.optional.arm.FEAT_I8MM",
    "bf16": "hw.optional.arm.FEAT_BF16",
    "sme": "hw.optional.arm.FEAT_SME",
    "sme2": "hw.optional.arm.FEAT_SME2",
}
_SYSCTL_SVL_BYTES = "hw.optional.arm.sme_max_svl_b"
#: LLVM's names of the HWCAP features numba may compile for
_LLVM = {
    "fp": "+fp-armv8",
    "asimd": "+neon",
    "aes": "+aes",
    "sha2": "+sha2",
    "crc32": "+crc",
    "atomics": "+lse",
    "asimdhp": "+fullfp16",
    "dotprod": "+dotprod",
    "i8mm": "+i8mm",
    "bf16": "+bf16",
}


def is_linux_arm64() -> bool:
    """Whether this host is Linux on aarch64 (where the auxiliary vector tells the Arm features)."""
    return platform.system() == "Linux" and platform.machine().lower() in ("aarch64", "arm64")


def is_macos_arm64() -> bool:
    """Whether this host is macOS on Apple silicon (where sysctl tells the Arm features)."""
    return platform.system() == "Darwin" and platform.machine().lower() == "arm64"


def is_arm64_host() -> bool:
    """Whether kleidipy can read this host's Arm features (Linux aarch64 or macOS arm64)."""
    return is_linux_arm64() or is_macos_arm64()


def arm_features() -> tuple[frozenset[str], int | None]:
    """Arm features of this host (HWCAP names) and the SME vector length in bits: Linux aarch64 (auxiliary vector)
    or macOS arm64 (sysctl)."""
    if is_macos_arm64():
        return _sysctl_features(_sysctl_int)
    libc = ctypes.CDLL(None, use_errno=True)
    getauxval = libc.getauxval
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    hwcap, hwcap2 = getauxval(_AT_HWCAP), getauxval(_AT_HWCAP2)
    feats = {f for f, bit in _HWCAP_BITS.items() if hwcap & bit}
    feats |= {f for f, bit in _HWCAP2_BITS.items() if hwcap2 & bit}
    svl = None
    if "sme" in feats:
        ret = libc.prctl(_PR_SME_GET_VL, 0, 0, 0, 0)
        if ret > 0:
            svl = (ret & _PR_SME_VL_LEN_MASK) * 8
    return frozenset(feats), svl


def _sysctl_int(name: str) -> int:
    """The integer value of a macOS sysctl (0 when it does not exist)."""
    libc = ctypes.CDLL(None)
    value, size = ctypes.c_int64(0), ctypes.c_size_t(8)
    if libc.sysctlbyname(name.encode(), ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
        return 0
    return value.value & ((1 << (8 * size.value)) - 1)


def _sysctl_features(read: Callable[[str], int]) -> tuple[frozenset[str], int | None]:
    """:func:`arm_features` from macOS sysctls read by ``read(name)``: a feature is present when its sysctl is 1."""
    feats = frozenset(f for f, name in _SYSCTL_FEATURES.items() if read(name) == 1)
    svl_bytes = read(_SYSCTL_SVL_BYTES) if "sme" in feats else 0
    return feats, (svl_bytes * 8 if svl_bytes > 0 else None)


def numba_features(features: frozenset[str]) -> str | None:
    """The ``NUMBA_CPU_FEATURES`` value for a CPU with these HWCAP features: None without SVE (numba's own choice
    is fine), else its features in LLVM's names, SVE and SME left out."""
    if "sve" not in features:
        return None
    return ",".join(_LLVM[f] for f in _LLVM if f in features)


def pin_numba_features() -> None:
    """Set ``NUMBA_CPU_FEATURES`` on a Linux aarch64 host with SVE unless it is set (docs/host-features.md)."""
    if "NUMBA_CPU_FEATURES" in os.environ or not is_linux_arm64():
        return
    value = numba_features(arm_features()[0])
    if value is not None:
        os.environ["NUMBA_CPU_FEATURES"] = value
