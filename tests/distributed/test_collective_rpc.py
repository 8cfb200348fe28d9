"""collective_rpc and sleep mode across worker processes (TP=2, multiprocess executor)."""
from __future__ import annotations

import gc

import pytest

from _dist_helpers import ENGINE_KWARGS, greedy_token_ids


@pytest.mark.timeout(180)
def test_tp2_collective_rpc_and_sleep(tiny_qwen2, tiny_reference):
    from vllm import LLM
    llm = LLM(tiny_qwen2, tensor_parallel_size=2, distributed_executor_backend="mp",
              enable_sleep_mode=True, **ENGINE_KWARGS)
    try:
        assert llm.collective_rpc("get_device_index") == [0, 1]
        # A local function travels to the worker processes by value.
        heads = llm.collective_rpc(
            lambda worker, extra: (worker.rank, worker.model_runner._kv_heads_per_rank() + extra),
            args=(10,))
        assert heads == [(0, 11), (1, 11)]  # 2 KV heads split over 2 ranks
        for level in (1, 2):
            llm.sleep(level=level)
            assert llm.collective_rpc(lambda w: len(w.model_runner.kv_caches)) == [0, 0]
            llm.wake_up()
            assert greedy_token_ids(llm) == tiny_reference
    finally:
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
