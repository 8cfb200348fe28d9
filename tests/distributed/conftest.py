"""Helpers of the distributed tests: small engines, greedy outputs, leftover processes."""
from __future__ import annotations

import gc
import multiprocessing.resource_tracker as resource_tracker
import os
import time

import psutil
import pytest

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


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every test must leave no process of its engines behind."""
    before = child_pids()
    yield
    gc.collect()
    left = wait_gone(child_pids() - before)
    details = []
    for pid in left:
        try:
            details.append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())[:200]}")
        except psutil.NoSuchProcess:
            pass
    assert not details, "processes left behind:\n" + "\n".join(details)


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_model_factory) -> str:
    """4 query heads, 2 KV heads, 2 layers: splits by TP=2 and by PP=2."""
    return tiny_model_factory("qwen2")


@pytest.fixture(scope="session")
def tiny_reference(tiny_qwen2) -> list[list[int]]:
    """Greedy outputs of the tiny model in one process (the uni executor)."""
    return run_greedy(tiny_qwen2)


def worker_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env
