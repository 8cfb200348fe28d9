"""Tensor, pipeline and data parallel on the fake HPU (gloo between the ranks)."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release
from vllm import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, " * 12,
           "Water boils at", "List three colors:"]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TINY = dict(max_num_seqs=4, kv_cache_memory_bytes=4 << 20)


def _generate(llm, prompts=PROMPTS):
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    path = tiny_model_factory("llama")
    with platform_env("cpu"):
        llm = make_llm(model=path, **TINY)
        expected = _generate(llm)
        release(llm)
    return path, expected


@pytest.mark.timeout(240)
def test_pipeline_parallel_with_hpu_graphs_matches_cpu(tiny):
    """Two spawned PP stages warm up and capture independently, then serve bucketed
    passes (decode and prompt passes in one step) with the CPU platform's tokens."""
    path, expected = tiny
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", **SMALL_BUCKETS):
        llm = make_llm(model=path, pipeline_parallel_size=2,
                       distributed_executor_backend="mp", **TINY)
        assert _generate(llm) == expected
        stats = llm.llm_engine.engine_core.executor.collective_rpc("get_compile_stats")
        assert [s["num_compiles_after_warmup"] for s in stats] == [0, 0]
        assert all(s["num_graphed_buckets"] > 0 for s in stats)
        release(llm)


def test_device_index_places_replicas_after_each_other():
    """Replica r's local rank l uses device r * world_size + l (TP=2 x PP=2, DP=3)."""
    from vllm.config import ParallelConfig
    from vllm.worker.worker_base import WorkerBase

    class _Config:
        def __init__(self, dp_rank: int) -> None:
            self.parallel_config = ParallelConfig(
                tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=3,
                data_parallel_rank=dp_rank)

    got = [[WorkerBase(_Config(r), local_rank=lr, rank=lr).device_index for lr in range(4)]
           for r in range(3)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(ValueError, match="data_parallel_rank must be in"):
        ParallelConfig(data_parallel_size=2, data_parallel_rank=2)


@pytest.mark.timeout(240)
def test_data_parallel_replicas_take_distinct_devices(tiny):
    """Two replicas of the server's data-parallel engine: each worker acquires its own
    fake HPU device (without a data_parallel_rank both would take device 0), and each
    replica serves the CPU platform's tokens."""
    import asyncio

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.dp_engine import DPAsyncLLMEngine
    path, expected = tiny
    with platform_env("hpu", PT_HPU_LAZY_MODE="1", VLLM_SKIP_WARMUP="1", **SMALL_BUCKETS):
        args = AsyncEngineArgs(model=path, data_parallel_size=2, dtype="float32",
                               max_model_len=512, disable_log_stats=True, **TINY)
        engine = DPAsyncLLMEngine.from_engine_args(args)
        try:
            devices = [r.engine.engine_core.executor.collective_rpc("get_device_index")
                       for r in engine.replicas]
            assert devices == [[0], [1]]

            async def one(i: int) -> list[int]:
                final = None
                async for out in engine.generate(PROMPTS[i], GREEDY, request_id=f"r{i}"):
                    final = out
                return list(final.outputs[0].token_ids)

            async def both() -> list[list[int]]:
                return await asyncio.gather(one(0), one(1))

            assert asyncio.run(both()) == expected[:2]
        finally:
            engine.shutdown()
