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
                    if r.status_code != 200:  # arrived after the core died: refused
                        started.set()
                        results.append(r.read().decode()[:300])
                        return
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
        # Each stream finished, ended with an error event or was refused with an error;
        # those on rank 1 name it.
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


# ------------------------------------------------------------ no engine needed
def _serve_args(*argv: str):
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser().parse_args(list(argv))


@pytest.mark.parametrize("argv, message", [
    (["--headless", "--api-server-count", "2"], "cannot be used with --headless"),
    (["--api-server-count", "0"], "use --headless"),
    (["--api-server-count", "-1"], "--api-server-count must be >= 0"),
    (["-dp", "2", "--data-parallel-start-rank", "1"], "is for a --headless node"),
])
def test_deployment_flags_refused_by_name(argv, message):
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    with pytest.raises(ValueError, match=message):
        validate_parsed_serve_args(_serve_args(*argv))


def test_runtime_lora_updates_refused_with_several_api_servers(monkeypatch):
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    with pytest.raises(ValueError, match="would be unknown to the others"):
        validate_parsed_serve_args(_serve_args("--api-server-count", "2"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(data_parallel_size=2, data_parallel_size_local=3), "data_parallel_size_local"),
    (dict(data_parallel_size=2, data_parallel_start_rank=2), "data_parallel_start_rank"),
    (dict(data_parallel_size=4, data_parallel_size_local=2, data_parallel_start_rank=3),
     "exceeds data_parallel_size"),
    (dict(data_parallel_backend="mpi"), "data_parallel_backend"),
    (dict(data_parallel_rpc_port=70000), "data_parallel_rpc_port"),
])
def test_data_parallel_layout_checked(kwargs, message):
    from vllm.config import ParallelConfig
    with pytest.raises(ValueError, match=message):
        ParallelConfig(**kwargs)


def test_the_module_entry_point_sends_deployments_to_vllm_serve():
    from vllm.entrypoints.openai.api_server import run_server
    with pytest.raises(ValueError, match="run them with `vllm serve`"):
        run_server(_serve_args("--api-server-count", "2"))


def test_a_shared_core_loads_an_adapter_once():
    """Every API server loads its --lora-modules on every core: once per core; a
    load_inplace or a new generation (the frontend's stamp of a reload) still reloads."""
    from types import SimpleNamespace

    from vllm.engine.utility import _add_lora
    from vllm.lora.request import LoRARequest
    calls = []
    core = SimpleNamespace(vllm_config=SimpleNamespace(lora_config=object()),
                           loaded_loras={},
                           collective_rpc=lambda m, args: calls.append(m) or [True])
    lora = LoRARequest(lora_name="a", lora_int_id=1, lora_path="/adapters/a")
    assert _add_lora(core, lora) and _add_lora(core, lora)
    assert calls == ["add_lora"]
    assert _add_lora(core, LoRARequest(lora_name="a", lora_int_id=1,
                                       lora_path="/adapters/a", load_inplace=True))
    assert calls == ["add_lora", "add_lora"]
    assert _add_lora(core, LoRARequest(lora_name="a", lora_int_id=1,
                                       lora_path="/adapters/a", generation=1))
    assert calls == ["add_lora", "add_lora", "add_lora"]


def test_routing_follows_the_cores_reported_load():
    """Several API servers balance by what each core reports (waiting + running), plus
    what this one sent since the report."""
    import asyncio
    from types import SimpleNamespace

    from vllm.engine.dp_engine import DPAsyncLLMEngine

    class Replica:
        def __init__(self, waiting: int, running: int) -> None:
            self.model_config = SimpleNamespace(max_model_len=64, served_model_name=["m"])
            self.vllm_config = None
            from prometheus_client import CollectorRegistry
            self.stats = SimpleNamespace(
                registry=CollectorRegistry(), last_scheduler_stats=SimpleNamespace(
                    num_waiting_reqs=waiting, num_running_reqs=running))
            self.added: list[str] = []

        async def add_request(self, request_id, *args, **kwargs):
            self.added.append(request_id)
            return Stream(request_id)

    class Stream:
        def __init__(self, request_id: str) -> None:
            self.request_id = request_id

    busy, idle = Replica(waiting=3, running=2), Replica(waiting=0, running=2)
    dp = DPAsyncLLMEngine([busy, idle])

    async def scenario() -> None:
        for i in range(5):
            await dp.add_request(f"r{i}", "p", None)

    asyncio.run(scenario())
    # idle (load 2) takes r0-r2 until it reaches busy's 5, then they alternate.
    assert idle.added == ["r0", "r1", "r2", "r4"] and busy.added == ["r3"]
    # A new report replaces what this frontend counted since the last one.
    idle.stats.last_scheduler_stats = SimpleNamespace(num_waiting_reqs=9, num_running_reqs=0)
    asyncio.run(dp.add_request("r5", "p", None))
    assert busy.added == ["r3", "r5"]
