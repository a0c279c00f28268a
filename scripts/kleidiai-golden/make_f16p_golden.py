#!/usr/bin/env python3
"""Golden data of KleidiAI's ``matmul_clamp_f32_f16p_qsi4c32p`` family, made by real KleidiAI under QEMU.

    scripts/kleidiai-golden/make_f16p_golden.py KLEIDIAI_GIT_DIR [--rev v1.24.0] [--out DIR] [--work DIR]

Builds KleidiAI (the revision's sources, from a git directory: ``git archive``, no checkout) for aarch64 Linux with
Debian's clang (>= 18 for SME2; ``$KAI_CLANG``, default clang-19; the arm64 cross glibc: ``apt-get install clang-19
lld-19 libc6-dev-arm64-cross libstdc++-12-dev-arm64-cross``) through its own CMake, static, with its test of the family
(``matmul_clamp_f32_f16p_qsi4c32p_test``) and this folder's driver ``kai_golden_f16p.c``; then, under
scripts/qemu-aarch64's QEMU (SME2 at SVL 128, 256 and 512 bits), runs KleidiAI's test and the driver on each case
and writes the golden set (``--out``, default tests/data/golden/f16p_qsi4c32p) in the schema of ../shared/golden:
manifest.json, inputs/ and sme_svl{16,32,64}/ per shape. Inputs are made here with numpy (seeded; GGML's Q4_0 rules
for the weights); every packed buffer and dst is KleidiAI's. Needs numpy, cmake and ninja.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FAMILY = "f16p_qsi4c32p"
VARIANT = "clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa"
MATMUL = f"kai_run_matmul_{VARIANT}"
LHS_PACK = "kai_run_lhs_pack_f16pmrx2_f32_neon"
RHS_PACK = "kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon"
TEST = "matmul_clamp_f32_f16p_qsi4c32p_test"
SVL_BYTES = (16, 32, 64)
BL = 32
#: (m, n, k, seed, LHS rows' exponent range): m and n with tails at every SVL (mr = SVL/32 rows, nr = SVL/8 columns),
#: k with an odd number of 32-blocks; the wide-range case puts LHS values and products into f16's subnormals
CASES = (
    (1, 64, 64, 2001, None),
    (7, 33, 96, 2002, None),
    (16, 64, 64, 2003, None),
    (37, 100, 160, 2004, (-16, 6)),
    (1, 256, 512, 2005, None),
)


def log(msg: str) -> None:
    print(f"make_f16p_golden: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def qemu_binary() -> Path:
    """scripts/qemu-aarch64's QEMU (set up on first use in its cache)."""
    loader = importlib.machinery.SourceFileLoader("qemu_aarch64", str(REPO / "scripts" / "qemu-aarch64"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module.ensure_qemu(module.cache_dir())


def build(
    kai_git: str, rev: str, work: Path, test: str = TEST, driver_name: str = "kai_golden_f16p"
) -> tuple[Path, Path, dict]:
    """KleidiAI's sources of ``rev`` under ``work``, built: (driver ``driver_name``, built from this folder's
    ``<driver_name>.c``, KleidiAI's test ``test``, toolchain facts)."""
    src, bld = work / "kai", work / "build"
    commit = run(["git", "--git-dir", kai_git, "rev-parse", f"{rev}^{{commit}}"]).stdout.strip()
    describe = run(["git", "--git-dir", kai_git, "describe", "--tags", commit]).stdout.strip()
    if not (src / ".commit").exists() or (src / ".commit").read_text() != commit:
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "--git-dir", kai_git, "archive", commit], check=True, capture_output=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(src, filter="data")
        (src / ".commit").write_text(commit)
    toolchain = HERE / "aarch64-clang.cmake"
    cmake = ["cmake", "-S", str(src), "-B", str(bld), "-G", "Ninja", f"-DCMAKE_TOOLCHAIN_FILE={toolchain}"]
    cmake += ["-DCMAKE_BUILD_TYPE=Release", "-DKLEIDIAI_BUILD_TESTS=ON", "-DKLEIDIAI_BUILD_BENCHMARK=OFF"]
    log(f"building KleidiAI {describe} and {test} in {bld}")
    run(cmake)
    run(["cmake", "--build", str(bld), "--target", "kleidiai", test])
    clang = os.environ.get("KAI_CLANG", "clang-19")
    driver = bld / driver_name
    flags = ["--target=aarch64-linux-gnu", "-march=armv8.2-a", "-O2", "-static", "-fuse-ld=lld"]
    run([clang, *flags, f"-I{src}", str(HERE / f"{driver_name}.c"), str(bld / "libkleidiai.a"), "-o", str(driver)])
    facts = {
        "cc": run([clang, "--version"]).stdout.splitlines()[0],
        "target": "aarch64-linux-gnu, static glibc (Debian libc6-dev-arm64-cross)",
        "kleidiai_build": "KleidiAI's CMake (Release, its per-file -march flags) with "
        "scripts/kleidiai-golden/aarch64-clang.cmake, KLEIDIAI_BUILD_TESTS=ON",
        "driver": f"scripts/kleidiai-golden/{driver_name}.c, {' '.join(flags)}, linked with libkleidiai.a",
    }
    return driver, bld / test, {"commit": f"{commit} ({describe})", **facts}


def quantize_q4_0(w: np.ndarray) -> np.ndarray:
    """GGML ``quantize_row_q4_0_ref`` of float32 rows [n, k]: uint8 [n, k/32, 18] (fp16 d, 16 bytes of codes)."""
    n, k = w.shape
    x = w.reshape(n, k // BL, BL).astype(np.float32)
    idx = np.abs(x).argmax(axis=2)
    signed_max = np.take_along_axis(x, idx[:, :, None], axis=2)[:, :, 0]
    d = (signed_max / np.float32(-8)).astype(np.float32)
    inv = np.zeros_like(d)
    np.divide(np.float32(1), d, out=inv, where=d != 0)
    q = np.minimum(15, np.trunc(x * inv[:, :, None] + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
    blocks = np.zeros((n, k // BL, 18), np.uint8)
    blocks[:, :, :2] = d.astype("<f2").view(np.uint8).reshape(n, k // BL, 2)
    blocks[:, :, 2:] = q[:, :, :16] | (q[:, :, 16:] << 4)
    return blocks


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    n, nb, _ = blocks.shape
    d = blocks[:, :, :2].copy().view("<f2").astype(np.float64)
    q = np.concatenate([blocks[:, :, 2:] & 15, blocks[:, :, 2:] >> 4], axis=2).astype(np.float64) - 8
    return (q * d).reshape(n, nb * BL)


def entry(root: Path, path: Path, dtype: str, shape: list[int] | None = None, layout: str | None = None) -> dict:
    data = path.read_bytes()
    out = {"file": str(path.relative_to(root)), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    out["dtype"] = dtype
    if shape is not None:
        out["shape"] = shape
    if layout:
        out["layout"] = layout
    return out


def f32_bits(value: np.float32) -> str:
    return f"0x{int(np.array([value], np.float32).view(np.uint32)[0]):08x}"


def make_case(root: Path, m: int, n: int, k: int, seed: int, exponents: tuple[int, int] | None) -> dict:
    """A case's inputs (written under ``root``), its float reference and clamp."""
    folder = root / f"m{m}_n{n}_k{k}" / "inputs"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    weights = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
    if exponents is not None:  # rows of very different magnitudes (f16 subnormals, large values)
        lhs = (lhs * np.exp2(rng.integers(exponents[0], exponents[1] + 1, size=(m, 1)))).astype(np.float32)
    rhs = quantize_q4_0(weights)
    ref = (lhs.astype(np.float64) @ dequantize_q4_0(rhs).T).astype(np.float32)
    lo, hi = np.percentile(ref, [10, 90]).astype(np.float32)
    (folder / "lhs_f32.bin").write_bytes(lhs.tobytes())
    (folder / "rhs_q4_0.bin").write_bytes(rhs.tobytes())
    (folder / "ref_f32_lhs_x_deq_q4_0.bin").write_bytes(ref.tobytes())
    (folder / "seed.txt").write_text(f"{seed}\n")
    inputs = {
        "lhs_f32": entry(root, folder / "lhs_f32.bin", "float32", [m, k], "row-major M x K, little-endian"),
        "rhs_q4_0": entry(
            root,
            folder / "rhs_q4_0.bin",
            "uint8",
            [n, k // BL, 18],
            "GGML block_q4_0 per row: f16 d (LE) then qs[16], qs[j] = q[j] | q[j+16]<<4, value = (q-8)*d; "
            "ggml quantize_row_q4_0_ref rules",
        ),
        "ref_f32_lhs_x_deq_q4_0": entry(
            root, folder / "ref_f32_lhs_x_deq_q4_0.bin", "float32", [m, n], "float64 lhs x dequantized Q4_0, to f32"
        ),
    }
    clamp = {"min": float(lo), "max": float(hi), "min_bits": f32_bits(lo), "max_bits": f32_bits(hi)}
    return {"m": m, "n": n, "k": k, "seed": seed, "inputs": inputs, "clamp": {FAMILY: clamp}, "ref": ref}


def clamp_and_check(
    params: dict, clamp: dict, is_clamped: bool, dst: np.ndarray, clamped: np.ndarray, ref: np.ndarray, info: dict
) -> dict:
    """A run's clamp and dst strides (into ``params``) and its check of KleidiAI's dst: the clamped one against the
    clip of the unclamped one, the unclamped one against the float reference; ``info``: the driver's unwritten
    counts."""
    params["clamp"] = [clamp["min"], clamp["max"]] if is_clamped else ["-FLT_MAX", "FLT_MAX"]
    params.update({"dst_stride_row": 4 * dst.shape[1], "dst_stride_col": 4})
    if not is_clamped:
        return {
            "max_rel_err_vs_float_ref": float(np.abs(dst - ref).max() / np.abs(ref).max()),
            "finite": bool(np.isfinite(dst).all()),
            "dst_unwritten": info["dst_unwritten"],
        }
    lo, hi = np.float32(clamp["min"]), np.float32(clamp["max"])
    params["clamp_bits"] = [clamp["min_bits"], clamp["max_bits"]]
    return {
        "equals_clip_of_unclamped_dst": bool(np.array_equal(np.clip(dst, lo, hi), clamped)),
        "fraction_clamped": float(np.mean((clamped == lo) | (clamped == hi))),
        "finite": bool(np.isfinite(clamped).all()),
        "dst_unwritten": info["dst_clamped_unwritten"],
    }


def run_case(root: Path, qemu: Path, driver: Path, case: dict, svl: int) -> list[dict]:
    """The driver on one case at one SVL: its two runs (unclamped, clamped)."""
    m, n, k = case["m"], case["n"], case["k"]
    folder = root / f"m{m}_n{n}_k{k}"
    out = folder / f"sme_svl{svl}"
    out.mkdir(exist_ok=True)
    cpu = f"max,sme-default-vector-length={svl}"
    clamp = case["clamp"][FAMILY]
    args = [str(m), str(n), str(k), str(BL), str(folder / "inputs" / "lhs_f32.bin")]
    args += [str(folder / "inputs" / "rhs_q4_0.bin"), clamp["min_bits"], clamp["max_bits"], str(out / VARIANT)]
    start = time.perf_counter()
    proc = run([str(qemu), "-cpu", cpu, str(driver), *args])
    seconds = round(time.perf_counter() - start, 4)
    info = json.loads(proc.stdout)
    (out / "results.jsonl").write_text(json.dumps({"variant": VARIANT, **info, "status": "ok"}) + "\n")
    (out / "run.json").write_text(json.dumps({"qemu_cpu": cpu}) + "\n")
    if info["svl_bytes"] != svl:
        raise SystemExit(f"the driver saw SVL {info['svl_bytes']} bytes under -cpu {cpu}")
    dst = np.fromfile(out / f"{VARIANT}.dst_f32.bin", np.float32).reshape(m, n)
    clamped = np.fromfile(out / f"{VARIANT}.dst_clamped_f32.bin", np.float32).reshape(m, n)
    ref = case["ref"]
    runs = []
    for is_clamped in (False, True):
        params = {"mr": info["mr"], "nr": info["nr"], "kr": info["kr"], "sr": info["sr"], "bl": BL}
        params["rhs_pack_params"] = {"lhs_zero_point": 1, "rhs_zero_point": 8}
        params["bias"] = None
        check = clamp_and_check(params, clamp, is_clamped, dst, clamped, ref, info)
        name = "dst_clamped_f32.bin" if is_clamped else "dst_f32.bin"
        runs.append(
            {
                "dir": str(out.relative_to(root)),
                "variant": VARIANT,
                "status": "ok",
                "family": FAMILY,
                "weights": "q4_0",
                "clamped": is_clamped,
                "qemu_cpu": cpu,
                "svl_bytes": svl,
                "kernels": {"matmul": MATMUL, "lhs_pack": LHS_PACK, "rhs_pack": RHS_PACK},
                "rhs_input": "rhs_q4_0",
                "params": params,
                "files": {
                    "lhs_packed": entry(root, out / f"{VARIANT}.lhs_packed.bin", "uint8"),
                    "rhs_packed": entry(root, out / f"{VARIANT}.rhs_packed.bin", "uint8"),
                    "dst": entry(root, out / f"{VARIANT}.{name}", "float32", [m, n], "row-major"),
                },
                "check": check,
                "emulated_seconds": seconds,
            }
        )
    return runs


def upstream_test(
    qemu: Path, test: Path, svl: int, gtest_filter: str = "*", skip_reasons: tuple[str, ...] = ()
) -> dict:
    """KleidiAI's own test of the family at one SVL (its tests ``gtest_filter`` names): its gtest counts (none may
    fail; none may be skipped but for one of ``skip_reasons``, the test's own "not valid for this kernel")."""
    cpu = f"max,sme-default-vector-length={svl}"
    log(f"{test.name} ({gtest_filter}) under -cpu {cpu}")
    args = [str(qemu), "-cpu", cpu, str(test), "--gtest_brief=1", f"--gtest_filter={gtest_filter}"]
    proc = subprocess.run(args, capture_output=True, text=True)
    text = proc.stdout + proc.stderr

    def count(tag: str) -> int:
        found = re.search(rf"\[\s*{tag}\s*\] (\d+) test", text)
        return int(found.group(1)) if found else 0

    result = {"qemu_cpu": cpu, "exit": proc.returncode, "passed": count("PASSED"), "failed": count("FAILED")}
    result["skipped"] = count("SKIPPED")
    if gtest_filter != "*":
        result["gtest_filter"] = gtest_filter
    reasons = set(re.findall(r": Skipped\n(.*)\n", text))
    if skip_reasons:
        result["skip_reasons"] = sorted(reasons)
    unexpected = result["skipped"] and not reasons <= set(skip_reasons)
    if proc.returncode or result["failed"] or unexpected or not result["passed"]:
        raise SystemExit(f"{test.name} at SVL {svl * 8}: {result}\n{text[-2000:]}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kleidiai", help="a KleidiAI git directory (a clone of ARM-software/kleidiai, bare or not)")
    parser.add_argument("--rev", default="v1.24.0", help="the KleidiAI revision (default v1.24.0)")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "golden" / FAMILY)
    parser.add_argument("--work", type=Path, help="build directory (default: a temporary one, removed)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="kai-golden-"))
    try:
        driver, test, toolchain = build(args.kleidiai, args.rev, work)
        qemu = qemu_binary()
        upstream = {f"svl{svl * 8}": upstream_test(qemu, test, svl) for svl in SVL_BYTES}
        root = args.out
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        cases = []
        for m, n, k, seed, exponents in CASES:
            case = make_case(root, m, n, k, seed, exponents)
            case["runs"] = [r for svl in SVL_BYTES for r in run_case(root, qemu, driver, case, svl)]
            dsts = {json.dumps(r["files"]["dst"]["sha256"]) for r in case["runs"] if not r["clamped"]}
            case["consistency"] = {FAMILY: {"n_runs": len(SVL_BYTES), "svl_invariant_dst": len(dsts) == 1}}
            del case["ref"]
            cases.append(case)
            log(f"m{m}_n{n}_k{k}: {len(case['runs'])} runs")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    meta = {
        "set": FAMILY,
        "kleidiai": {
            "repo": "github.com/ARM-software/kleidiai",
            "revision": args.rev,
            "commit": toolchain.pop("commit"),
            "license": "Apache-2.0 (packed/dst data produced by KleidiAI micro-kernels)",
        },
        "generator": "scripts/kleidiai-golden/make_f16p_golden.py (driver kai_golden_f16p.c)",
        "emulator": {
            "qemu": run([str(qemu), "--version"]).stdout.splitlines()[0],
            "source": "scripts/qemu-aarch64's QEMU (Debian's qemu-user, static)",
            "cpu_sme": "-cpu max,sme-default-vector-length=<SVL bytes>",
        },
        "toolchain": toolchain,
        "families": {
            FAMILY: {
                "weights": "GGML Q4_0 (verbatim)",
                "rhs_input": "rhs_q4_0",
                "rhs_pack_params": {"lhs_zero_point": 1, "rhs_zero_point": 8},
                "bias": None,
                "bl": BL,
            }
        },
        "upstream_tests": {TEST: upstream},
        "notes": [
            "Each case has two runs per SVL: clamped=false (clamp = +/-FLT_MAX) and clamped=true (finite [min,max] = "
            "f32 10th/90th percentile of the float reference); both use the same packed buffers.",
            "Packed buffers were calloc'ed: padding bytes the packers do not write are 0.",
            "Inputs are numpy's (default_rng(seed): lhs M*K standard normal, then weights N*K normal sigma 0.5, "
            "quantized to Q4_0 by GGML's reference rules); the m37 case scales each LHS row by 2^e, e in [-16, 6].",
        ],
    }
    (root / "manifest.json").write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")
    log(f"wrote {root / 'manifest.json'}: {sum(len(c['runs']) for c in cases)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
