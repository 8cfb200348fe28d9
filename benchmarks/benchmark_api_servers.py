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
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.compare_vllm_cpu import cpu_model_name  # noqa: E402
from benchmarks.served_compare import free_port, stop_server, wait_ready  # noqa: E402


def start(model: str, count: int, port: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    log = tempfile.NamedTemporaryFile("w", prefix=f"api{count}-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host",
           "127.0.0.1", "--port", str(port), "--disable-log-requests",
           "--disable-uvicorn-access-log", *extra]
    if count > 1:
        cmd += ["--api-server-count", str(count)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log.name


def _request_bytes(port: int, model: str, i: int, max_tokens: int, chat: bool,
                   stream: bool) -> bytes:
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": 0.0,
                  "ignore_eos": True, "stream": stream}
    if chat:
        body["messages"] = [{"role": "system", "content": "You are a helpful assistant."},
                            {"role": "user", "content": f"Request {i}: say hello."}]
    else:
        body["prompt"] = f"Request {i}: hello"
    data = json.dumps(body).encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode() + data


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> None:
    """One request on a kept-alive connection; raises on a status other than 200."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
    length, chunked = 0, False
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
        elif line.lower() == b"transfer-encoding: chunked":
            chunked = True
    if not chunked:
        await reader.readexactly(length)
        return
    while True:  # a stream: chunks until the empty one
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return


async def load(url: str, model: str, requests: int, concurrency: int,
               max_tokens: int, chat: bool = False, stream: bool = False
               ) -> tuple[float, list[float]]:
    """Closed loop: `concurrency` clients, `requests` in all; (seconds, latencies).

    A bare HTTP/1.1 client on kept-alive connections, requests encoded up front: an
    httpx client took a whole core at ~160 requests/s here, as much as the server's
    API process, so it measured itself."""
    port = int(url.rsplit(":", 1)[1])
    queue = [_request_bytes(port, model, i, max_tokens, chat, stream)
             for i in range(requests)][::-1]
    latencies: list[float] = []

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while queue:
                request = queue.pop()
                t0 = time.perf_counter()
                await _exchange(reader, writer, request)
                latencies.append(time.perf_counter() - t0)
        finally:
            writer.close()

    start_t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start_t, latencies


def cpu_seconds(server_pid: int, log: str) -> dict[str, float]:
    """CPU seconds so far of the server's processes by kind (engine cores: the pids of
    the log's "(EngineCore... pid=N)" prefixes; API servers: the others) and of this
    client process."""
    import re

    import psutil
    cores = {int(p) for p in re.findall(r"\(EngineCore\w* pid=(\d+)\)", open(log).read())}
    totals = {"api": 0.0, "core": 0.0, "client": sum(psutil.Process().cpu_times()[:2])}
    root = psutil.Process(server_pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            used = sum(proc.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
        totals["core" if proc.pid in cores else "api"] += used
    return totals


def _run(coro):
    """uvloop where installed (as the server uses): a cheaper client loop."""
    try:
        import uvloop
        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


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
    p.add_argument("--chat", action="store_true",
                   help="/v1/chat/completions with a system and a user message")
    p.add_argument("--stream", action="store_true", help="streamed responses (SSE)")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--output-json", default=None)
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: more `vllm serve` flags")
    args = p.parse_args()
    from vllm.engine.arg_utils import DEFAULT_MODEL
    model = args.model or DEFAULT_MODEL
    extra = [a for a in args.extra if a != "--"]
    print(f"CPU: {cpu_model_name()}, {os.cpu_count()} cores; {args.requests} "
          f"{'chat ' if args.chat else ''}{'streamed ' if args.stream else ''}requests, "
          f"{args.concurrency} concurrent, {args.max_tokens} output token(s)")
    results: dict[int, list[float]] = {c: [] for c in args.counts}
    rows = []
    for rep in range(args.reps):
        for count in args.counts:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc, log = start(model, count, port, extra)
            try:
                wait_ready(proc, port, args.startup_timeout, log)
                name = served_model_name(url)
                _run(load(url, name, 64, args.concurrency, args.max_tokens, args.chat,
                          args.stream))  # warm
                load_avg = os.getloadavg()[0]
                before = cpu_seconds(proc.pid, log)
                secs, lat = _run(load(url, name, args.requests, args.concurrency,
                                      args.max_tokens, args.chat, args.stream))
                after = cpu_seconds(proc.pid, log)
            finally:
                stop_server(proc)
                os.unlink(log)
            rate = args.requests / secs
            results[count].append(rate)
            row = dict(rep=rep, api_servers=count, req_per_s=round(rate, 1),
                       p50_ms=round(1000 * statistics.median(lat), 1),
                       p99_ms=round(1000 * sorted(lat)[int(0.99 * (len(lat) - 1))], 1),
                       load_avg_before=round(load_avg, 2),
                       cpu_share={k: round((after[k] - before[k]) / secs, 2) for k in after})
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = statistics.median(results[args.counts[0]])
    for count in args.counts:
        med = statistics.median(results[count])
        print(f"api servers {count}: median {med:.1f} req/s ({med / base:.2f}x)")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(dict(cpu=cpu_model_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
