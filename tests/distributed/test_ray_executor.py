"""The Ray executor on a local single-node Ray cluster: the one-process outputs (as mp),
on CPU and on the fake HPU (whose devices the local cluster declares: Ray cannot count
them)."""
from __future__ import annotations

import gc
import os
import signal
import threading

import pytest

from _dist_helpers import ENGINE_KWARGS, greedy_token_ids

try:
    import ray
except ImportError:  # pragma: no cover - depends on the environment
    ray = None

pytestmark = pytest.mark.skipif(ray is None, reason="ray is not installed (pip install ray)")


@pytest.mark.timeout(240)
def test_ray_tp2_matches_one_process_then_killed_actor_raises(tiny_qwen2, tiny_reference,
                                                             monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    from vllm import LLM

    # Built in a thread that then ends, as data-parallel replicas are: Ray ties a cluster's
    # processes to the thread that started it, so the executor must keep that thread.
    built: list = []
    builder = threading.Thread(target=lambda: built.append(LLM(
        tiny_qwen2, tensor_parallel_size=2, distributed_executor_backend="ray",
        **ENGINE_KWARGS)))
    builder.start()
    builder.join()
    llm = built.pop()
    executor = llm.llm_engine.engine_core.executor
    assert type(executor).__name__ == "RayDistributedExecutor"
    # Started here, so bound to loopback: the TCP store and the Ray node are local only.
    assert executor.worker_ips == ["127.0.0.1", "127.0.0.1"]
    assert len(set(executor.worker_pids)) == 2 and os.getpid() not in executor.worker_pids
    assert greedy_token_ids(llm) == tiny_reference
    # collective_rpc: a method by name, and a local function shipped by value.
    assert llm.collective_rpc("get_device_index") == [0, 1]
    assert llm.collective_rpc(lambda worker, k: worker.rank * k, kwargs={"k": 3}) == [0, 3]

    os.kill(executor.worker_pids[1], signal.SIGKILL)
    # The death is noticed (this message), not waited out by an RPC timeout: no clock.
    with pytest.raises(RuntimeError, match="Ray worker rank 1 died unexpectedly"):
        greedy_token_ids(llm)
    del llm, executor
    gc.collect()
    # The cluster this engine started is gone with it (the fixture checks the processes).
    assert not ray.is_initialized()


@pytest.mark.timeout(240)
def test_fake_hpu_on_a_local_cluster_declares_one_hpu_per_rank(tiny_qwen2, tiny_reference,
                                                               monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    from tests.hpu.conftest import SMALL_BUCKETS, platform_env
    from vllm import LLM
    with platform_env("hpu", VLLM_SKIP_WARMUP="1", **SMALL_BUCKETS):
        llm = LLM(tiny_qwen2, tensor_parallel_size=2, distributed_executor_backend="ray",
                  **ENGINE_KWARGS)
        try:
            assert ray.cluster_resources().get("HPU") == 2
            assert greedy_token_ids(llm) == tiny_reference
        finally:
            llm.llm_engine.shutdown()
            del llm
            gc.collect()
    assert not ray.is_initialized()
