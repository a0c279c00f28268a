#!/usr/bin/env python3
"""llama.cpp's reference logits on emulated Arm: one aarch64 build of llama.cpp 0c1e570 + KleidiAI v1.24.0, run under
QEMU on the I8MM CPU (``-cpu max,sme=off``) and on the SME2 one (``-cpu max,sme-default-vector-length=64``).

    make_arm_reference.py SDIST KLEIDIAI_SRC --cpu i8mm|sme2 MODEL [--threads N] [--prompt NAME ...] [--out DIR]

SDIST is llama-cpp-python 0.3.36's unpacked sdist (its ``vendor/llama.cpp`` and ``llama_cpp`` package), KLEIDIAI_SRC
KleidiAI v1.24.0's sources (``git archive v1.24.0`` or its release tarball). On first use it cross-builds llama.cpp's
libraries in ``--work`` (out of tree: the sdist is only read) with Debian 12's ``g++-aarch64-linux-gnu`` (GCC 12.2;
``apt-get install g++-aarch64-linux-gnu``) and ``--cpu`` picks the QEMU CPU the reference runs on. MODEL is a key:
``smollm2-q4_0``, ``smollm2-q8_0`` (SmolLM2's shipped Q4_1 file) or ``gemma3-q4_0`` (Gemma 3's shipped Q4_K_M),
requantized by ``kleidipy quantize --pure``. ../llama_cpp/generator/make_reference.py does the run (the shared set's
procedure and schema; one ``llama_decode`` per prompt, then 32 greedy steps), through ``scripts/qemu-aarch64
--python``; on ``sme2`` with ``GGML_KLEIDIAI_SME=<threads>`` (every thread runs SME: the bits do not depend on the
thread count). Output: ``logits/`` (i8mm) or ``sme2_svl512/logits/`` (sme2) beside this script; the raw load log
goes to ``--work``. See README.md here for what the build and runs are.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
GENERATOR = HERE.parent / "llama_cpp" / "generator" / "make_reference.py"
SHARED = REPO.parent / "shared" / "reference"
CPUS = {"i8mm": "max,sme=off", "sme2": "max,sme-default-vector-length=64"}
OUT = {"i8mm": HERE / "logits", "sme2": HERE / "sme2_svl512" / "logits"}
#: model key -> (kleidipy catalogue model, requantized type, file name recorded, prompts' folder, prompts' model key)
MODELS = {
    "smollm2-q4_0": (
        "smollm2-135m-instruct",
        "q4_0",
        "SmolLM2-135M-Instruct.requant-pure-Q4_0.gguf",
        SHARED / "logits",
        "smollm2-q4_0",
    ),
    "smollm2-q8_0": (
        "smollm2-135m-instruct",
        "q8_0",
        "SmolLM2-135M-Instruct.requant-pure-Q8_0.gguf",
        SHARED / "logits",
        "smollm2-q8_0",
    ),
    "gemma3-q4_0": (
        "gemma3-270m",
        "q4_0",
        "gemma-3-270m.requant-pure-Q4_0.gguf",
        SHARED / "gemma3" / "logits",
        "gemma3-q4_k_m",
    ),
}
TOOLCHAIN = """\
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
"""
#: the I8MM reference's configuration (README): ggml-cpu for NEON + DotProd + I8MM, no FP16 arithmetic, no SVE;
#: KleidiAI's own CMake gives its SME/SME2 files their flags (they are assembly: SME2 code as .inst words)
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+i8mm",
    "-DGGML_CPU_KLEIDIAI=ON",
    "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
    "-DGGML_OPENMP=OFF",
    "-DLLAMA_CURL=OFF",
    "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_C_FLAGS=-fno-tree-vectorize",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
]
PY_DEPS = ["diskcache==5.6.3"]  # llama_cpp imports it (pure Python); the QEMU sysroot's wheels have the rest


class BuildError(Exception):
    """A build step failed; its message is the one line shown."""


def log(msg: str) -> None:
    print(f"make_arm_reference: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], what: str, logfile: Path, **kw) -> None:
    with logfile.open("a") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n")
        f.flush()
        if subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, **kw) != 0:
            raise BuildError(f"{what} failed: see {logfile}")


def build(sdist: Path, kleidiai: Path, work: Path) -> Path:
    """Cross-build llama.cpp's shared libraries once; the folder holding them."""
    bindir = work / "build" / "bin"
    if (work / "build" / ".done").exists():
        return bindir
    if not shutil.which("aarch64-linux-gnu-g++"):
        raise BuildError("aarch64-linux-gnu-g++ not found: apt-get install g++-aarch64-linux-gnu")
    src = sdist / "vendor" / "llama.cpp"
    if not (src / "ggml" / "src" / "ggml-cpu" / "kleidiai").is_dir():
        raise BuildError(f"{src} is not llama.cpp's source tree")
    if not (kleidiai / "kai" / "kai_common.h").is_file():
        raise BuildError(f"{kleidiai} is not KleidiAI's source tree")
    work.mkdir(parents=True, exist_ok=True)
    (work / "aarch64.cmake").write_text(TOOLCHAIN)
    logfile = work / "build.log"
    log(f"cmake configure (log: {logfile})")
    cmd = ["cmake", "-S", str(src), "-B", str(work / "build"), f"-DCMAKE_TOOLCHAIN_FILE={work / 'aarch64.cmake'}"]
    cmd += [*CMAKE_OPTIONS, f"-DFETCHCONTENT_SOURCE_DIR_KLEIDIAI={kleidiai.resolve()}"]
    run(cmd, "cmake configure", logfile)
    log("cmake --build (target llama)")
    run(["cmake", "--build", str(work / "build"), "--target", "llama", "-j", "2"], "cmake --build", logfile)
    deps = work / "pydeps"
    run([sys.executable, "-m", "pip", "install", "--target", str(deps), *PY_DEPS], "pip install", logfile)
    (work / "build" / ".done").touch()
    return bindir


def model_file(key: str) -> Path:
    """The requantized model, made once in kleidipy's model cache (``bench/KEY.gguf``, as the benchmarks do)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from e2e import requantized

    name, qtype, *_ = MODELS[key]
    return requantized(name, key, qtype)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sdist", type=Path, help="llama-cpp-python 0.3.36's unpacked sdist")
    ap.add_argument("kleidiai", type=Path, help="KleidiAI v1.24.0's sources")
    ap.add_argument("model", choices=list(MODELS))
    ap.add_argument("--cpu", choices=list(CPUS), required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", action="append", help="subset of the prompts (default: all)")
    ap.add_argument("--out", type=Path, help="default: logits/ (i8mm) or sme2_svl512/logits/ (sme2) here")
    ap.add_argument("--work", type=Path, default=Path("build-arm-reference"), help="build and log folder")
    args = ap.parse_args(argv)
    try:
        bindir = build(args.sdist.resolve(), args.kleidiai.resolve(), args.work.resolve())
    except BuildError as exc:
        log(f"error: {exc}")
        return 1
    _, _, file_name, prompts_from, prompts_model = MODELS[args.model]
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(bindir))
    if args.cpu == "sme2":
        env["GGML_KLEIDIAI_SME"] = str(args.threads)
    out = args.out or OUT[args.cpu]
    cmd = [sys.executable, str(REPO / "scripts" / "qemu-aarch64"), "--cpu", CPUS[args.cpu], "--python", "--"]
    cmd += [str(GENERATOR), "--python-path", str(args.sdist.resolve()), "--python-path"]
    cmd += [str(args.work.resolve() / "pydeps"), "--model-key", args.model, "--model-path", str(model_file(args.model))]
    cmd += ["--model-file", file_name, "--variant", "default", "--threads", str(args.threads)]
    cmd += ["--prompts-from", str(prompts_from), "--prompts-model", prompts_model, "--out", str(out)]
    cmd += ["--log-dir", str(args.work.resolve() / f"logs-{args.cpu}-t{args.threads}")]
    for p in args.prompt or []:
        cmd += ["--prompt", p]
    log(f"{args.model} on {args.cpu} ({CPUS[args.cpu]}), {args.threads} thread(s) -> {out}")
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
