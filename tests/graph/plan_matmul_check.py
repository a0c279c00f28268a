"""Run by path on an aarch64 host (the tests run it under ``scripts/qemu-aarch64 --python``): the compiled plan's
MUL_MAT routines (:mod:`kleidipy.graph.matmul`: LHS pack and column split) of every int8 NEON kernel — and of the
SME2 ones, the F32 ones too, when the host has SME2, bound to its SVL — against the numpy reference, bit for bit, at
1 and 2 threads, the NEON kernels on the routines of the native tiles. Prints one line per kernel; exits 1 on a
difference."""

from __future__ import annotations

import sys

import numpy as np

from kleidipy.core import hwcaps
from kleidipy.graph import matmul as mm
from kleidipy.kernels.catalogue import all_kernels, family_of

FAMILIES = ("qsi8d32p_qsi4c32p", "qai8dxp_qsi8cxp", "qsi8d32p_qai4c32p", "qsi8d32p_qai8c16p", "f32p_f32p", "f32_f32p")
N, K = 72, 96


def main() -> int:
    features, svl = hwcaps.arm_features()
    tiers = {"dotprod", "i8mm"} | ({"sme2"} if "sme2" in features else set())
    failed = 0
    for kern in all_kernels():
        if kern.family not in FAMILIES or kern.tier not in tiers:
            continue
        kern = kern.bind(svl or 128)
        w = np.random.default_rng(7).standard_normal((N, K)).astype(np.float32)
        rhs, kwargs = family_of(kern).from_float(w, kern.rhs_packer)
        packed = kern.pack_rhs(N, K, rhs, execution="reference", **kwargs)
        reference = kern.prepare(N, K, packed, execution="reference")
        nk = mm.node_kernel(kern.prepare(N, K, packed, execution="jit"))
        for m in (1,) if kern.kind == "gemv" else (3, 17):
            x = np.random.default_rng(m).standard_normal((m, K)).astype(np.float32) * 3
            want = reference(x)
            for nth in (1, 2):
                lhs = np.zeros(nk.lhs_bytes(m), np.uint8)
                for ith in range(nth):
                    mm.pack_lhs(nk.params, x, m, lhs, ith, nth)
                out = np.empty((m, N), np.float32)
                for ith in range(nth):
                    mm.matmul(nk.params, m, N, lhs, packed, out, ith, nth)
                if not np.array_equal(out.view(np.uint32), want.view(np.uint32)):
                    print(f"DIFFERENT {kern.name} m={m} threads={nth}")
                    failed += 1
        if kern.tier != "sme2" and nk.routine.endswith("_portable"):  # the portable loops: not the native tiles
            print(f"PORTABLE {kern.name}: {nk.routine}")
            failed += 1
        print(f"{kern.name}: {nk.routine}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
