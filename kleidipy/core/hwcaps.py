"""The Arm CPU features of this host from Linux's auxiliary vector (HWCAP/HWCAP2) and the SME vector length, and
the code-generation features numba is given on such a host.

:func:`pin_numba_features` (run by ``import kleidipy``, before numba is imported) works around an LLVM bug: the
LLVM 22 inside llvmlite's aarch64 wheels has assertions on and aborts the whole process while compiling kleidipy's
kernels for a CPU with SVE (llvm/llvm-project#177925, fixed upstream by #177976) — on Graviton 3/4, Grace,
Neoverse V1/V2, or QEMU's ``max``. On a Linux aarch64 host whose HWCAP has SVE, and unless the user set it,
``NUMBA_CPU_FEATURES`` becomes the host's own features without SVE/SME (kleidipy's kernels use no SVE code).
"""

from __future__ import annotations

import ctypes
import os
import platform

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


def arm_features() -> tuple[frozenset[str], int | None]:
    """Arm features of this host from the auxiliary vector, and the SME vector length in bits (Linux aarch64 only)."""
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


def numba_features(features: frozenset[str]) -> str | None:
    """The ``NUMBA_CPU_FEATURES`` value for a CPU with these HWCAP features: None without SVE (numba's own choice
    is fine), else its features in LLVM's names, SVE and SME left out."""
    if "sve" not in features:
        return None
    return ",".join(_LLVM[f] for f in _LLVM if f in features)


def pin_numba_features() -> None:
    """Set ``NUMBA_CPU_FEATURES`` on a Linux aarch64 host with SVE unless it is set (module docstring)."""
    if "NUMBA_CPU_FEATURES" in os.environ or not is_linux_arm64():
        return
    value = numba_features(arm_features()[0])
    if value is not None:
        os.environ["NUMBA_CPU_FEATURES"] = value
