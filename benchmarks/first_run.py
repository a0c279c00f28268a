"""Benchmark of a first run on a machine: README's first command with empty compiled-code and repack caches.

For each model, ``python -m kleidipy run -m MODEL -p PROMPT -n 64`` runs in a new process with a new numba cache
(``NUMBA_CACHE_DIR``) and a new kleidipy cache holding only the already pulled model file (no repack cache, no trace
copy); printed: seconds to the first byte of the answer (after the prompt, which a model without a chat template echoes)
and to the end. Two ways each: the default first run (the
answer op by op while nothing is compiled; the compiled plan's background build starts after it and is not waited
for) and ``KLEIDIPY_BACKGROUND_COMPILE=0`` (the whole compiled plan first, in the foreground: the first-run compile
of the plan). ``--tree DIR`` runs another checkout's kleidipy (``PYTHONPATH``), e.g. an older commit in a git
worktree, for a before/after on the same machine. Run it on an idle machine: two processes compiling at once on two
vCPUs take twice as long.

    python benchmarks/first_run.py [--tree DIR] [--plan-only] [--models smollm2-135m-instruct,...]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kleidipy.runtime.pull import CATALOGUE, DEFAULT_MODEL, pull

PROMPT = "What is the capital of France?"
MODELS = ("smollm2-135m-instruct", DEFAULT_MODEL, "gemma3-270m")
#: tokens at most (the chat models' answers are shorter; Gemma 3 270M, a base model, would go on to the context's end)
MAX_TOKENS = 64


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def first_run(tree: Path, model: Path, background: bool) -> tuple[float, float]:
    """Seconds to the first byte of stdout and to the end of one first run of ``model`` with empty caches."""
    with tempfile.TemporaryDirectory(prefix="kleidipy-first-run-") as tmp:
        cache = Path(tmp) / "cache"
        (cache / "models").mkdir(parents=True)
        (cache / "models" / model.name).symlink_to(model)
        env = dict(os.environ, KLEIDIPY_CACHE=str(cache), NUMBA_CACHE_DIR=str(Path(tmp) / "numba"))
        env["PYTHONPATH"] = str(tree)
        env["KLEIDIPY_BACKGROUND_COMPILE"] = "1" if background else "0"
        env.pop("KLEIDIPY_MODEL", None)
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "kleidipy", "run", "-m", str(model), "-p", PROMPT, "-n", str(MAX_TOKENS)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=tmp)
        echo = PROMPT.encode()  # (a model without a chat template continues the prompt, which is printed first)
        head = proc.stdout.read(1)
        if head == echo[:1]:
            head += proc.stdout.read(len(echo) - 1)
            if head == echo:
                head = proc.stdout.read(1)
        first = head and time.perf_counter() - t0
        proc.stdout.read()
        if proc.wait():
            raise SystemExit(f"first_run: {model.name} exited with {proc.returncode}")
        end = time.perf_counter() - t0
        _stop_background_build(model)
    return float(first or end), end


def _stop_background_build(model: Path) -> None:
    """Stop the background build the run left (its child compiles into the run's temporary numba cache)."""
    subprocess.run(["pkill", "-f", f"kleidipy.runtime.plan_child {model}"], check=False, capture_output=True)
    time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout to run")
    parser.add_argument("--models", default=",".join(MODELS), help="catalogue names, comma-separated")
    parser.add_argument("--plan-only", action="store_true", help="only the plan compiled first (no default first run)")
    args = parser.parse_args()
    tree = args.tree.resolve()
    rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} vCPUs; kleidipy tree {tree} ({rev.stdout.strip() or '?'})\n")
    print("| model | first run (op by op, plan built after): first token / end | plan compiled first: first token |")
    print("|---|---|---|")
    for name in args.models.split(","):
        if name not in CATALOGUE:
            raise SystemExit(f"first_run: {name!r} is not a catalogue model")
        path = pull(name, progress=False)
        default = "—" if args.plan_only else "{:.1f} s / {:.1f} s".format(*first_run(tree, path, background=True))
        plan_first, _ = first_run(tree, path, background=False)
        print(f"| {name} | {default} | {plan_first:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
