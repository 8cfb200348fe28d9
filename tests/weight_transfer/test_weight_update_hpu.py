"""In-place weight updates on the fake HPU with HPU graphs: the graphs captured at
warmup replay with the new weights (nothing captured or compiled again), and the
outputs equal a fresh fake-HPU engine on the new checkpoint."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from vllm.hpu import habana

from _wt_helpers import checkpoint_tensors, greedy, update_by_shm

KV_BYTES = 8 << 20


@pytest.mark.timeout(240)
def test_graphs_replay_with_updated_weights(ckpt_a, ckpt_b):
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", **SMALL_BUCKETS):
        fresh = make_llm(model=ckpt_b, max_num_seqs=4, kv_cache_memory_bytes=KV_BYTES)
        expected = greedy(fresh)
        release(fresh)

        llm = make_llm(model=ckpt_a, max_num_seqs=4, kv_cache_memory_bytes=KV_BYTES,
                       enable_prefix_caching=True,
                       weight_transfer_config={"backend": "shm"})
        runner = runner_of(llm)
        assert runner.uses_hpu_graphs
        before = greedy(llm)
        assert before != expected
        stats = llm.llm_engine.get_compile_stats()
        assert stats["num_compiles_after_warmup"] == 0 and stats["num_graph_replays"] > 0
        storage = {n: p.data_ptr() for n, p in runner.model.named_parameters()}

        llm.init_weight_transfer_engine({"init_info": {}})
        marks = habana.mark_step_count()
        update_by_shm(llm, checkpoint_tensors(ckpt_b), batches=2)
        llm.finish_weight_update()
        # Lazy mode: the copies of each batch are flushed, and once more at the end.
        assert habana.mark_step_count() - marks == 3
        assert greedy(llm) == expected
        # In place: same tensors, the same captured graphs replayed.
        assert {n: p.data_ptr() for n, p in runner.model.named_parameters()} == storage
        after = llm.llm_engine.get_compile_stats()
        assert after["num_compiles_after_warmup"] == 0
        assert after["num_graph_captures"] == stats["num_graph_captures"]
        assert after["num_graph_replays"] > stats["num_graph_replays"]
        release(llm)
