"""In-place weight updates with tensor parallelism (TP=2, worker processes): every rank
maps the shared-memory segment and takes its own shard through the model's loader."""
from __future__ import annotations

import gc

import pytest

from _wt_helpers import checkpoint_tensors, greedy, update_by_shm

ENGINE = dict(dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20,
              max_num_seqs=8, enable_prefix_caching=True)


def _release(llm) -> None:
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


@pytest.mark.timeout(300)
def test_tp2_update_equals_fresh_engine(ckpt_a, ckpt_b):
    from vllm import LLM
    fresh = LLM(ckpt_b, **ENGINE)  # one process, TP=1
    try:
        expected = greedy(fresh)
    finally:
        _release(fresh)
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
    finally:
        _release(llm)
