"""Helpers of the distributed tests: small engines, greedy outputs, leftover processes."""
from __future__ import annotations

import gc
import multiprocessing.resource_tracker as resource_tracker
import os
import socket
import subprocess
import time

import httpx
import psutil

# Spawned workers inherit this. On a shared, oversubscribed machine, OpenMP threads that
# spin while waiting slow multi-threaded ranks down ~10x; passive waiting avoids that.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there"]
MAX_TOKENS = 16
ENGINE_KWARGS = dict(max_model_len=256, kv_cache_memory_bytes=32 << 20, dtype="float32",
                     max_num_seqs=8, enable_prefix_caching=False)


def greedy_token_ids(llm, prompts=PROMPTS, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def run_greedy(model: str, **kwargs) -> list[list[int]]:
    """Build an LLM, generate greedily, then delete it (its processes must go with it)."""
    from vllm import LLM
    llm = LLM(model, **{**ENGINE_KWARGS, **kwargs})
    try:
        return greedy_token_ids(llm)
    finally:
        del llm
        gc.collect()


def run_greedy_in_process(model: str, **kwargs) -> list[list[int]]:
    """The one-process reference, run with one torch thread like each rank of the tests.

    This process's OpenMP may already be spinning (its wait policy is read when torch
    loads), which makes a 2-thread run crawl on a loaded machine.
    """
    import torch

    from vllm.cpu.worker import CPUWorker
    threads = torch.get_num_threads()
    original = CPUWorker._set_threads
    CPUWorker._set_threads = lambda self: torch.set_num_threads(1)
    try:
        return run_greedy(model, **kwargs)
    finally:
        CPUWorker._set_threads = original
        torch.set_num_threads(threads)


def child_pids() -> set[int]:
    """Live descendants of this process, except multiprocessing's resource tracker.

    The tracker is started once by the first spawn and lives as long as this process
    (it belongs to Python's multiprocessing, not to an engine).
    """
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    pids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.pid != tracker:
                pids.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def wait_gone(pids: set[int], timeout_s: float = 15.0) -> set[int]:
    """The pids still alive after waiting up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _alive(p)}
        if alive:
            time.sleep(0.1)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def worker_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ------------------------------------------------------------ servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc: subprocess.Popen, log: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{tail_log(log)}")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout_s} s:\n{tail_log(log)}")


def tail_log(path: str, lines: int = 40) -> str:
    with open(path) as f:
        return "".join(f.readlines()[-lines:])
