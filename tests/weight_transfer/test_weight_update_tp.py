"""TP=2 with the engine core in its own process (the server's layout, offline):

- an in-place update: every rank maps the shared-memory segment and takes its own shard
  through the model's loader; the outputs equal a fresh one-process engine's;
- then a rank that dies while the engine is idle: the core's idle health check notices,
  and the frontend reports the core's reason (the dead rank), not only an exit code.
One engine for both (its start is most of the cost).
"""
from __future__ import annotations

import gc
import os
import signal
import time

import pytest

from _wt_helpers import checkpoint_tensors, greedy, update_by_shm

ENGINE = dict(dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20,
              max_num_seqs=8, enable_prefix_caching=True)


def _release(llm) -> None:
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


@pytest.mark.timeout(300)
def test_tp2_core_process_update_then_idle_rank_death(ckpt_a, ckpt_b, monkeypatch):
    from vllm import LLM
    from vllm.engine.core_client import EngineCoreDeadError
    fresh = LLM(ckpt_b, **ENGINE)  # in this process, TP=1
    try:
        expected = greedy(fresh)
    finally:
        _release(fresh)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = LLM(ckpt_a, tensor_parallel_size=2, distributed_executor_backend="mp",
              weight_transfer_config={"backend": "shm"}, **ENGINE)
    try:
        assert greedy(llm) != expected
        llm.init_weight_transfer_engine({"init_info": {}})
        update_by_shm(llm, checkpoint_tensors(ckpt_b))
        llm.finish_weight_update(weight_version="tp2")
        assert greedy(llm) == expected
        assert llm.get_weight_version() == "tp2"
        # Each rank holds its own half of a row-parallel weight (loaded in place).
        shards = llm.collective_rpc(
            lambda w: tuple(w.model_runner.model.model.layers[0].mlp.down_proj.weight.shape))
        assert shards == [(64, 64), (64, 64)]  # [hidden, intermediate / 2]

        os.kill(llm.collective_rpc(lambda w: os.getpid())[1], signal.SIGKILL)
        deadline = time.monotonic() + 30
        with pytest.raises(EngineCoreDeadError, match="rank 1 .*died unexpectedly"):
            while time.monotonic() < deadline:
                llm.llm_engine.check_health()  # no request: only the idle check can tell
                time.sleep(0.2)
    finally:
        _release(llm)
