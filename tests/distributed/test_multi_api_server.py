"""Past one process: two API servers over two data-parallel engine cores, a second
"node" (--headless) serving its core through the head, and Ray placing the cores."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from _dist_helpers import (MAX_TOKENS, PROMPTS, free_port, tail_log, wait_gone, wait_health,
                           worker_env)

ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "8",
                "--kv-cache-memory-bytes", str(32 << 20), "--no-enable-prefix-caching"]


class Deployment:
    """One `vllm serve` process (a head or a headless node) and its log."""

    def __init__(self, model: str, *flags: str, port: int = 0) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-multi-", suffix=".log",
                                               delete=False)
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "--host",
               "127.0.0.1", "--port", str(port), "--model", model, *ENGINE_FLAGS, *flags]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=worker_env())
        self.pid = self.proc.pid

    def descendants(self) -> set[int]:
        return {c.pid for c in psutil.Process(self.pid).children(recursive=True)}

    def core_pid(self, rank: int) -> int:
        """From the log's line prefixes: "(EngineCore_DP1 pid=123)"."""
        match = re.search(rf"\(EngineCore_DP{rank} pid=(\d+)\)", open(self.log.name).read())
        assert match, tail_log(self.log.name)
        return int(match.group(1))

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"did not exit in {timeout_s} s:\n{tail_log(self.log.name)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _complete(url: str, model: str, i: int, stream: bool) -> list[int]:
    """Greedy token ids of PROMPTS[i % 3] through the completions API."""
    body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
            "stream": stream}
    if not stream:
        r = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]
    ids: list[int] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ids += json.loads(line[6:])["choices"][0].get("token_ids") or []
    return ids


def _samples(url: str, name: str) -> dict[str, float]:
    """Per-engine totals of one metric (summed over its other labels)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if s.name == name:
                totals[s.labels["engine"]] = totals.get(s.labels["engine"], 0) + s.value
    return totals


@pytest.mark.timeout(300)
def test_two_api_servers_two_cores_match_one_process_then_a_dead_core_stops_it(
        tiny_qwen2, tiny_reference):
    head = Deployment(tiny_qwen2, "--api-server-count", "2", "--data-parallel-size", "2",
                      port=free_port())
    descendants: set[int] = set()
    try:
        wait_health(head.url, head.proc, head.log.name, timeout_s=240)
        descendants = head.descendants()
        # 64 concurrent streams, half streamed: every answer is the one-process answer.
        with ThreadPoolExecutor(64) as pool:
            got = list(pool.map(lambda i: _complete(head.url, tiny_qwen2, i, i % 2 == 0),
                                range(64)))
        assert got == [tiny_reference[i % len(PROMPTS)] for i in range(64)]
        # Each request counted once, whichever API server answers /metrics; both cores
        # served; the core's own series (prefix-cache queries) are not doubled.
        for _ in range(4):
            success = _samples(head.url, "vllm:request_success_total")
            assert sum(success.values()) == 64 and set(success) == {"0", "1"}, success
            assert min(success.values()) >= 16, success  # balanced by load
            generation = _samples(head.url, "vllm:generation_tokens_total")
            assert sum(generation.values()) == 64 * MAX_TOKENS
        # A core dies while requests run on both: they fail (no hang) and the head stops
        # the whole deployment with status 1, leaving no process behind (vLLM's way).
        started = threading.Event()
        results: list[str] = []

        def long_stream() -> None:
            body = {"model": tiny_qwen2, "prompt": "Hi", "max_tokens": 240,
                    "ignore_eos": True, "stream": True}
            try:
                with httpx.stream("POST", head.url + "/v1/completions", json=body,
                                  timeout=60) as r:
                    last = None
                    for line in r.iter_lines():
                        started.set()
                        if line.startswith("data: {"):
                            last = json.loads(line[6:])
                    results.append(json.dumps(last)[:300])
            except httpx.HTTPError as e:
                results.append(type(e).__name__)

        threads = [threading.Thread(target=long_stream) for _ in range(16)]
        for t in threads:
            t.start()
        assert started.wait(60)
        os.kill(head.core_pid(1), signal.SIGKILL)
        for t in threads:
            t.join(60)
        assert len(results) == 16, results  # none hangs
        # Each stream finished or ended with an error event; those on rank 1 name it.
        assert all('"length"' in r or r.startswith('{"error"') or "Error" in r
                   for r in results), results
        assert any("data-parallel rank 1" in r and "disconnected" in r for r in results), \
            results
        assert head.wait_exit(60) == 1
        log = open(head.log.name).read()
        assert "EngineCore_DP1 exited (killed by SIGKILL)" in log, tail_log(head.log.name)
    finally:
        head.stop()
    assert not wait_gone(descendants, timeout_s=15), "processes outlived the head"
    os.unlink(head.log.name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_a_second_node_serves_through_the_head(tiny_qwen2, tiny_reference, backend):
    """mp: a --headless "node" (its own process, ports of its own) runs rank 1; ray: the
    head places both cores with Ray. Either way the head's port serves both."""
    rpc = free_port()
    dp = ["--data-parallel-size", "2", "--data-parallel-address", "127.0.0.1",
          "--data-parallel-rpc-port", str(rpc)]
    if backend == "ray":
        head = Deployment(tiny_qwen2, *dp, "--data-parallel-backend", "ray",
                          port=free_port())
        nodes = [head]
    else:
        head = Deployment(tiny_qwen2, *dp, "--data-parallel-size-local", "1",
                          port=free_port())
        other = Deployment(tiny_qwen2, *dp, "--data-parallel-size-local", "1",
                           "--data-parallel-start-rank", "1", "--headless")
        nodes = [head, other]
    try:
        wait_health(head.url, head.proc, head.log.name, timeout_s=240)
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda i: _complete(head.url, tiny_qwen2, i, False),
                                range(8)))
        assert got == [tiny_reference[i % len(PROMPTS)] for i in range(8)]
        success = _samples(head.url, "vllm:request_success_total")
        assert set(success) == {"0", "1"} and min(success.values()) > 0, success
        # Stopping the head stops the other node's core (it watches the head).
        head.proc.send_signal(signal.SIGTERM)
        assert head.wait_exit(60) == 0, tail_log(head.log.name)
        for node in nodes[1:]:
            assert node.wait_exit(60) == 0, tail_log(node.log.name)
    finally:
        for node in nodes:
            node.stop()
    for node in nodes:
        os.unlink(node.log.name)
