"""Tensor parallel over two "nodes" without Ray (--nnodes): a head that serves and a
--headless node whose worker joins it over TCP, on one machine; flag checks by name."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import httpx
import psutil
import pytest

from _dist_helpers import ENGINE_KWARGS, MAX_TOKENS, PROMPTS, wait_gone, worker_env
from vllm.config import ParallelConfig


def _free_port(pairs: bool = False) -> int:
    """A free port (and the next one, which the head's RPC listener takes)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not pairs or port >= 65534:
            return port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


def _engine_flags(model: str) -> list[str]:
    e = ENGINE_KWARGS
    return ["--model", model, "--dtype", e["dtype"], "--max-model-len", str(e["max_model_len"]),
            "--kv-cache-memory-bytes", str(e["kv_cache_memory_bytes"]),
            "--max-num-seqs", str(e["max_num_seqs"]), "--no-enable-prefix-caching"]


def _completion_ids(url: str, model: str) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        r = httpx.post(url + "/v1/completions", timeout=60, json=dict(
            model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
            ignore_eos=True, return_token_ids=True))
        r.raise_for_status()
        out.append(r.json()["choices"][0]["token_ids"])
    return out


@pytest.mark.timeout(120)
def test_tp2_over_two_nodes_equals_tp1_and_a_dead_remote_fails_the_engine(
        tiny_qwen2, tiny_reference):
    master, http = _free_port(pairs=True), _free_port()
    dist = ["-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(master)]
    env = dict(worker_env(), VLLM_CPU_OMP_THREADS_BIND="nobind")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           *_engine_flags(tiny_qwen2), *dist]
    logs = [tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False) for _ in "ab"]
    node1 = subprocess.Popen(cmd + ["--node-rank", "1", "--headless"], env=env,
                             stdout=logs[1], stderr=subprocess.STDOUT)
    head = subprocess.Popen(cmd + ["--node-rank", "0", "--host", "127.0.0.1", "--port",
                                   str(http)], env=env, stdout=logs[0],
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}"
    try:
        _wait_health(url, head, logs, timeout_s=90)
        assert _completion_ids(url, tiny_qwen2) == tiny_reference
        # The remote worker dies: the head's engine fails at once (not at a timeout):
        # /health turns 503, or the server has already exited on the dead engine.
        for p in psutil.Process(node1.pid).children(recursive=True):
            p.kill()
        assert node1.wait(15) == 1
        deadline = time.monotonic() + 15
        while head.poll() is None and _health(url) != 503:
            assert time.monotonic() < deadline, _tail(logs[0])
            time.sleep(0.2)
        assert head.poll() in (None, 1), _tail(logs[0])
        assert "Remote worker rank 1" in _tail(logs[0], 400)
    finally:
        for proc in (head, node1):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (head, node1):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert not wait_gone({head.pid, node1.pid})


@pytest.mark.timeout(120)
def test_pp2_over_two_nodes_offline_equals_tp1(tiny_qwen2, tiny_reference, monkeypatch):
    """The driver (last stage) is the remote rank: its replies cross the network."""
    from _dist_helpers import run_greedy
    # This process ran torch's OpenMP pool (the reference): a forked rank with more than
    # one thread (one rank per node takes every core) would hang in its first parallel
    # region, so the head's worker is spawned.
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    master = _free_port(pairs=True)
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    node1 = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *_engine_flags(tiny_qwen2),
         "-pp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port",
         str(master), "--node-rank", "1", "--headless"],
        env=dict(worker_env(), VLLM_CPU_OMP_THREADS_BIND="nobind"), stdout=log,
        stderr=subprocess.STDOUT)
    try:
        assert run_greedy(tiny_qwen2, pipeline_parallel_size=2, nnodes=2,
                          master_addr="127.0.0.1", master_port=master) == tiny_reference
        assert node1.wait(30) == 0, _tail(log)  # the head shut it down
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.wait(10)


def _health(url: str) -> int:
    try:
        return httpx.get(url + "/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _wait_health(url: str, proc: subprocess.Popen, logs, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"head exited with {proc.returncode}:\n{_tail(logs[0])}" \
                                    f"\n--- node 1 ---\n{_tail(logs[1])}"
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"head not ready:\n{_tail(logs[0])}\n--- node 1 ---\n{_tail(logs[1])}")


def _tail(log, lines: int = 40) -> str:
    log.flush()
    with open(log.name) as f:
        return "".join(f.readlines()[-lines:])


@pytest.mark.parametrize("kwargs, match", [
    (dict(tensor_parallel_size=2, nnodes=2, distributed_executor_backend="ray"),
     "nnodes=2 is for the mp executor.*ray"),
    (dict(tensor_parallel_size=2, nnodes=2, data_parallel_size=2),
     "nnodes=2 spreads one engine's.*data_parallel_size=2"),
    (dict(tensor_parallel_size=3, nnodes=2), "nnodes=2 must divide"),
    (dict(tensor_parallel_size=2, nnodes=2, node_rank=2), r"node_rank must be in \[0, nnodes=2\)"),
    (dict(nnodes=0), "nnodes must be >= 1"),
    (dict(tensor_parallel_size=2, nnodes=2, master_port=65535), "master_port must be"),
])
def test_multi_node_flags_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ParallelConfig(**kwargs)


def test_headless_refuses_node_zero_and_the_head_refuses_other_settings(caplog):
    from vllm.executor.multinode import (NodeLayout, RemoteWorkerListener, _connect,
                                         run_headless)
    pc = ParallelConfig(tensor_parallel_size=2, nnodes=2, master_port=_free_port(pairs=True))
    with pytest.raises(ValueError, match="--headless runs the workers of a node other"):
        run_headless(SimpleNamespace(parallel_config=pc))
    layout = NodeLayout.of(pc)
    listener = RemoteWorkerListener(layout, {"tensor_parallel_size": 2})
    errors = []

    def worker():
        with socket.create_connection(layout.rpc_address) as stray:  # e.g. a port scan:
            stray.sendall(b"GET / HTTP/1.0\r\n\r\n")  # dropped, not an error
        try:
            _connect(layout, 1, {"tensor_parallel_size": 4}, "rpc", timeout_s=10)
        except ValueError as e:
            errors.append(str(e))

    thread = threading.Thread(target=worker)
    thread.start()
    with pytest.raises(RuntimeError, match=r"tensor_parallel_size=4 \(head: 2\)"):
        listener.accept_all(timeout_s=10)
    thread.join(10)
    assert errors and "refused rank 1" in errors[0]
    assert "Dropped a connection from 127.0.0.1" in caplog.text
