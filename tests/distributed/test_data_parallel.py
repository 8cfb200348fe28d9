"""Data parallel: two engine replicas behind one OpenAI server share the requests."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import psutil
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from _dist_helpers import free_port as _free_port
from _dist_helpers import tail_log as _tail
from _dist_helpers import wait_gone, wait_health as _wait_health, worker_env


def _worker_pids(server_pid: int) -> list[int]:
    """The engine worker processes under the server: spawned ones run spawn_main, forked
    ones keep the server's command line."""
    pids = []
    server_cmdline = psutil.Process(server_pid).cmdline()
    for p in psutil.Process(server_pid).children(recursive=True):
        try:
            cmdline = p.cmdline()
            if "spawn_main" in " ".join(cmdline) or cmdline == server_cmdline:
                pids.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def _success_by_engine(metrics_text: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == "vllm:request_success_total":
                totals[s.labels["engine"]] = totals.get(s.labels["engine"], 0) + s.value
    return totals


@pytest.mark.timeout(240)
def test_dp2_server_balances_aggregates_metrics_and_reports_dead_replica(tiny_qwen2):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w+", prefix="vllm-dp-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), "--model", tiny_qwen2, "--data-parallel-size", "2",
           "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "8",
           "--kv-cache-memory-bytes", str(32 << 20)]
    # The server stays up after a replica died only when told so (vLLM's default is to exit).
    env = dict(worker_env(), VLLM_KEEP_ALIVE_ON_ENGINE_DEATH="1")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    descendants: set[int] = set()
    try:
        _wait_health(url, proc, log.name, timeout_s=180)
        workers = _worker_pids(proc.pid)
        assert len(workers) == 2, workers  # one single-rank worker process per replica
        descendants = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}

        def complete(i: int) -> str:
            r = httpx.post(url + "/v1/completions", timeout=60, json={
                "model": tiny_qwen2, "prompt": "The capital of France is", "max_tokens": 8,
                "temperature": 0.0})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(complete, range(6)))
        assert len(set(texts)) == 1  # both replicas run the same model: same greedy text

        by_engine = _success_by_engine(httpx.get(url + "/metrics").text)
        assert set(by_engine) == {"0", "1"}
        assert by_engine["0"] > 0 and by_engine["1"] > 0 and sum(by_engine.values()) == 6

        os.kill(workers[1], signal.SIGKILL)  # while idle: only the monitor can notice
        deadline = time.monotonic() + 10
        status = 200
        while time.monotonic() < deadline and status == 200:
            status = httpx.get(url + "/health", timeout=5).status_code
            time.sleep(0.2)
        assert status == 503
        r = httpx.post(url + "/v1/completions", timeout=30,
                       json={"model": tiny_qwen2, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 503 and "died unexpectedly" in r.text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    assert proc.returncode == 0, _tail(log.name)
    assert not wait_gone(descendants, timeout_s=10), "engine processes outlived the server"
    os.unlink(log.name)


# ------------------------------------------------------------ no engine needed
class _StubStream:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


class _StubReplica:
    """What DPAsyncLLMEngine reads from a replica, without a model."""

    def __init__(self, index: int) -> None:
        self.model_config = SimpleNamespace(max_model_len=64, served_model_name=["m"])
        self.vllm_config = None
        self.engine = SimpleNamespace(get_tokenizer=lambda: None)
        registry = CollectorRegistry()
        Counter("vllm:prompt_tokens", "doc", ["model_name"], registry=registry).labels(
            "m").inc(10 * (index + 1))
        Gauge("vllm:num_requests_running", "doc", ["model_name"], registry=registry).labels(
            "m").set(index)
        self.stats = SimpleNamespace(registry=registry)
        self.added: list[str] = []

    async def add_request(self, request_id, prompt, params, arrival_time=None,
                          lora_request=None):
        self.added.append(request_id)
        return _StubStream(request_id)

    async def iterate(self, stream):
        yield stream.request_id


def test_least_outstanding_routing_and_engine_labels():
    from prometheus_client import generate_latest

    from vllm.engine.dp_engine import DPAsyncLLMEngine
    replicas = [_StubReplica(0), _StubReplica(1)]
    dp = DPAsyncLLMEngine(replicas)

    async def scenario() -> None:
        streams = [await dp.add_request(f"r{i}", "p", None) for i in range(3)]
        assert [r.added for r in replicas] == [["r0", "r2"], ["r1"]]
        with pytest.raises(ValueError, match="already in use"):
            await dp.add_request("r0", "p", None)
        for s in streams[::2]:  # replica 0 finishes both of its requests
            assert [o async for o in dp.iterate(s)] == [s.request_id]
        await dp.add_request("r3", "p", None)
        await dp.add_request("r4", "p", None)
        # Replica 0 was idle (0 vs 1 outstanding): it gets r3, then a tie rotates to 1.
        assert [r.added for r in replicas] == [["r0", "r2", "r3"], ["r1", "r4"]]

    asyncio.run(scenario())
    text = generate_latest(dp.stats.registry).decode()
    assert 'vllm:prompt_tokens_total{engine="0",model_name="m"} 10.0' in text
    assert 'vllm:prompt_tokens_total{engine="1",model_name="m"} 20.0' in text
    assert 'vllm:num_requests_running{engine="1",model_name="m"} 1.0' in text
    assert text.count("# TYPE vllm:prompt_tokens_total counter") == 1
