"""Sleep mode on the fake HPU: the device ledger drops, the graphs survive the wake-up."""
from __future__ import annotations

import gc

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from vllm import SamplingParams
from vllm.hpu import habana

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
KV_BYTES = 8 << 20


def _generate(llm) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY,
                                                               use_tqdm=False)]


@pytest.mark.parametrize("lazy", ["1", "0"], ids=["hpu-graphs", "torch-compile"])
def test_sleep_levels_free_device_memory_and_wake_up_compiles_nothing(tiny_model_factory,
                                                                      lazy):
    path = tiny_model_factory("llama")
    with platform_env("hpu", PT_HPU_LAZY_MODE=lazy, **SMALL_BUCKETS):
        llm = make_llm(model=path, max_num_seqs=4, kv_cache_memory_bytes=KV_BYTES,
                       enable_sleep_mode=True)
        runner = runner_of(llm)
        weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
        expected = _generate(llm)
        stats = llm.llm_engine.get_compile_stats()
        assert stats["num_compiles_after_warmup"] == 0
        kv = sum(t.numel() * t.element_size() for t in runner._cache_tensors())
        assert kv > 0.9 * KV_BYTES
        for level in (1, 2):
            gc.collect()  # the ledger entries of tensors only a reference cycle holds
            awake = habana.tracked_bytes()
            llm.sleep(level=level)
            # The KV cache (K and V of every layer, pad block included) and the weights.
            assert awake - habana.tracked_bytes() == kv + weights
            assert runner.kv_caches == [] and runner.defragmenter is None
            llm.wake_up()
            assert habana.tracked_bytes() == awake
            assert _generate(llm) == expected
        after = llm.llm_engine.get_compile_stats()
        assert after["num_compiles_after_warmup"] == 0
        if lazy == "1":
            assert after["num_graph_captures"] == stats["num_graph_captures"]
        release(llm)
