"""Preemption by recompute on a tiny random model: what a preempted request keeps."""
from __future__ import annotations

import gc

import pytest

from vllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def small_pool_llm(tiny_model_factory):
    """40 KV blocks of 16 tokens for 12 requests of ~100 tokens: preemption is certain."""
    llm = LLM(model=tiny_model_factory("llama"), dtype="float32", max_model_len=256,
              max_num_seqs=12, block_size=16, num_gpu_blocks_override=40,
              enable_prefix_caching=False)
    yield llm
    del llm
    gc.collect()


def test_seeded_sampling_is_reproducible_under_preemption(small_pool_llm):
    """A preempted request resumes its own random stream: every seeded output equals
    the same request run alone (before, its generator restarted from the seed)."""
    llm = small_pool_llm
    prompts = [f"Request number {i} tells a story about" for i in range(12)]
    params = [SamplingParams(temperature=1.0, top_p=0.9, max_tokens=96, seed=1000 + i,
                             ignore_eos=True) for i in range(12)]
    preemptions_before = llm.llm_engine.get_stats().num_preemptions
    together = llm.generate(prompts, params, use_tqdm=False)
    assert llm.llm_engine.get_stats().num_preemptions > preemptions_before
    for prompt, p, out in zip(prompts, params, together):
        alone = llm.generate([prompt], p, use_tqdm=False)[0]
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids, prompt


def test_workers_drop_the_states_of_finished_requests(small_pool_llm):
    """The ids of the requests finished by the last step reach the runner too (one more,
    empty step): no state is left behind once generate returns."""
    runner = small_pool_llm.llm_engine.engine_core.executor.worker.model_runner
    small_pool_llm.generate(["a b c", "d e f g"], SamplingParams(max_tokens=5),
                            use_tqdm=False)
    assert runner.requests == {} and runner.input_batch.num_reqs == 0
