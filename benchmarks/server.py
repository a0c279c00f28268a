"""Benchmark of the OpenAI-compatible server on loopback: throughput and time to first token under load.

Starts ``kleidipy.server.serve`` in a subprocess (or uses ``--url``), then for each concurrency level (1, 4 and
16 clients by default) runs that many streaming chat clients at once, each sending ``--rounds`` requests one
after the other, and prints a markdown table: completion tokens per second over the whole level (all clients),
time to first token (request sent -> first content delta; includes queueing when clients outnumber slots),
and each stream's own decode rate (tokens after the first / time after the first). Token counts come from the
server's usage chunk. A warm-up request runs first, then more until a kleidipy server runs its compiled plan (not
op by op while the plan builds, a first run's state). ``--inside-poll S`` polls ``/api/inside`` every S seconds
while a level runs, as the chat page's Inside view does when open (0.5), to compare tokens/s with it open and
closed. The official ``openai`` client is the load generator. While
a level runs, ``/health`` is polled every 100 ms (its slowest answer shows whether the event loop stays responsive
while the compute thread is busy), and the server process's RSS is read before and after each level.

``--llama-server PATH`` starts llama.cpp's ``llama-server`` beside it on the same GGUF file with the same slots
(``-np``), total context (``-c``), threads (``-t``/``-tb``), continuous batching and ``--jinja`` (the file's chat
template), and runs each level on both, alternating, ``--repeats`` times (a p95 of one run is noisy): a table per
engine (each figure the median of the repeats, with their range) and a table of kleidipy / llama-server — throughput
and time to first token p95 — per level.

    python benchmarks/server.py [-m MODEL] [--parallel 4] [--clients 1,4,16] [--max-tokens 32] [--rounds 1]
                                [--deterministic] [--inside-poll 0.5]
    python benchmarks/server.py --url http://127.0.0.1:8080/v1      # an already running server
    python benchmarks/server.py --parallel 16 -t 2 --max-tokens 64 --repeats 3 \
        --llama-server /path/to/llama.cpp/build/bin/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai
import psutil

TOPICS = ["a lighthouse", "a robot", "the sea", "a small town", "a dragon", "winter", "a train", "the moon"]


@dataclass
class Sample:
    ttft: float  # seconds from sending to the first content token
    total: float  # seconds from sending to the end of the stream
    tokens: int  # completion tokens (usage)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """Launch kleidipy's server in a subprocess and wait for /health."""
    port = free_port()
    code = (
        "from kleidipy.server import serve; "
        f"serve(model={args.model!r}, port={port}, threads={args.threads}, ctx={args.ctx}, "
        f"parallel={args.parallel}, deterministic={args.deterministic}, progress=False, log_level='warning')"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return wait_healthy(subprocess.Popen([sys.executable, "-c", code], env=env), port)


def start_llama_server(args: argparse.Namespace, ctx: int) -> tuple[subprocess.Popen, str]:
    """Launch llama.cpp's llama-server on the same GGUF file with the same slots, total context and threads."""
    from kleidipy.runtime.pull import pull

    path = Path(args.model) if Path(args.model).is_file() else pull(args.model)
    port = free_port()
    command = [
        args.llama_server, "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(args.parallel), "-c", str(ctx), "-t", str(args.threads), "-tb", str(args.threads),
        "--cont-batching", "--jinja", "--no-webui",
    ]  # fmt: skip
    log = open(Path(tempfile.gettempdir()) / f"llama-server-{port}.log", "w")  # noqa: SIM115 - the process's log
    return wait_healthy(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), port)


def wait_healthy(proc: subprocess.Popen, port: int) -> tuple[subprocess.Popen, str]:
    """Wait until the server at ``port`` answers /health (200); its process and its /v1 address."""
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("server did not start within 600 s")
        time.sleep(0.5)


def wait_compiled(url: str, model: str, limit: float = 900.0) -> None:
    """Until a kleidipy server at ``url`` (its /v1 address) runs its compiled plan, send it warm-up requests (it takes
    the plan between generations once the background build is over): a first run after a change of the code runs op
    by op while the plan builds (~170 ms a 16-row step instead of ~25), which no figure should include. A server
    without ``/api/inside`` (llama-server) is not waited for."""
    inside = url.removesuffix("/v1") + "/api/inside"
    deadline = time.monotonic() + limit
    while True:
        try:
            with urllib.request.urlopen(inside, timeout=10) as r:
                execution = json.load(r).get("execution", "")
        except (OSError, ValueError):
            return
        if not execution.startswith("op by op"):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the server still runs op by op after {limit:.0f} s: no compiled plan to measure")
        print("  waiting for the compiled plan (the server runs op by op while it builds)", file=sys.stderr)
        asyncio.run(level(url, model, 1, 1, 4))
        time.sleep(5)


async def one_request(client: openai.AsyncOpenAI, model: str, i: int, max_tokens: int) -> Sample:
    t0 = time.perf_counter()
    first = None
    tokens = 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}."}],
        max_tokens=max_tokens,
        temperature=0.8,
        seed=i,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
        if first is None and any(c.delta.content for c in chunk.choices):
            first = time.perf_counter()
    end = time.perf_counter()
    return Sample((first or end) - t0, end - t0, tokens)


def health_seconds(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=600) as r:
        r.read()
    return time.perf_counter() - t0


def inside_seconds(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url.removesuffix("/v1") + "/api/inside", timeout=600) as r:
        r.read()
    return time.perf_counter() - t0


async def level(
    url: str, model: str, clients: int, rounds: int, max_tokens: int, inside_poll: float = 0.0
) -> tuple[list[Sample], float, float]:
    """Run ``clients`` concurrent clients of ``rounds`` sequential requests (``/api/inside`` polled every
    ``inside_poll`` seconds when > 0); (samples, wall seconds, slowest /health answer in seconds)."""
    client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=3600)
    health: list[float] = []

    async def worker(c: int) -> list[Sample]:
        return [await one_request(client, model, c * rounds + r, max_tokens) for r in range(rounds)]

    async def poll_health() -> None:
        while True:
            health.append(await asyncio.to_thread(health_seconds, url))
            await asyncio.sleep(0.1)

    async def poll_inside() -> None:
        while True:
            await asyncio.to_thread(inside_seconds, url)
            await asyncio.sleep(inside_poll)

    pollers = [asyncio.create_task(poll_health())] + ([asyncio.create_task(poll_inside())] if inside_poll else [])
    t0 = time.perf_counter()
    per_client = await asyncio.gather(*(worker(c) for c in range(clients)))
    wall = time.perf_counter() - t0
    for poller in pollers:
        poller.cancel()
    await client.close()
    return [s for samples in per_client for s in samples], wall, max(health, default=0.0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Level:
    """One run of one concurrency level on one server."""

    requests: int
    tokens: int
    wall: float
    ttft_p50: float  # ms
    ttft_p95: float  # ms
    stream_p50: float  # tokens/s of one stream after its first token
    health: float  # slowest /health answer, ms
    rss: float | None  # MiB the server's RSS grew by (None: not our process)

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall


def run_level(url: str, model: str, clients: int, args: argparse.Namespace, server: psutil.Process | None) -> Level:
    rss0 = server.memory_info().rss if server else 0
    samples, wall, health = asyncio.run(level(url, model, clients, args.rounds, args.max_tokens, args.inside_poll))
    ttft = [s.ttft * 1e3 for s in samples]
    rates = [(s.tokens - 1) / (s.total - s.ttft) for s in samples if s.tokens > 1 and s.total > s.ttft]
    return Level(
        len(samples),
        sum(s.tokens for s in samples),
        wall,
        statistics.median(ttft),
        percentile(ttft, 0.95),
        statistics.median(rates) if rates else 0.0,
        health * 1e3,
        (server.memory_info().rss - rss0) / 2**20 if server else None,
    )


def spread(values: list[float], digits: int = 0) -> str:
    """The median of the repeats, with their range when there are several."""
    mid = f"{statistics.median(values):.{digits}f}"
    return mid if len(values) == 1 else f"{mid} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def table(runs: dict[int, list[Level]]) -> str:
    head = (
        "| clients | requests | tokens | wall s | tok/s (all) | TTFT p50 ms | TTFT p95 ms | stream tok/s p50 "
        "| /health max ms | RSS Δ MiB |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = []
    for clients, levels in runs.items():
        rss = [lv.rss for lv in levels if lv.rss is not None]
        rows.append(
            f"| {clients} | {levels[0].requests} | {levels[0].tokens} | {spread([lv.wall for lv in levels], 1)} "
            f"| {spread([lv.throughput for lv in levels], 1)} | {spread([lv.ttft_p50 for lv in levels])} "
            f"| {spread([lv.ttft_p95 for lv in levels])} | {spread([lv.stream_p50 for lv in levels], 1)} "
            f"| {max(lv.health for lv in levels):.0f} | {spread(rss, 1) if rss else 'n/a'} |"
        )
    return "\n".join([head, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="smollm2-135m-instruct")
    parser.add_argument("--parallel", type=int, default=4, help="server slots (default 4)")
    parser.add_argument("--ctx", type=int, default=None, help="server total context (default: the model's)")
    parser.add_argument("-t", "--threads", type=int, default=1)
    parser.add_argument("--clients", default="1,4,16", help="concurrency levels (default 1,4,16)")
    parser.add_argument("--rounds", type=int, default=1, help="requests per client per level (default 1)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--deterministic", action="store_true", help="serve with one forward pass per slot and step (no batching)"
    )
    parser.add_argument("--url", help="benchmark this running server instead of starting one")
    parser.add_argument(
        "--inside-poll", type=float, default=0.0, help="poll /api/inside every S seconds (the Inside view open: 0.5)"
    )
    parser.add_argument(
        "--llama-server", metavar="PATH", help="also start this llama-server on the same file; compare level by level"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of every level on each server (default 1)")
    args = parser.parse_args()
    if args.llama_server and args.url:
        parser.error("--llama-server compares with a kleidipy server this script starts: leave out --url")

    procs: list[subprocess.Popen] = []
    try:
        proc, url = (None, args.url) if args.url else start_server(args)
        procs += [proc] if proc else []
        card = openai.OpenAI(base_url=url, api_key="bench").models.list().data[0]
        meta = (card.model_extra or {}).get("meta", {})
        servers = {"kleidipy": (url, card.id, psutil.Process(proc.pid) if proc else None)}
        if args.llama_server:
            ctx = args.ctx or meta["parallel"] * meta["n_ctx_slot"]
            lproc, lurl = start_llama_server(args, ctx)
            procs.append(lproc)
            lcard = openai.OpenAI(base_url=lurl, api_key="bench").models.list().data[0]
            servers["llama-server"] = (lurl, lcard.id, psutil.Process(lproc.pid))
        levels = [int(c) for c in args.clients.split(",")]
        runs: dict[str, dict[int, list[Level]]] = {name: {c: [] for c in levels} for name in servers}
        for u, model, _ in servers.values():
            asyncio.run(level(u, model, 1, 1, 4))  # warm-up
        wait_compiled(url, model=card.id)
        for repeat in range(args.repeats):
            for clients in levels:
                for name, (u, model, process) in servers.items():
                    runs[name][clients].append(run_level(u, model, clients, args, process))
                    print(f"  repeat {repeat + 1}: {clients} clients done on {name}", file=sys.stderr)
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    slots = f"{meta.get('parallel', '?')} slots x {meta.get('n_ctx_slot', '?')} tokens"
    print(f"\nmodel {card.id}, {slots}, {args.threads} thread(s), max_tokens {args.max_tokens}, ", end="")
    print(f"{args.rounds} request(s) per client, {args.repeats} repeat(s): median (range)")
    for name, per_level in runs.items():
        print(f"\n{name}\n\n{table(per_level)}")
    if args.llama_server:
        print("\nkleidipy / llama-server (medians of the repeats)\n")
        print("| clients | throughput | TTFT p50 | TTFT p95 |\n|---:|---:|---:|---:|")
        for clients in levels:
            k, ll = runs["kleidipy"][clients], runs["llama-server"][clients]

            def ratio(f, k=k, ll=ll) -> str:  # noqa: ANN001
                return f"{statistics.median(f(lv) for lv in k) / statistics.median(f(lv) for lv in ll):.2f}×"

            print(
                f"| {clients} | {ratio(lambda lv: lv.throughput)} | {ratio(lambda lv: lv.ttft_p50)} "
                f"| {ratio(lambda lv: lv.ttft_p95)} |"
            )


if __name__ == "__main__":
    main()
