"""Run by path with a family's name on an aarch64 host with SME2 (the tests run it under ``scripts/qemu-aarch64
--python`` at SVL 128, 256 and 512): the family's SME2 kernel bound to the host's SVL on its native tile — the
golden runs of the host's SVL through the jit (real KleidiAI's bits), then random shapes with partial row and column
groups and wide magnitudes against the numpy reference at 1 and 2 threads — bit for bit. Prints the tile's ISA and
SVL and one line per check; exits 1 on a difference or when the tile is not installed.

    sme2_tile_check.py f16p_qsi4c32p|f32p_f32p|f32_f32p
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np

from kleidipy.core import hwcaps
from kleidipy.formats import q4_0
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.tools.golden import GoldenSet, iter_runs, verify_run

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
#: family -> (kernel, shapes (m, n, k), the RHS packer's input of float weights [n, k])
FAMILIES = {
    "f16p_qsi4c32p": (
        "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa",
        [(1, 1, 32), (3, 17, 96), (17, 70, 64), (33, 200, 160)],
        q4_0.quantize,
    ),
    "f32_f32p": (
        "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla",
        [(1, 1, 1), (1, 17, 7), (1, 70, 64), (1, 300, 61)],
        lambda w: w,
    ),
    "f32p_f32p": (
        "matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa",
        [(1, 1, 1), (3, 17, 7), (17, 70, 64), (33, 200, 61)],
        lambda w: w,
    ),
}


def main(family: str) -> int:
    name, shapes, rhs_input = FAMILIES[family]
    sme2 = importlib.import_module(f"kleidipy.kernels.{family}.sme2")
    svl = hwcaps.arm_features()[1]
    if not sme2.AVAILABLE or not llvm.address_of_symbol(next(iter(sme2.KERNELS))):
        print(f"no native SME2 tile (SVL {svl})")
        return 1
    print(f"native tile: {sme2.HOST_ISA.name}, SVL {svl}")
    golden = GoldenSet(GOLDEN / family)
    runs = [(c, r) for c, r in iter_runs(golden) if r["svl_bytes"] * 8 == svl]
    failed = [res.line() for c, r in runs if not (res := verify_run(golden, c, r, "jit", {})).ok]
    print(f"golden runs at SVL {svl}: {len(runs) - len(failed)} of {len(runs)} bit-exact", *failed, sep="\n")
    kern = get_kernel(name, svl)
    rng = np.random.default_rng(svl)
    same = 0
    for m, n, k in shapes:
        x = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-14, 6, size=(m, 1)))).astype(np.float32)
        w = (rng.standard_normal((n, k)) * np.exp2(rng.integers(-16, 3, size=(n, 1)))).astype(np.float32)
        rhs = kern.pack_rhs(n, k, rhs_input(w))
        want = kern.run(m, n, k, kern.pack_lhs(x, execution="reference"), rhs, execution="reference")
        for threads in (1, 2):
            got = kern.prepare(n, k, rhs, execution="jit", min_split_macs=0)(x, threads=threads)
            same += np.array_equal(got.view(np.uint32), want.view(np.uint32))
    print(f"random shapes: {same} of {2 * len(shapes)} bit-exact at 1 and 2 threads")
    return 0 if not failed and runs and same == 2 * len(shapes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
