"""Fixtures of the distributed tests: leftover-process check, tiny model and reference."""
from __future__ import annotations

import gc

import psutil
import pytest

from _dist_helpers import child_pids, run_greedy_in_process, wait_gone


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
    return run_greedy_in_process(tiny_qwen2)
