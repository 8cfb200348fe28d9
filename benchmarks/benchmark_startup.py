"""Server start-up time: process launch to the first `/health` 200, N times.

    python benchmarks/benchmark_startup.py --runs 5
    python benchmarks/benchmark_startup.py --runs 5 --first-start        # empty cache
    python benchmarks/benchmark_startup.py --runs 5 --checkout ../old --checkout .

Each run starts the README's first command (`python -m vllm.entrypoints.openai.api_server`,
the embedded default model; extra server flags after `--`), polls `/health` every 50 ms,
records the seconds from launch to the first 200 and the CPU seconds the server's
process tree used until then (and, with `--first-request`, the seconds of one short
completion after that), then stops the server with SIGTERM.
`--checkout DIR` (repeatable) runs the same command against another source tree (its
root on PYTHONPATH); the checkouts take turns run by run, so a shared machine's load
falls on all of them alike, and the summary gives each one's median. `--first-start`
gives every run a fresh, empty VLLM_CACHE_ROOT (model conversion, kernel builds and
timing included). The CPU model (`lscpu`) and the load average before each run are
printed: start-up is mostly CPU-bound imports and initialisation, so compare numbers
only from the same machine and similar load.

Before the runs, each checkout's `vllm` package is byte-compiled (`compileall`), as
`pip install` does for an installed package: with PYTHONDONTWRITEBYTECODE set (some CI
and container images set it), a source checkout would otherwise compile every module
it imports at every start (about half a second here), which is not what a later start
of an installed vLLM pays. `--no-compile` leaves the checkouts as they are.
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    # Run as a file: see benchmark_throughput.py.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import compileall
import json
import shlex
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Optional

import psutil

from benchmarks.compare_vllm_cpu import cpu_model_name, load_average

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COMMAND = "{python} -m vllm.entrypoints.openai.api_server --port {port}"
POLL_S = 0.05


@dataclass
class StartTime:
    checkout: str
    ready_s: float
    """Launch to the first /health 200."""
    cpu_s: float
    """CPU seconds (user + system) the server and its child processes had used by then:
    less sensitive to a shared machine's load than the wall time."""
    request_s: Optional[float]
    """One short completion right after (with --first-request)."""
    load: str
    """Load average (1/5/15 min) before the launch."""


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="starts per checkout")
    parser.add_argument("--checkout", action="append", default=None,
                        help="source tree to start (its root goes on PYTHONPATH); "
                             "repeat to compare, runs alternate (default: this one)")
    parser.add_argument("--first-start", action="store_true",
                        help="a fresh, empty VLLM_CACHE_ROOT for every run")
    parser.add_argument("--first-request", action="store_true",
                        help="also time one 8-token completion after /health")
    parser.add_argument("--no-compile", action="store_true",
                        help="do not byte-compile the checkouts first (see above)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one start may take before the run fails")
    parser.add_argument("--command", default=DEFAULT_COMMAND,
                        help="server command; {python} and {port} are filled in")
    args, extra = parser.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)} (server flags go after --)")
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    args.server_args = extra
    args.checkout = [os.path.abspath(c) for c in (args.checkout or [REPO_ROOT])]
    for checkout in args.checkout:
        if not os.path.isdir(checkout):
            parser.error(f"--checkout {checkout}: not a directory")
    return args


def byte_compile(checkout: str) -> bool:
    """Write `checkout`'s `vllm` byte-code (what `pip install` does); True if it all
    compiled."""
    package = os.path.join(checkout, "vllm")
    return not os.path.isdir(package) or bool(compileall.compile_dir(package, quiet=2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(template: str, port: int, server_args: list[str]) -> list[str]:
    return shlex.split(template.format(python=shlex.quote(sys.executable), port=port)) + \
        list(server_args)


def _get(url: str, body: Optional[dict] = None, timeout: float = 2.0) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, socket.timeout):
        return 0


def time_one_start(checkout: str, args: argparse.Namespace) -> StartTime:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=checkout + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="vllm-startup-") as cache:
        if args.first_start:
            env["VLLM_CACHE_ROOT"] = cache
        load = load_average()
        log = tempfile.TemporaryFile()
        start = time.perf_counter()
        proc = subprocess.Popen(server_command(args.command, port, args.server_args),
                                cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            ready_s = _wait_healthy(proc, port, start, args.timeout, log)
            cpu_s = tree_cpu_seconds(proc.pid)
            request_s = _time_request(port) if args.first_request else None
        finally:
            _stop(proc)
            log.close()
    return StartTime(checkout, ready_s, cpu_s, request_s, load)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its descendants (finished children
    that were waited for included)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _wait_healthy(proc: subprocess.Popen, port: int, start: float, timeout: float,
                  log) -> float:
    url = f"http://127.0.0.1:{port}/health"
    while True:
        if _get(url, timeout=1.0) == 200:
            return time.perf_counter() - start
        if proc.poll() is not None or time.perf_counter() - start > timeout:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            why = (f"exited with status {proc.returncode}" if proc.returncode is not None
                   else f"not healthy after {timeout:.0f} s")
            raise RuntimeError(f"The server {why}. Its output ends with:\n{tail}")
        time.sleep(POLL_S)


def _time_request(port: int) -> float:
    models = urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30)
    model = json.loads(models.read())["data"][0]["id"]
    start = time.perf_counter()
    status = _get(f"http://127.0.0.1:{port}/v1/completions",
                  {"model": model, "prompt": "The capital of France is", "max_tokens": 8,
                   "temperature": 0}, timeout=300)
    if status != 200:
        raise RuntimeError(f"The first completion answered HTTP {status}.")
    return time.perf_counter() - start


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def summarize(results: list[StartTime], checkouts: list[str]) -> list[str]:
    """One line per checkout: median, min and max seconds to ready (and first request)."""
    lines = []
    for checkout in checkouts:
        mine = [r for r in results if r.checkout == checkout]
        if not mine:
            continue
        ready = [r.ready_s for r in mine]
        line = (f"{checkout}: ready median {statistics.median(ready):.2f} s "
                f"(min {min(ready):.2f}, max {max(ready):.2f}, {len(ready)} runs), CPU "
                f"median {statistics.median(r.cpu_s for r in mine):.2f} s")
        requests = [r.request_s for r in mine if r.request_s is not None]
        if requests:
            line += f", first completion median {statistics.median(requests):.2f} s"
        lines.append(line)
    return lines


def main(argv: Optional[list[str]] = None) -> list[StartTime]:
    args = parse_args(argv)
    print(f"CPU: {cpu_model_name()}, {os.cpu_count()} CPUs; "
          f"{'first start (empty cache)' if args.first_start else 'later starts'}")
    if not args.no_compile:
        for checkout in args.checkout:
            if not byte_compile(checkout):
                print(f"{checkout}: some modules did not byte-compile", flush=True)
    results = []
    for run in range(args.runs):
        for checkout in args.checkout:
            result = time_one_start(checkout, args)
            results.append(result)
            extra = (f", first completion {result.request_s:.2f} s"
                     if result.request_s is not None else "")
            print(f"run {run + 1} {checkout}: ready in {result.ready_s:.2f} s "
                  f"({result.cpu_s:.2f} CPU s){extra} "
                  f"(load before {result.load})", flush=True)
    for line in summarize(results, args.checkout):
        print(line)
    return results


if __name__ == "__main__":
    main()
