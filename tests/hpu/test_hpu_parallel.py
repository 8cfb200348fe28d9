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
