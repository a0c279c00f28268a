#!/usr/bin/env python3
"""Golden data of KleidiAI's F32 SME2 kernels that llama.cpp runs F32 weights through, made by real KleidiAI under QEMU.

    scripts/kleidiai-golden/make_f32p_golden.py KLEIDIAI_GIT_DIR [--rev v1.24.0] [--out DIR] [--work DIR]

llama.cpp's SME2 F32 entry (kernels.cpp, ``ggml_kleidiai_kernels_f32``): the MOPA GEMM
``matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa`` (family ``f32p_f32p``, LHS packed by
``lhs_pack_f32p2vlx1_f32_sme``) and the MLA GEMV ``matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla`` (family
``f32_f32p``, plain f32 LHS), both on one packing of the weights by ``rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme``.
Builds KleidiAI as make_f16p_golden.py does (its ``build``; offline, configure the ``--work`` build directory once
with ``-DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=<googletest sources>``) with its ``matmul_test`` and this folder's driver
``kai_golden_f32p.c``; runs KleidiAI's test of the two kernels and the driver under QEMU at SVL 128, 256 and 512 and
writes two golden sets in the schema of ../shared/golden (``--out``, default tests/data/golden): ``f32p_f32p`` (the
GEMM, every case) and ``f32_f32p`` (the GEMV, the m = 1 cases). Inputs are made here with numpy (seeded); every packed
buffer and dst is KleidiAI's. Needs numpy, cmake and ninja.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_f16p_golden as common  # noqa: E402  (this folder's shared build and QEMU helpers)

REPO = common.REPO
RHS_PACK = "kai_run_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme"
#: family -> (variant, matmul, LHS packer or None)
KERNELS = {
    "f32p_f32p": (
        "clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa",
        "kai_run_matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa",
        "kai_run_lhs_pack_f32p2vlx1_f32_sme",
    ),
    "f32_f32p": (
        "clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla",
        "kai_run_matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla",
        None,
    ),
}
TEST = "matmul_test"
GTEST_FILTER = "*f32p2vlx1_f32p2vlx1biasf32_sme2_mopa*:*f32p2vlx1b_1x16vl_sme2_mla*"
#: why matmul_test skips some of its tests of these kernels (its own rules: the GEMV packs no LHS, the nxk packer is
#: not a transposed-RHS one)
SKIP_REASONS = ("Test not valid w/o LHS pack", "Test not valid w/o pre-processing of transposed RHS matrix")
SVL_BYTES = (16, 32, 64)
#: (m, n, k, seed, LHS rows' exponent range, random bias): m and n with tails at every SVL (mr = nr = 2·SVL/32; the
#: GEMV's column groups of 4·SVL/32 in widths 1 to 4, n below one RHS block), k with tails of the 4-step K loops;
#: the wide-range case spreads the LHS rows over 2^-20..2^20 (products near float32's subnormals and large values)
CASES = (
    (1, 19, 5, 3001, None, False),
    (1, 300, 67, 3002, None, False),
    (1, 130, 128, 3003, None, True),
    (7, 33, 96, 3004, None, False),
    (37, 100, 61, 3005, (-20, 20), True),
    (64, 64, 64, 3006, None, False),
)


def make_case(root: Path, m: int, n: int, k: int, seed: int, exponents: tuple | None, random_bias: bool) -> dict:
    """A case's inputs (written under ``root``), its float reference and clamp."""
    folder = root / f"m{m}_n{n}_k{k}" / "inputs"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    rhs = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if random_bias else np.zeros(n, np.float32)
    if exponents is not None:  # rows of very different magnitudes
        lhs = (lhs * np.exp2(rng.integers(exponents[0], exponents[1] + 1, size=(m, 1)))).astype(np.float32)
    ref = (lhs.astype(np.float64) @ rhs.T.astype(np.float64) + bias).astype(np.float32)
    lo, hi = np.percentile(ref, [10, 90]).astype(np.float32)
    (folder / "lhs_f32.bin").write_bytes(lhs.tobytes())
    (folder / "rhs_f32.bin").write_bytes(rhs.tobytes())
    (folder / "bias_f32.bin").write_bytes(bias.tobytes())
    (folder / "ref_f32_lhs_x_rhs_plus_bias.bin").write_bytes(ref.tobytes())
    (folder / "seed.txt").write_text(f"{seed}\n")
    layout = "row-major, little-endian"
    inputs = {
        "lhs_f32": common.entry(root, folder / "lhs_f32.bin", "float32", [m, k], f"M x K {layout}"),
        "rhs_f32": common.entry(root, folder / "rhs_f32.bin", "float32", [n, k], f"N x K {layout} (GGML F32 weights)"),
        "bias_f32": common.entry(
            root, folder / "bias_f32.bin", "float32", [n], "N biases" + ("" if random_bias else ": zeros (llama.cpp's)")
        ),
        "ref_f32_lhs_x_rhs_plus_bias": common.entry(
            root, folder / "ref_f32_lhs_x_rhs_plus_bias.bin", "float32", [m, n], "float64 lhs x rhs^T + bias, to f32"
        ),
    }
    clamp = {"min": float(lo), "max": float(hi), "min_bits": common.f32_bits(lo), "max_bits": common.f32_bits(hi)}
    return {"m": m, "n": n, "k": k, "seed": seed, "inputs": inputs, "clamp": clamp, "ref": ref}


def family_runs(root: Path, case: dict, family: str, svl: int, info: dict, seconds: float) -> list[dict]:
    """The manifest runs of one family's kernel at one SVL (unclamped, clamped) from the driver's output."""
    variant, matmul, lhs_pack = KERNELS[family]
    m, n = case["m"], case["n"]
    out = root / f"m{m}_n{n}_k{case['k']}" / f"sme_svl{svl}"
    facts = info["gemm" if lhs_pack else "gemv"]
    clamp = case["clamp"]
    dst = np.fromfile(out / f"{variant}.dst_f32.bin", np.float32).reshape(m, n)
    clamped = np.fromfile(out / f"{variant}.dst_clamped_f32.bin", np.float32).reshape(m, n)
    runs = []
    for is_clamped in (False, True):
        params = {"mr": facts["mr"] if lhs_pack else None, "nr": facts["nr"], "kr": facts["kr"], "sr": facts["sr"]}
        params["bias"] = "bias_f32"
        check = common.clamp_and_check(params, clamp, is_clamped, dst, clamped, case["ref"], facts)
        name = "dst_clamped_f32.bin" if is_clamped else "dst_f32.bin"
        files = {"rhs_packed": common.entry(root, out / f"{variant}.rhs_packed.bin", "uint8")}
        if lhs_pack:
            files["lhs_packed"] = common.entry(root, out / f"{variant}.lhs_packed.bin", "uint8")
        files["dst"] = common.entry(root, out / f"{variant}.{name}", "float32", [m, n], "row-major")
        kernels = {"matmul": matmul, "rhs_pack": RHS_PACK} | ({"lhs_pack": lhs_pack} if lhs_pack else {})
        runs.append(
            {
                "dir": str(out.relative_to(root)),
                "variant": variant,
                "status": "ok",
                "family": family,
                "weights": "f32",
                "clamped": is_clamped,
                "qemu_cpu": f"max,sme-default-vector-length={svl}",
                "svl_bytes": svl,
                "kernels": kernels,
                "rhs_input": "rhs_f32 + bias_f32",
                "params": params,
                "files": files,
                "check": check,
                "emulated_seconds": seconds,
            }
        )
    return runs


def run_case(root: Path, qemu: Path, driver: Path, case: dict, svl: int) -> dict[str, list[dict]]:
    """The driver on one case at one SVL: each family's runs."""
    m, n, k = case["m"], case["n"], case["k"]
    folder = root / f"m{m}_n{n}_k{k}"
    out = folder / f"sme_svl{svl}"
    out.mkdir(exist_ok=True)
    cpu = f"max,sme-default-vector-length={svl}"
    clamp = case["clamp"]
    inputs = [str(folder / "inputs" / f) for f in ("lhs_f32.bin", "rhs_f32.bin", "bias_f32.bin")]
    args = [str(m), str(n), str(k), *inputs]
    args += [clamp["min_bits"], clamp["max_bits"]] + [str(out / KERNELS[f][0]) for f in ("f32p_f32p", "f32_f32p")]
    start = time.perf_counter()
    proc = common.run([str(qemu), "-cpu", cpu, str(driver), *args])
    seconds = round(time.perf_counter() - start, 4)
    info = json.loads(proc.stdout)
    (out / "results.jsonl").write_text(json.dumps({**info, "status": "ok"}) + "\n")
    (out / "run.json").write_text(json.dumps({"qemu_cpu": cpu}) + "\n")
    if info["svl_bytes"] != svl:
        raise SystemExit(f"the driver saw SVL {info['svl_bytes']} bytes under -cpu {cpu}")
    families = ("f32p_f32p", "f32_f32p") if m == 1 else ("f32p_f32p",)
    return {family: family_runs(root, case, family, svl, info, seconds) for family in families}


def manifest_meta(family: str, rev: str, toolchain: dict, qemu: Path, upstream: dict) -> dict:
    variant, matmul, lhs_pack = KERNELS[family]
    return {
        "set": family,
        "kleidiai": {
            "repo": "github.com/ARM-software/kleidiai",
            "revision": rev,
            "commit": toolchain["commit"],
            "license": "Apache-2.0 (packed/dst data produced by KleidiAI micro-kernels)",
        },
        "generator": "scripts/kleidiai-golden/make_f32p_golden.py (driver kai_golden_f32p.c)",
        "emulator": {
            "qemu": common.run([str(qemu), "--version"]).stdout.splitlines()[0],
            "source": "scripts/qemu-aarch64's QEMU (Debian's qemu-user, static)",
            "cpu_sme": "-cpu max,sme-default-vector-length=<SVL bytes>",
        },
        "toolchain": {key: value for key, value in toolchain.items() if key != "commit"},
        "families": {family: {"weights": "GGML F32 [N][K] (verbatim)", "rhs_input": "rhs_f32 + bias_f32"}},
        "upstream_tests": {TEST: upstream},
        "notes": [
            "Each case has two runs per SVL: clamped=false (clamp = +/-FLT_MAX) and clamped=true (finite [min,max] = "
            "f32 10th/90th percentile of the float reference); both use the same packed buffers.",
            "One RHS packing (rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme with the GEMM's nr, kr, sr, as llama.cpp "
            "packs) serves the GEMM and, for m = 1, the GEMV: the GEMV's rhs_packed file is the same bytes.",
            "Packed buffers were calloc'ed: padding bytes the packers do not write are 0.",
            "Inputs are numpy's (default_rng(seed): lhs M*K standard normal, weights N*K normal sigma 0.5, then the "
            "bias N standard normal where random, else zeros as llama.cpp passes); the m37 case scales each LHS row "
            "by 2^e, e in [-20, 20].",
            f"{family}: {matmul}" + (f", LHS packed by {lhs_pack}" if lhs_pack else ", plain f32 LHS (m = 1 only)"),
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kleidiai", help="a KleidiAI git directory (a clone of ARM-software/kleidiai, bare or not)")
    parser.add_argument("--rev", default="v1.24.0", help="the KleidiAI revision (default v1.24.0)")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "golden")
    parser.add_argument("--work", type=Path, help="build directory (default: a temporary one, removed)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="kai-golden-"))
    roots = {family: args.out / family for family in KERNELS}
    cases: dict[str, list] = {family: [] for family in KERNELS}
    try:
        driver, test, toolchain = common.build(args.kleidiai, args.rev, work, TEST, "kai_golden_f32p")
        qemu = common.qemu_binary()
        upstream = {
            f"svl{svl * 8}": common.upstream_test(qemu, test, svl, GTEST_FILTER, SKIP_REASONS) for svl in SVL_BYTES
        }
        scratch = work / "golden"
        shutil.rmtree(scratch, ignore_errors=True)
        for m, n, k, seed, exponents, random_bias in CASES:
            case = make_case(scratch, m, n, k, seed, exponents, random_bias)
            runs: dict[str, list] = {}
            for svl in SVL_BYTES:
                for family, found in run_case(scratch, qemu, driver, case, svl).items():
                    runs.setdefault(family, []).extend(found)
            for family, found in runs.items():
                dsts = {r["files"]["dst"]["sha256"] for r in found if not r["clamped"]}
                entry = {key: case[key] for key in ("m", "n", "k", "seed", "inputs")}
                entry["clamp"] = {family: case["clamp"]}
                entry["runs"] = found
                entry["consistency"] = {family: {"n_runs": len(SVL_BYTES), "svl_invariant_dst": len(dsts) == 1}}
                cases[family].append(entry)
            common.log(f"m{m}_n{n}_k{k}: {sum(len(r) for r in runs.values())} runs")
        for family, root in roots.items():
            for old in root.glob("*"):  # (the set's README stays)
                if old.is_dir():
                    shutil.rmtree(old)
                elif old.name != "README.md":
                    old.unlink()
            keep = {Path(r["dir"]).parts[0] for c in cases[family] for r in c["runs"]}
            for name in keep:
                shutil.copytree(scratch / name, root / name)
            variant = KERNELS[family][0]
            for other, (other_variant, _, _) in KERNELS.items():  # (each set keeps only its kernel's files)
                if other != family:
                    for path in root.glob(f"*/sme_svl*/{other_variant}.*"):
                        path.unlink()
            assert all((root / c["runs"][0]["files"]["dst"]["file"]).exists() for c in cases[family]), variant
            meta = manifest_meta(family, args.rev, toolchain, qemu, upstream)
            (root / "manifest.json").write_text(json.dumps({"meta": meta, "cases": cases[family]}, indent=1) + "\n")
            common.log(f"wrote {root / 'manifest.json'}: {sum(len(c['runs']) for c in cases[family])} runs")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
