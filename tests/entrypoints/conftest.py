"""A real OpenAI server subprocess on the default model, shared by the server tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

import httpx
import pytest

API_KEY = "test-key-7c1d"
MAX_NUM_SEQS = 64
KV_CACHE_BYTES = 512 << 20
"""512 MiB of KV cache (~22k tokens): plenty for the tests (64 streams of ~210 tokens), and
it is all committed at start-up, so no more than needed on a shared machine."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteServer:
    """`python -m vllm.entrypoints.openai.api_server ...` on a free loopback port."""

    def __init__(self, extra_args: list[str], startup_timeout_s: float = 240.0,
                 env: Optional[dict[str, str]] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-server-", suffix=".log",
                                               delete=False)
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host",
               "127.0.0.1", "--port", str(self.port), *extra_args]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.ready_s = self._wait_ready(startup_timeout_s)
        print(f"\n[server] ready in {self.ready_s:.2f} s (process start -> /health 200)")

    def _wait_ready(self, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout_s} s:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return "".join(f.readlines()[-lines:])

    def children(self) -> list[int]:
        try:
            import psutil
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except Exception:  # noqa: BLE001 - process already gone
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> Optional[float]:
        """Signal the server; return how long it took to exit (None if it had to be killed)."""
        if self.proc.poll() is not None:
            return 0.0
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout_s)
            return time.monotonic() - start
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None


@pytest.fixture(scope="session")
def server():
    # Batch-invariant kernels: the tests compare greedy outputs across requests (full vs
    # streamed, server vs offline) on a server that other tests load concurrently and
    # whose prefix cache they fill; with the measured per-row-count kernels a bf16
    # request's tokens may depend on that history (as in vLLM), which is not what these
    # tests are about.
    srv = RemoteServer(["--max-num-seqs", str(MAX_NUM_SEQS), "--api-key", API_KEY,
                        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
                        "--disable-log-requests"], env={"VLLM_BATCH_INVARIANT": "1"})
    yield srv
    children = srv.children()
    took = srv.stop(signal.SIGTERM)
    assert took is not None, f"server ignored SIGTERM:\n{srv.tail()}"
    print(f"\n[server] stopped {took:.2f} s after SIGTERM")
    import psutil
    procs = []
    for pid in children:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    # Children exit on their own once the server is gone (the engine core was joined;
    # multiprocessing's resource tracker reads EOF): allow them a moment.
    _, alive = psutil.wait_procs(procs, timeout=5)
    assert not alive, f"orphan processes left: {alive}"


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=120)


@pytest.fixture(scope="session")
def http(server):
    """Raw HTTP to the server (auth header set), for bodies the openai client cannot send."""
    with httpx.Client(base_url=server.url, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c


@pytest.fixture(scope="session")
def model_name(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def tokenizer():
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer
    return get_tokenizer(resolve_model_path(DEFAULT_MODEL))
