"""Served request rate with 1 vs N API server processes (--api-server-count), on a
workload where the frontend is the bottleneck: many short requests (a few prompt
tokens, one or two output tokens), so that HTTP, JSON, tokenization and detokenization
cost more than the engine's step.

Each configuration is a fresh `vllm serve`; the configurations run interleaved
(A B A B ...) and every line carries the CPU model and the load average, since the
client runs on the same machine and takes its share of the cores.

    python benchmarks/benchmark_api_servers.py --counts 1 2 --reps 2
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.served_compare import free_port, stop_server  # noqa: E402


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def start(model: str, count: int, port: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    log = tempfile.NamedTemporaryFile("w", prefix=f"api{count}-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host",
           "127.0.0.1", "--port", str(port), "--disable-log-requests",
           "--disable-uvicorn-access-log", *extra]
    if count > 1:
        cmd += ["--api-server-count", str(count)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log.name


def wait_ready(proc: subprocess.Popen, url: str, log: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{open(log).read()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready:\n{open(log).read()[-3000:]}")


async def load(url: str, model: str, requests: int, concurrency: int,
               max_tokens: int) -> tuple[float, list[float]]:
    """Closed loop: `concurrency` clients, `requests` in all; (seconds, latencies)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t0 = time.perf_counter()
                r = await client.post(url + "/v1/completions", json={
                    "model": model, "prompt": f"Request {i}: hello", "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True})
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)

        start_t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start_t, latencies


def served_model_name(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the embedded default model")
    p.add_argument("--counts", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--output-json", default=None)
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: more `vllm serve` flags")
    args = p.parse_args()
    from vllm.engine.arg_utils import DEFAULT_MODEL
    model = args.model or DEFAULT_MODEL
    extra = [a for a in args.extra if a != "--"]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.requests} requests, "
          f"{args.concurrency} concurrent, {args.max_tokens} output token(s)")
    results: dict[int, list[float]] = {c: [] for c in args.counts}
    rows = []
    for rep in range(args.reps):
        for count in args.counts:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc, log = start(model, count, port, extra)
            try:
                wait_ready(proc, url, log, args.startup_timeout)
                name = served_model_name(url)
                asyncio.run(load(url, name, 64, args.concurrency, args.max_tokens))  # warm
                load_avg = os.getloadavg()[0]
                secs, lat = asyncio.run(load(url, name, args.requests, args.concurrency,
                                             args.max_tokens))
            finally:
                stop_server(proc)
                os.unlink(log)
            rate = args.requests / secs
            results[count].append(rate)
            row = dict(rep=rep, api_servers=count, req_per_s=round(rate, 1),
                       p50_ms=round(1000 * statistics.median(lat), 1),
                       p99_ms=round(1000 * sorted(lat)[int(0.99 * (len(lat) - 1))], 1),
                       load_avg_before=round(load_avg, 2))
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = statistics.median(results[args.counts[0]])
    for count in args.counts:
        med = statistics.median(results[count])
        print(f"api servers {count}: median {med:.1f} req/s ({med / base:.2f}x)")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(dict(cpu=cpu_model(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
