"""Disaggregated (prefill instance + decode instance + proxy) vs colocated (one
instance) serving: TTFT and TPOT of the same streamed workload on each.

Starts the servers itself, one setup after the other (they never compete with each
other), runs benchmarks/benchmark_serving.py against each (random prompts,
--max-concurrency streams, ignore_eos) and prints both reports and a comparison:

    python benchmarks/benchmark_disagg.py --model MODEL --num-prompts 64 \\
        --max-concurrency 16 --input-len 256 --output-len 64

The disaggregated pair uses P2pZmqConnector over loopback and
examples/disagg_proxy_server.py. On one CPU host both instances share the same cores,
so this measures the cost of the transfer and the proxy hop, not the gain of separate
machines for prefill and decode.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A child process (a server or the proxy) that answers GET /health."""

    def __init__(self, cmd: list[str], port: int, log_dir: str, name: str,
                 timeout_s: float = 600.0) -> None:
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = open(os.path.join(log_dir, f"{name}.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}; see "
                                   f"{self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{name} not ready after {timeout_s} s; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def server(args: argparse.Namespace, log_dir: str, name: str,
           kv_config: Optional[dict] = None) -> Process:
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), "--model", args.model, "--max-num-seqs",
           str(args.max_concurrency), "--disable-log-requests", *args.server_args]
    if kv_config is not None:
        cmd += ["--kv-transfer-config", json.dumps(kv_config)]
    return Process(cmd, port, log_dir, name)


def bench(args: argparse.Namespace, url: str, log_dir: str, name: str) -> dict:
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "benchmark_serving.py"),
           "--base-url", url, "--model", args.model, "--dataset-name", "random",
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--num-prompts", str(args.num_prompts), "--max-concurrency",
           str(args.max_concurrency), "--ignore-eos", "--disable-tqdm", "--save-result",
           "--result-dir", log_dir, "--result-filename", f"{name}.json",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    with open(os.path.join(log_dir, f"{name}.json")) as f:
        return json.load(f)


def colocated(args: argparse.Namespace, log_dir: str) -> dict:
    one = server(args, log_dir, "colocated")
    try:
        return bench(args, one.url, log_dir, "colocated")
    finally:
        one.stop()


def disaggregated(args: argparse.Namespace, log_dir: str) -> dict:
    kv_port = free_port()
    parts: list[Process] = []
    try:
        parts.append(server(args, log_dir, "prefill", {
            "kv_connector": "P2pZmqConnector", "kv_role": "kv_producer", "kv_port": kv_port}))
        parts.append(server(args, log_dir, "decode", {
            "kv_connector": "P2pZmqConnector", "kv_role": "kv_consumer"}))
        port = free_port()
        parts.append(Process([sys.executable, os.path.join(ROOT, "examples",
                                                           "disagg_proxy_server.py"),
                              "--prefill", parts[0].url, "--decode", parts[1].url,
                              "--port", str(port)], port, log_dir, "proxy"))
        return bench(args, parts[2].url, log_dir, "disaggregated")
    finally:
        for part in reversed(parts):
            part.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from vllm.config import DEFAULT_MODEL
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                        help="extra flags for every server (last on the command line)")
    args = parser.parse_args()
    log_dir = tempfile.mkdtemp(prefix="bench-disagg-")
    results = {"colocated": colocated(args, log_dir),
               "disaggregated": disaggregated(args, log_dir)}
    print(f"\n{'':24}{'colocated':>14}{'disaggregated':>16}   (logs: {log_dir})")
    for key, title in (("mean_ttft_ms", "Mean TTFT (ms)"), ("p99_ttft_ms", "P99 TTFT (ms)"),
                       ("mean_tpot_ms", "Mean TPOT (ms)"), ("p99_tpot_ms", "P99 TPOT (ms)"),
                       ("output_throughput", "Output tok/s"), ("completed", "Completed")):
        row = [results[k].get(key) for k in ("colocated", "disaggregated")]
        print(f"{title:24}" + "".join(f"{v:>14.1f}  " if isinstance(v, float) else
                                      f"{v!s:>14}  " for v in row))


if __name__ == "__main__":
    main()
