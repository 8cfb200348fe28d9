"""Shutdown and engine death end every stream cleanly (real server, tiny model).

SIGTERM under 16 streams: streams that can finish within --shutdown-timeout finish, the
others end with an error event; every one ends with `data: [DONE]`, new requests get 503,
the process exits within the grace period, and the log holds no traceback. A killed
worker process makes the server exit non-zero within 10 s (its stream gets an error event).
"""
from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import httpx
import psutil
import pytest
import torch

from tests.entrypoints.conftest import RemoteServer

SHUTDOWN_TIMEOUT_S = 3.0


LONG = 30000  # tokens no machine generates within the grace period


def server_args(model: str, max_model_len: int = 1024) -> list[str]:
    return ["--model", model, "--dtype", "float32", "--max-model-len", str(max_model_len),
            "--max-num-seqs", "16", "--kv-cache-memory-bytes", str(32 << 20),
            "--disable-log-requests", "--disable-uvicorn-access-log"]


def read_stream(url: str, max_tokens: int, events: list, first: threading.Event) -> None:
    """Consume one completion stream into `events` (parsed data lines, "[DONE]")."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
                first.set()
    except httpx.HTTPError as e:
        events.append(f"transport error: {e!r}")
    finally:
        first.set()


def start_streams(url: str, lengths: list[int]) -> list[tuple[threading.Thread, list]]:
    streams = []
    for max_tokens in lengths:
        events: list = []
        first = threading.Event()
        thread = threading.Thread(target=read_stream, args=(url, max_tokens, events, first))
        thread.start()
        streams.append((thread, events, first))
    for _, _, first in streams:
        assert first.wait(60), "a stream never started"
    return [(thread, events) for thread, events, _ in streams]


def test_sigterm_ends_every_stream_and_exits_in_grace(tiny_model_factory):
    model = tiny_model_factory("llama", max_position_embeddings=LONG + 64)
    srv = RemoteServer(server_args(model, LONG + 64) +
                       ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)])
    try:
        # 8 streams that finish well within the grace period, 8 that cannot (on a fast,
        # idle machine 8 x 1000 tokens of the tiny model did finish within 3 s).
        streams = start_streams(srv.url, [12] * 8 + [LONG] * 8)
        srv.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        time.sleep(0.3)
        try:
            late = httpx.post(srv.url + "/v1/completions", timeout=10,
                              json={"prompt": "late", "max_tokens": 2})
            assert late.status_code == 503, late.text
            assert late.json()["error"]["code"] == 503
        except httpx.TransportError:
            pass  # already closed: refused as well
        code = srv.proc.wait(SHUTDOWN_TIMEOUT_S + 15)
        took = time.monotonic() - sent
    finally:
        srv.stop(signal.SIGKILL)
    for thread, _ in streams:
        thread.join(10)
    log = srv.tail(400)
    assert code == 0, log
    assert took < SHUTDOWN_TIMEOUT_S + 10, (took, log)
    assert "Traceback" not in log, log
    finished = errored = 0
    for _, events in streams:
        assert events and events[-1] == "[DONE]", events[-3:]
        last = events[-2]
        if "error" in last:
            assert last["error"]["code"] == 503, last
            errored += 1
        else:
            assert last["choices"][0]["finish_reason"] == "length", last
            finished += 1
    assert finished >= 8 and errored >= 1, (finished, errored)


def test_killed_worker_exits_nonzero_within_10s(tiny_model_factory):
    srv = RemoteServer(server_args(tiny_model_factory("llama")) +
                       ["--distributed-executor-backend", "mp"])
    try:
        workers = [p for p in psutil.Process(srv.proc.pid).children(recursive=True)
                   if "resource_tracker" not in " ".join(p.cmdline())]
        assert workers, "no worker process"
        (thread, events), = start_streams(srv.url, [1000])
        for worker in workers:
            worker.kill()
        killed = time.monotonic()
        code = srv.proc.wait(20)
        took = time.monotonic() - killed
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server outlived its engine:\n{srv.tail()}")
    finally:
        srv.stop(signal.SIGKILL)
    thread.join(10)
    log = srv.tail(5000)
    print(f"\n[engine death] server exited with {code} {took:.2f} s after its worker was killed")
    assert code != 0 and took < 10, (code, took, log)
    assert "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH" in log
    assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]


def test_killed_engine_core_process_makes_health_503_then_exits(tiny_model_factory):
    """The engine core in its own process (the server's default) is SIGKILLed under
    load: /health answers 503 at once (not only once the kernel has torn the process
    down), the stream ends with an error event, /health stays 503 (kept alive), and
    SIGTERM then stops the server with no process left behind."""
    srv = RemoteServer(server_args(tiny_model_factory("llama")),
                       env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    try:
        server = psutil.Process(srv.proc.pid)
        # The core is forked (vllm/engine/core_launch.py): the server's direct child
        # that is not multiprocessing's resource tracker.
        cores = [p for p in server.children()
                 if "resource_tracker" not in " ".join(p.cmdline())]
        assert len(cores) == 1, [p.cmdline() for p in server.children(recursive=True)]
        (thread, events), = start_streams(srv.url, [1000])
        with httpx.Client(base_url=srv.url, timeout=10) as http:
            http.get("/health")  # connected before the kill: the next request is quick
            cores[0].kill()
            killed = time.monotonic()
            first = http.get("/health")
            took = time.monotonic() - killed
        assert first.status_code == 503 and took < 5, (first.text, took)
        thread.join(20)
        assert not thread.is_alive(), "the stream hung after its engine died"
        assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
        health = httpx.get(srv.url + "/health", timeout=10)
        assert health.status_code == 503, health.text
        late = httpx.post(srv.url + "/v1/completions", timeout=10,
                          json={"prompt": "late", "max_tokens": 2})
        assert late.status_code == 503, late.text
        for message in (first.json()["error"]["message"], events[-2]["error"]["message"],
                        health.json()["error"]["message"], late.json()["error"]["message"]):
            assert "(killed by SIGKILL). It cannot" in message and ".." not in message, \
                message
        children = server.children(recursive=True)
        assert srv.stop(signal.SIGTERM) is not None, srv.tail()
        _, alive = psutil.wait_procs(children, timeout=5)
        assert not alive, alive
    finally:
        srv.stop(signal.SIGKILL)
    assert "exited unexpectedly (killed by SIGKILL)" in srv.tail(400), srv.tail(400)


def test_kv_cache_is_committed_at_startup(tiny_model_factory):
    """Committed right after start-up (in the background: its log line is awaited), RSS
    then grows under a load that fills the KV cache by well under the cache's size
    (lazily committed memory made RSS creep up by its full size only under load). Some
    growth is the load's own: the engine core kept 70-160 MiB of it (float32
    temporaries of 16 prompts of 496 tokens, 4096 wide, that the allocator may keep;
    the high end in one run of three or four, at this code and before it). Uncommitted,
    the cache would add its full 256 MiB on top; the bound, three quarters of the
    cache, lies between the two."""
    # 1 layer of 16 KV heads x 256: 32 KiB of float32 KV per token, so 256 MiB of KV cache
    # is most of the server's memory yet fills with 8k tokens.
    model = tiny_model_factory("llama", num_hidden_layers=1, num_attention_heads=16,
                               num_key_value_heads=16, head_dim=256)
    kv_bytes = 256 << 20
    srv = RemoteServer(["--model", model, "--dtype", "float32", "--max-model-len", "512",
                        "--max-num-seqs", "16", "--kv-cache-memory-bytes", str(kv_bytes),
                        "--no-enable-prefix-caching", "--disable-log-requests",
                        "--disable-uvicorn-access-log"])
    try:
        # Committed right after start-up, by a background thread (kv_cache_alloc.py).
        deadline = time.monotonic() + 120
        while "GiB committed" not in srv.tail(400) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        process = psutil.Process(srv.proc.pid)

        def tree_rss() -> int:
            """The server's and its children's (the engine core process holds the KV
            cache)."""
            procs = [process, *process.children(recursive=True)]
            return sum(p.memory_info().rss for p in procs if p.is_running())

        rss_start = tree_rss()
        gen = torch.Generator().manual_seed(0)

        def fill(i: int) -> None:
            ids = torch.randint(100, 49000, (496,), generator=gen).tolist()
            r = httpx.post(srv.url + "/v1/completions", timeout=120, json={
                "prompt": ids, "max_tokens": 16, "ignore_eos": True, "temperature": 0})
            assert r.status_code == 200, r.text

        usage = [0.0]
        threads = [threading.Thread(target=fill, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):  # the KV cache usage gauge's peak
            usage[0] = max(usage[0], read_gauge(srv.url, "vllm:kv_cache_usage_perc"))
            time.sleep(0.05)
        for t in threads:
            t.join(180)
        usage = usage[0]
        rss_load = tree_rss()
    finally:
        srv.stop()
    log = srv.tail(400)
    assert "KV cache: 0.25 GiB committed" in log, log
    assert usage > 0.9, usage  # the load did fill the cache
    assert rss_start > kv_bytes, rss_start
    assert rss_load - rss_start < kv_bytes * 3 // 4, (rss_start >> 20, rss_load >> 20)


def read_gauge(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


@pytest.mark.parametrize("keep_alive", [False, True])
def test_crashed_engine_loop_stops_the_server_unless_kept_alive(tokenizer, monkeypatch,
                                                                 keep_alive):
    """serve_http over a scripted engine whose step raises: it returns True (the process
    then exits 1) within seconds, or keeps answering 503 with the keep-alive variable."""
    import asyncio
    import socket

    from tests.entrypoints.fake_engine import FakeLLMEngine
    from vllm.engine.async_llm_engine import AsyncLLMEngine
    from vllm.entrypoints.launcher import serve_http
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser

    if keep_alive:
        monkeypatch.setenv("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "1")
    fake = FakeLLMEngine(tokenizer, step_delay_s=0.01)
    fake.fail_after_steps = 2
    engine = AsyncLLMEngine(fake, log_requests=False, log_stats=False)
    app = build_app(make_arg_parser().parse_args([]), engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def main():
        served = asyncio.ensure_future(serve_http(app, sock, engine, log_level="warning"))
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            for _ in range(100):  # bounded wait for start-up
                try:
                    if (await client.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            crashed = await client.post("/v1/completions", json={"prompt": "Hi",
                                                                 "max_tokens": 50})
            assert crashed.status_code == 503, crashed.text
            done, _ = await asyncio.wait({served}, timeout=5)
            if keep_alive:
                assert not done, "the server exited although kept alive"
                health = await client.get("/health")
                assert health.status_code == 503
                served.cancel()
                await asyncio.gather(served, return_exceptions=True)
                return None
            assert done, "the server outlived its engine"
            return served.result()

    try:
        died = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        engine.shutdown()
        sock.close()
    assert died is (None if keep_alive else True)


def test_kv_cache_beyond_memory_fails_fast_with_a_clear_message(tiny_model_factory):
    import os
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
         "--port", "0", "--model", tiny_model_factory("llama"), "--dtype", "float32",
         "--max-model-len", "256", "--kv-cache-memory-bytes", str(1 << 44)],
        capture_output=True, text=True, timeout=240, env=env)
    log = out.stdout + out.stderr
    assert out.returncode == 1, log[-3000:]
    assert "The KV cache needs 16384.00 GiB" in log and "--kv-cache-memory-bytes" in log
    assert "Traceback" not in log, log[-3000:]
