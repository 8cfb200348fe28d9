"""A prompt's greedy output does not depend on batching, caching, chunking or preemption."""
from __future__ import annotations

import random

import pytest

from tests.engine.conftest import PROMPTS
from vllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _mixed_prompts(tokenizer, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = " ".join(PROMPTS).split()
    prompts = []
    for _ in range(n):
        length = rng.choice([3, 8, 20, 45, 90, 150])
        text = " ".join(rng.choice(words) for _ in range(length))
        prompts.append({"prompt_token_ids": tokenizer.encode(text)})
    return prompts


def _outputs(llm, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference(default_llm):
    tok = default_llm.get_tokenizer()
    target = {"prompt_token_ids": tok.encode(PROMPTS[1])}
    others = _mixed_prompts(tok, 32)
    alone = _outputs(default_llm, [target])[0]
    return target, others, alone


def test_alone_equals_in_batch_of_32(default_llm, reference):
    target, others, alone = reference
    batch = others[:16] + [target] + others[16:]
    outs = _outputs(default_llm, batch)
    assert outs[16] == alone
    # And each of the others alone equals its batched output (spot check a few).
    for i in (0, 7, 31):
        j = i if i < 16 else i + 1
        assert _outputs(default_llm, [others[i]])[0] == outs[j]


@pytest.mark.parametrize("engine_kwargs", [
    dict(enable_prefix_caching=False),
    dict(max_num_batched_tokens=32, max_num_seqs=8),  # forces chunked prefill
    dict(num_gpu_blocks_override=40, max_model_len=256, max_num_seqs=32),  # forces preemption
], ids=["no-prefix-cache", "chunked", "preemption"])
def test_same_output_under_engine_settings(reference, engine_kwargs):
    target, others, alone = reference
    kwargs = dict(engine_kwargs)
    llm = LLM(dtype="float32", max_model_len=kwargs.pop("max_model_len", 1024),
              kv_cache_memory_bytes=64 << 20, **kwargs)
    batch = [target] + others[:12]
    outs = _outputs(llm, batch)
    assert outs[0] == alone
    if "num_gpu_blocks_override" in engine_kwargs:
        assert llm.llm_engine.get_stats().num_preemptions > 0


def test_prefix_cache_hit_on_repeat(default_llm):
    tok = default_llm.get_tokenizer()
    text = " ".join(PROMPTS * 3)
    ids = tok.encode(text)
    block = default_llm.llm_engine.vllm_config.cache_config.block_size
    assert len(ids) > 4 * block
    first = default_llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    second = default_llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert second.num_cached_tokens > 0
    # Only the tail past the last full cached block is computed: at most one block.
    assert len(ids) - second.num_cached_tokens <= block
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
