"""The served half of compare_vllm_cpu.py: one engine's OpenAI server, one workload.

Starts `python -m vllm.entrypoints.openai.api_server` under the given interpreter
(ours or a vllm-cpu venv's: both packages have that module and the same flags), waits
for `/v1/models`, streams the workload's prompts as token-id lists (so both engines see
exactly the same input lengths, with no re-tokenization) through
benchmark_serving.py's client with a concurrency cap, and stops the server. Reported:
TTFT / TPOT p50 (ms) and output tokens/s, from benchmark_serving's own metrics.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from typing import Optional

from benchmarks.benchmark_serving import BenchmarkConfig, calculate_metrics, run_benchmark
from benchmarks.datasets import SampleRequest

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python: str, model: str, dtype: str, max_model_len: int, port: int,
                 env: dict[str, str], cwd: str, log_path: str,
                 extra_args: tuple[str, ...] = ()) -> subprocess.Popen:
    """The server in its own process group (so stopping it also stops its workers)."""
    cmd = [python, "-m", SERVER_MODULE, "--model", model, "--dtype", dtype,
           "--max-model-len", str(max_model_len), "--port", str(port),
           "--host", "127.0.0.1", "--seed", "0", *extra_args]
    if env.get("VLLM_CPU_NUM_OF_RESERVED_CPU") is not None:  # vllm-cpu's memory check
        cmd += ["--gpu-memory-utilization", "0.3"]
    log = open(log_path, "w")
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_ready(proc: subprocess.Popen, port: int, timeout: float, log_path: str) -> float:
    """Seconds until `/v1/models` answers; raises when the server exits or times out."""
    start = time.perf_counter()
    url = f"http://127.0.0.1:{port}/v1/models"
    while time.perf_counter() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}):\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"server not ready after {timeout:.0f} s:\n{_tail(log_path)}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path) as f:
            return f.read()[-chars:]
    except OSError:
        return ""


def served_requests(prompts: list[list[int]], output_len: int) -> list[SampleRequest]:
    return [SampleRequest(prompt=ids, prompt_len=len(ids), expected_output_len=output_len,
                          prompt_token_ids=ids, use_token_ids=True) for ids in prompts]


def measure(port: int, model: str, prompts: list[list[int]], output_len: int,
            max_concurrency: int) -> dict:
    """Stream every prompt (greedy, EOS ignored) and summarize like benchmark_serving."""
    cfg = BenchmarkConfig(backend="vllm", api_url=f"http://127.0.0.1:{port}/v1/completions",
                          model=model, request_rate=float("inf"), burstiness=1.0,
                          max_concurrency=max_concurrency, ignore_eos=True, logprobs=None,
                          seed=0, disable_tqdm=True, initial_test=True)
    requests = served_requests(prompts, output_len)
    outputs, duration = asyncio.run(run_benchmark(cfg, requests))
    failed = [o.error for o in outputs if not o.success]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, first: {failed[0][-2000:]}")
    metrics, _ = calculate_metrics(requests, outputs, duration, _NoTokenizer(), [50.0])
    ttft, tpot = metrics.stats_ms("ttft"), metrics.stats_ms("tpot")
    return {"ttft_p50_ms": ttft["median_ttft_ms"], "tpot_p50_ms": tpot["median_tpot_ms"],
            "output_tok_s": metrics.output_throughput, "seconds": duration,
            "output_tokens": metrics.total_output}


class _NoTokenizer:
    """Output counts come from the stream's usage; tokenizing would mean a mismatch."""

    def __call__(self, text: str, **kwargs):
        raise RuntimeError("the server sent no usage with its stream")


def run_served(python: str, engine: str, model: str, dtype: str, max_model_len: int,
               prompts: list[list[int]], output_len: int, max_concurrency: int,
               env: dict[str, str], cwd: str, timeout: float,
               log_dir: Optional[str] = None, extra_args: tuple[str, ...] = ()) -> dict:
    """Start `engine`'s server, measure, stop it; the result gains `startup_s`."""
    port = free_port()
    log_dir = log_dir or tempfile.gettempdir()
    log_path = os.path.join(log_dir, f"served-{engine}-{port}.log")
    proc = start_server(python, model, dtype, max_model_len, port, env, cwd, log_path,
                        extra_args)
    try:
        startup = wait_ready(proc, port, timeout, log_path)
        result = measure(port, model, prompts, output_len, max_concurrency)
    finally:
        stop_server(proc)
    result["startup_s"] = startup
    return result

