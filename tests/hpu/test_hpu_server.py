"""The OpenAI server starts on the fake HPU, warms up (logging each bucket) and serves."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_ENV = {
    "VLLM_USE_FAKE_HPU": "1", "PT_HPU_LAZY_MODE": "1", "OMP_NUM_THREADS": "1",
    "VLLM_PROMPT_BS_BUCKET_MAX": "2", "VLLM_PROMPT_SEQ_BUCKET_MAX": "128",
    "VLLM_DECODE_BS_BUCKET_MAX": "2", "VLLM_DECODE_BLOCK_BUCKET_MAX": "8",
}
EXPECTED_LINES = [
    r"HPU execution mode: HPU graphs \(PT_HPU_LAZY_MODE=1, enforce_eager=False\); "
    r"contiguous PA: True",
    r"Prompt bucket config \(min, step, max_warmup\) bs:\[1, 2, 2\], seq:\[128, 128, 128\]",
    r"Generated 2 prompt buckets: \[\(1, 128, 0\), \(2, 128, 0\)\]",
    r"Decode bucket config \(min, step, max_warmup\) bs:\[1, 2, \d+\], seq:\[128, \d+, \d+\]",
    r"Free device memory: [\d.]+ \w+, [\d.]+ \w+ usable \(gpu_memory_utilization=0\.92\), "
    r"[\d.]+ \w+ reserved for HPUGraphs \(measured: [\d.]+ of usable\), [\d.]+ \w+ "
    r"reserved for KV cache",
    r"Generated \d+ decode buckets: ",
    r"\[Warmup\]\[Prompt\]\[1/2\] batch_size:2 seq_len:128 free_mem:[\d.]+ \w+ num_blocks:0",
    r"\[Warmup\]\[Decode\]\[1/\d+\] batch_size:2 seq_len:\d+ free_mem:[\d.]+ \w+ num_blocks:\d+",
    r"\[Warmup\]\[Graph/Prompt\]\[2/2\] batch_size:2 seq_len:128 free_mem:[\d.]+ \w+ num_blocks:0",
    r"\[Warmup\]\[Graph/Decode\]\[1/\d+\] batch_size:2 seq_len:\d+ free_mem:[\d.]+ \w+ "
    r"num_blocks:\d+",
    r"Warmup finished in \d+ secs, allocated [\d.]+ \w+ of device memory",
    r"init_cache_engine took [\d.-]+ \w+ of device memory",
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, url: str, log_path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path) as f:
                pytest.fail(f"server exited with {proc.returncode}:\n{f.read()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"server not healthy after {timeout_s} s")


def test_server_starts_on_fake_hpu_with_warmup_logs(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = str(tmp_path / "server.log")
    env = dict(os.environ, **SERVER_ENV, PYTHONUNBUFFERED="1")
    env.pop("VLLM_TARGET_DEVICE", None)  # VLLM_USE_FAKE_HPU alone selects the HPU
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "512", "--max-num-seqs", "8",
           "--dtype", "float32", "--num-gpu-blocks-override", "32",
           "--no-enable-prefix-caching"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        _wait_healthy(proc, url, log_path, timeout_s=300)
        with open(log_path) as f:
            text = f.read()
        for pattern in EXPECTED_LINES:
            assert re.search(pattern, text), pattern
        assert text.index("Warmup finished") < text.index("/health")  # warm before serving
        resp = httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "prompt": "The capital of France is",
            "max_tokens": 5, "temperature": 0})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] == 5
        # Compile accounting is exported; a request within the warmed buckets compiles nothing.
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        found = re.search(r'^vllm:hpu_graph_compilations_total\{[^}]*\} (\S+)$', metrics,
                          re.MULTILINE)
        assert found, "vllm:hpu_graph_compilations_total missing from /metrics"
        assert float(found.group(1)) == 0.0
        # Bucket padding metrics: both phases ran, each pass counted in its bucket.
        for phase in ("prompt", "decode"):
            waste = re.search(r'^vllm:hpu_padding_waste_ratio\{[^}]*phase="%s"[^}]*\} (\S+)$'
                              % phase, metrics, re.MULTILINE)
            assert waste and 0.0 <= float(waste.group(1)) < 1.0, phase
            padded = re.search(r'^vllm:hpu_padded_tokens_total\{[^}]*phase="%s"[^}]*\} (\S+)$'
                               % phase, metrics, re.MULTILINE)
            assert padded and float(padded.group(1)) > 0, phase
        assert re.search(r'^vllm:hpu_bucket_hits_total\{(?=[^}]*phase="prompt")'
                         r'(?=[^}]*bucket="1,128,0")[^}]*\} 1\.0$', metrics, re.MULTILINE)
        assert re.search(r'^vllm:hpu_warmup_seconds\{[^}]*\} [\d.e-]+$', metrics, re.MULTILINE)
        # Graph memory: what the captured graphs hold, measured at capture (the fake
        # device's ledger), per phase.
        for phase in ("prompt", "decode"):
            held = re.search(r'^vllm:hpu_graph_memory_bytes\{[^}]*phase="%s"[^}]*\} (\S+)$'
                             % phase, metrics, re.MULTILINE)
            assert held and float(held.group(1)) > 0, phase
        assert re.search(r'^vllm:hpu_fallback_bucket_passes_total\{[^}]*\} 0\.0$', metrics,
                         re.MULTILINE)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
