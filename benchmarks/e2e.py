"""End-to-end benchmark: prefill (pp) and decode (tg) tokens/s, kleidipy vs llama.cpp, with the bandwidth roofline.

    python benchmarks/e2e.py                 # pp512 / tg128 at 1 and 2 threads, all models
    python benchmarks/e2e.py --quick         # pp64 / tg16, one repetition
    python benchmarks/e2e.py --models smollm2-q4_0,tinyllama-q4_0 --threads 1
    python benchmarks/e2e.py --llama-cpp-python /path/to/venv-with-llama-cpp/bin/python

Models: SmolLM2-135M (Q4_1 as shipped, and Q4_0 made by `kleidipy quantize --pure`), Qwen2.5-Coder-0.5B (as
shipped, a Q4_K_M mix, and Q4_0), and random-weight Q4_0 models written here (``kleidipy.tools.synthetic``) of
TinyLlama-1.1B's shape (the llama row) and of Qwen3-0.6B's, Gemma-2-2B's, Phi-3-mini's and SmolLM3-3B's (a row per
further architecture; a third table holds each one's kleidipy/llama.cpp ratio against the llama row's). kleidipy runs
its compiled plan on persistent threads (``--eager``: op by op from Python); "host µs/token" is the Python time per
decoded token outside the plan (the call into numba, its argument unboxing, included: the plan clocks itself).
llama.cpp is timed as llama-bench times it (``benchmarks/llama_cpp_bench.py``: low-level ``llama_decode``, no logits
read) by an interpreter with llama-cpp-python, in its own process (same files, same threads, same run). Build that
llama-cpp-python for the host, ``CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python``; on a CPU with AMX
also ``-DCMAKE_C_FLAGS=... -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"`` (both), since llama.cpp's
AMX matmul crashes there (``ggml_backend_amx_mul_mat``, ggml-org/llama.cpp#20824; GCC keeps an explicit ``-mno-*``
over ``-march=native``), so llama.cpp runs its AVX-512 code with its x86 repack, as on a CPU without AMX. The
measurements are taken in rounds, one repetition of each per round (kleidipy and llama.cpp at every thread count,
then the read bandwidth), so that each ratio compares figures taken in the same phases of the machine (on a VM,
whose speed drifts with its neighbours, back-to-back repetitions of one engine do not). The decode roofline is
weight bytes per token / the memory read bandwidth measured at that thread count in the rounds
(``benchmarks/kernels.py``'s streaming read, split over the threads, each part read as 1, 2 and 4 streams side by
side, the fastest). Prints two markdown tables: the runs, and
each thread count against the first: kleidipy's and llama.cpp's speed-ups, the read bandwidth's, and the decode
speed-up the read bandwidth leaves kleidipy (its roofline at that count over its decode at the first: a run that
reads at the limit gains no more, whatever its code).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from kleidipy.graph.execute import compile_model
from kleidipy.runtime.backend import KleidiBackend
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.pull import cache_dir, pull
from kleidipy.target import resolve_target
from kleidipy.tools import synthetic
from kleidipy.tools.limits import read_bandwidth

#: the llama row, and a row per further architecture (random Q4_0 weights of a real model's shape) that the
#: architectures table holds against it
LLAMA_ROW = "tinyllama-q4_0"
ARCHITECTURE_ROWS = {
    "qwen3-0.6b-q4_0": synthetic.QWEN3_0_6B,
    "gemma2-2b-q4_0": synthetic.GEMMA2_2B,
    "phi3-3.8b-q4_0": synthetic.PHI3_MINI_3_8B,
    "smollm3-3b-q4_0": synthetic.SMOLLM3_3B,
}


def bench_dir() -> Path:
    d = cache_dir().parent / "bench"
    d.mkdir(parents=True, exist_ok=True)
    return d


def requantized(name: str, key: str, qtype: str = "q4_0") -> Path:
    """``kleidipy quantize --pure`` of catalogue model ``name`` to ``qtype``, made once as bench/KEY.gguf."""
    from kleidipy.tools.quantize import quantize_gguf

    dst = bench_dir() / f"{key}.gguf"
    if not dst.exists():
        quantize_gguf(pull(name), dst, qtype, pure=True, progress=False)
    return dst


def model_files() -> dict[str, Path | callable]:
    """Model key -> a function making (or finding) its GGUF file."""

    def quantized(name: str, key: str):  # noqa: ANN202
        return lambda: requantized(name, key)

    def random(shape: synthetic.ModelShape, key: str):  # noqa: ANN202
        def make() -> Path:
            dst = bench_dir() / f"{key}-random.gguf"
            if not dst.exists():
                synthetic.write_random_model(dst, shape)
            return dst

        return make

    return {
        "smollm2-q4_1": lambda: pull("smollm2-135m-instruct"),
        "smollm2-q4_0": quantized("smollm2-135m-instruct", "smollm2-q4_0"),
        "qwen25-q4_k_m": lambda: pull("qwen2.5-coder-0.5b-instruct"),
        "qwen25-q4_0": quantized("qwen2.5-coder-0.5b-instruct", "qwen25-q4_0"),
        LLAMA_ROW: random(synthetic.TINYLLAMA_1_1B, "tinyllama-1.1b-q4_0"),
        **{key: random(shape, key) for key, shape in ARCHITECTURE_ROWS.items()},
    }


def _timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def weight_bytes(g: ModelFile) -> int:
    """Bytes of matmul weights read per decoded token (the LM head included, embeddings rows excluded)."""
    total = sum(t.data.nbytes for name, t in g.tensors.items() if len(t.shape) == 2 and name != "token_embd.weight")
    if "output.weight" not in g.tensors:
        total += g.tensors["token_embd.weight"].data.nbytes
    return total


class _Tests:
    """llama-bench's tests of an engine given as ``reset()`` and ``run(token_ids)``: the same random prompt and the
    same fixed decode tokens for every engine (decode cost only, no sampling), after llama-bench's warm-up (the prompt
    in full, then one token); each test from
    an empty cache filled first (untimed) with ``depth`` tokens (llama-bench's ``-d``). :meth:`rep` runs one
    repetition of both: pp and tg tokens/s."""

    def __init__(self, reset, run, n_vocab: int, n_prompt: int, n_gen: int, depth: int) -> None:  # noqa: ANN001
        rng = np.random.default_rng(0)
        self.ids = [int(i) for i in rng.integers(3, n_vocab, n_prompt)]
        self.gen_ids = [int(i) for i in rng.integers(3, n_vocab, n_gen)]
        self.depth_ids = [int(i) for i in rng.integers(3, n_vocab, depth)]
        self.reset, self.run = reset, run
        self._fresh()  # warm-up, as llama-bench's: the prompt in full (every buffer of the run touched), then a token
        run(self.ids)
        run(self.gen_ids[:1])

    def _fresh(self) -> None:
        self.reset()
        if self.depth_ids:
            self.run(self.depth_ids)

    def rep(self) -> tuple[float, float]:
        self._fresh()
        pp = len(self.ids) / _timed(lambda: self.run(self.ids))
        self._fresh()
        t0 = time.perf_counter()
        for tok in self.gen_ids:
            self.run([tok])
        return pp, len(self.gen_ids) / (time.perf_counter() - t0)


class KleidipyEngine:
    """A model loaded for the benchmark at one thread count: :meth:`rep` gives one repetition's pp and tg tokens/s,
    :attr:`host_us` the host (Python) µs per decoded token outside the compiled plan (median so far; None eager)."""

    def __init__(
        self,
        path: Path,
        threads: int,
        n_prompt: int,
        n_gen: int,
        depth: int,
        target,
        graph: bool,  # noqa: ANN001
    ) -> None:
        g = ModelFile(path)
        self.lm = lm = g.arch.build(
            g, linear=KleidiBackend(target, threads=threads, notice=lambda _m: None), n_ctx=depth + n_prompt + n_gen + 8
        )
        if graph:
            if not compile_model(lm, threads):
                raise SystemExit(f"{path}: cannot run as a compiled plan")
            lm.compiled.warm_up()  # (as the engine does: numba compiles, or loads, the multi-thread entry points here)
        self.host: list[float] = []
        self.tests = _Tests(lm.reset, self._decode, g.hparams.n_vocab, n_prompt, n_gen, depth)

    def _decode(self, ids: list[int]) -> np.ndarray:
        lm = self.lm
        if lm.compiled is None or len(ids) != 1:
            return lm.forward(ids)
        t0, inside = time.perf_counter(), lm.compiled.run_seconds
        out = lm.forward(ids)
        self.host.append(time.perf_counter() - t0 - (lm.compiled.run_seconds - inside))
        return out

    def rep(self) -> tuple[float, float]:
        return self.tests.rep()

    @property
    def host_us(self) -> float | None:
        return 1e6 * statistics.median(self.host) if self.host else None

    def close(self) -> None:
        if self.lm.compiled is not None:
            self.lm.compiled.close()


def bench_llama_cpp(
    python: str, path: Path, threads: int, n_prompt: int, n_gen: int, reps: int, depth: int
) -> tuple[list, list] | None:
    """llama.cpp timed as llama-bench does (benchmarks/llama_cpp_bench.py, run by ``python``); None without
    llama-cpp-python there."""
    script = Path(__file__).with_name("llama_cpp_bench.py")
    sizes = {"-p": n_prompt, "-n": n_gen, "-t": threads, "-r": reps, "-d": depth}
    cmd = [python, str(script), str(path), *(str(x) for kv in sizes.items() for x in kv)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"llama.cpp: not measured ({done.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
        return None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["pp"], result["tg"]


def _fmt(values: list[float] | None) -> str:
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {sd:.1f}"


def _ratio(a: list[float], b: list[float]) -> str:
    return f"{statistics.mean(a) / statistics.mean(b):.2f}x" if a and b else "—"


def _scaling_row(key: str, r: dict, first: dict, label: str, wbytes: int) -> str:
    """A row of the second table: run r against the first thread count's (kleidipy's and llama.cpp's speed-ups, the
    read bandwidth's, and kleidipy's decode speed-up were r's decode at its roofline)."""
    at_limit = [bw * 1e9 / wbytes for bw in r["bw"]]
    return (
        f"| {key} | {label} | {_ratio(r['pp'], first['pp'])} | {_ratio(r['tg'], first['tg'])} "
        f"| {_ratio(r['ref_pp'], first['ref_pp'])} | {_ratio(r['ref_tg'], first['ref_tg'])} "
        f"| {_ratio(r['bw'], first['bw'])} | {_ratio(at_limit, first['tg'])} |"
    )


def _ratio_of_ratios(r: dict, base: dict, what: str) -> str:
    mine, llama = r[what], r[f"ref_{what}"]
    if not (mine and llama and base[what] and base[f"ref_{what}"]):
        return "—"
    ratio = statistics.mean(mine) / statistics.mean(llama)
    return f"{ratio:.2f}x | {ratio / (statistics.mean(base[what]) / statistics.mean(base[f'ref_{what}'])):.2f}"


def architectures_table(results: dict, counts: list[int]) -> str:
    """Each further architecture's kleidipy/llama.cpp ratio beside the llama row's (the same run): the issue's bar
    is the quotient within 10 % of 1."""
    lines = [
        f"\n| model | threads | pp ratio | ÷ {LLAMA_ROW}'s | tg ratio | ÷ {LLAMA_ROW}'s |",
        "|---|---|---|---|---|---|",
    ]
    for key in (k for k in results if k in ARCHITECTURE_ROWS):
        for t in counts:
            base, r = results[LLAMA_ROW][t], results[key][t]
            lines.append(f"| {key} | {t} | {_ratio_of_ratios(r, base, 'pp')} | {_ratio_of_ratios(r, base, 'tg')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="pp64 / tg16, one repetition")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=2)
    ap.add_argument(
        "-d", "--n-depth", type=int, default=0, help="tokens in the cache before each test, as llama-bench's -d"
    )
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default=",".join(model_files()))
    ap.add_argument("--target", default=None, help="kleidipy target (default: host / virtual sme2:svl=512)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even if importable")
    ap.add_argument(
        "--llama-cpp-python",
        default=sys.executable,
        help="interpreter with llama-cpp-python that times llama.cpp (default: this one)",
    )
    ap.add_argument("--eager", action="store_true", help="kleidipy op by op from Python instead of the compiled plan")
    args = ap.parse_args(argv)
    if args.quick:
        args.n_prompt, args.n_gen, args.reps = 64, 16, 1
    target = resolve_target(args.target)
    files = model_files()
    counts = [int(t) for t in args.threads.split(",")]
    print(f"target {target.describe()}", file=sys.stderr)
    at = f" @ d{args.n_depth}" if args.n_depth else ""
    pp_name, tg_name = f"pp{args.n_prompt}{at}", f"tg{args.n_gen}{at}"
    print(
        f"| model | size | threads | kleidipy {pp_name} | llama.cpp {pp_name} | ratio | kleidipy {tg_name} "
        f"| llama.cpp {tg_name} | ratio | read GB/s | decode roofline | % of roofline | host µs/token |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    llama = not args.no_llama_cpp
    scaling, results = [], {}
    with ThreadPoolExecutor(max(counts)) as pool:
        for key in args.models.split(","):
            path = files[key]()
            wbytes = weight_bytes(ModelFile(path))
            engines = {
                t: KleidipyEngine(path, t, args.n_prompt, args.n_gen, args.n_depth, target, not args.eager)
                for t in counts
            }
            runs = {t: {name: [] for name in ("pp", "tg", "ref_pp", "ref_tg", "bw")} for t in counts}
            llama_here = llama  # (a file llama.cpp cannot load ends its runs for this model only)
            try:
                for _ in range(args.reps):  # rounds: each takes every measurement once, so all see the same VM
                    for t in counts:
                        r = runs[t]
                        pp, tg = engines[t].rep()
                        r["pp"].append(pp)
                        r["tg"].append(tg)
                        ref = llama_here and bench_llama_cpp(
                            args.llama_cpp_python, path, t, args.n_prompt, args.n_gen, 1, args.n_depth
                        )
                        llama_here = bool(ref)
                        if ref:
                            r["ref_pp"] += ref[0]
                            r["ref_tg"] += ref[1]
                        r["bw"].append(read_bandwidth(t, pool, 3))  # (the decode roofline at this thread count)
            finally:
                for engine in engines.values():
                    engine.close()
            results[key] = runs
            for t in counts:
                r, host = runs[t], engines[t].host_us
                roof = statistics.mean(r["bw"]) * 1e9 / wbytes
                print(
                    f"| {key} | {wbytes / 2**20:.0f} MiB | {t} | {_fmt(r['pp'])} | {_fmt(r['ref_pp'])} "
                    f"| {_ratio(r['pp'], r['ref_pp'])} | {_fmt(r['tg'])} | {_fmt(r['ref_tg'])} "
                    f"| {_ratio(r['tg'], r['ref_tg'])} | {statistics.mean(r['bw']):.1f} | {roof:.1f} t/s "
                    f"| {100 * statistics.mean(r['tg']) / roof:.0f} % | {'—' if host is None else f'{host:.0f}'} |",
                    flush=True,
                )
            scaling += [_scaling_row(key, runs[t], runs[counts[0]], f"{t} vs {counts[0]}", wbytes) for t in counts[1:]]
    if scaling:
        print(
            "\n| model | threads | kleidipy pp | kleidipy tg | llama.cpp pp | llama.cpp tg | read GB/s "
            "| kleidipy tg at the read's limit |"
        )
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(scaling))
    if LLAMA_ROW in results and set(ARCHITECTURE_ROWS) & set(results):
        print(architectures_table(results, counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
