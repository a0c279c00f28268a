"""Benchmark of the OpenAI-compatible server on loopback: throughput and time to first token under load.

Starts ``kleidipy.server.serve`` in a subprocess (or uses ``--url``), then for each concurrency level (1, 4 and
16 clients by default) runs that many streaming chat clients at once, each sending ``--rounds`` requests one
after the other, and prints a markdown table: completion tokens per second over the whole level (all clients),
time to first token (request sent -> first content delta; includes queueing when clients outnumber slots),
and each stream's own decode rate (tokens after the first / time after the first). Token counts come from the
server's usage chunk. A warm-up request runs first. ``--inside-poll S`` polls ``/api/inside`` every S seconds
while a level runs, as the chat page's Inside view does when open (0.5), to compare tokens/s with it open and
closed. The official ``openai`` client is the load generator. While
a level runs, ``/health`` is polled every 100 ms (its slowest answer shows whether the event loop stays responsive
while the compute thread is busy), and the server process's RSS is read before and after each level.

    python benchmarks/server.py [-m MODEL] [--parallel 4] [--clients 1,4,16] [--max-tokens 32] [--rounds 1]
                                [--deterministic] [--inside-poll 0.5]
    python benchmarks/server.py --url http://127.0.0.1:8080/v1      # an already running server
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

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
    """Launch the server in a subprocess and wait for /health."""
    port = free_port()
    code = (
        "from kleidipy.server import serve; "
        f"serve(model={args.model!r}, port={port}, threads={args.threads}, ctx={args.ctx}, "
        f"parallel={args.parallel}, deterministic={args.deterministic}, progress=False, log_level='warning')"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
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
    args = parser.parse_args()

    proc, url = (None, args.url) if args.url else start_server(args)
    try:
        card = openai.OpenAI(base_url=url, api_key="bench").models.list().data[0]
        model, meta = card.id, (card.model_extra or {}).get("meta", {})
        asyncio.run(level(url, model, 1, 1, 4))  # warm-up
        rows = []
        server = psutil.Process(proc.pid) if proc is not None else None
        for clients in (int(c) for c in args.clients.split(",")):
            rss0 = server.memory_info().rss if server else 0
            samples, wall, health = asyncio.run(
                level(url, model, clients, args.rounds, args.max_tokens, args.inside_poll)
            )
            rss = f"{(server.memory_info().rss - rss0) / 2**20:+.1f}" if server else "n/a"
            tokens = sum(s.tokens for s in samples)
            ttft = [s.ttft * 1e3 for s in samples]
            rates = [(s.tokens - 1) / (s.total - s.ttft) for s in samples if s.tokens > 1 and s.total > s.ttft]
            rows.append(
                f"| {clients:>7} | {len(samples):>8} | {tokens:>6} | {wall:>6.1f} | {tokens / wall:>11.1f} "
                f"| {statistics.median(ttft):>11.0f} | {percentile(ttft, 0.95):>11.0f} "
                f"| {statistics.median(rates) if rates else 0:>16.1f} | {health * 1e3:>14.0f} | {rss:>13} |"
            )
            print(f"  {clients} clients done", file=sys.stderr)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    slots = f"{meta.get('parallel', '?')} slots x {meta.get('n_ctx_slot', '?')} tokens"
    print(f"\nmodel {model}, {slots}, max_tokens {args.max_tokens}, {args.rounds} request(s) per client\n")
    print(
        "| clients | requests | tokens | wall s | tok/s (all) | TTFT p50 ms | TTFT p95 ms | stream tok/s p50 "
        "| /health max ms | RSS Δ MiB |"
    )
    print(
        "|--------:|---------:|-------:|-------:|------------:|------------:|------------:|-----------------:"
        "|---------------:|--------------:|"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
