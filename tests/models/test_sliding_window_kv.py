"""Sliding-window layers keep only the blocks their window needs (vllm/kv_cache_spec.py):
a Gemma 3-shaped model (5 sliding-window layers per full-attention layer) serves, with
the same KV cache memory, a context that did not fit when every layer kept a full-length
cache, and its greedy tokens still match transformers."""
from __future__ import annotations

import gc

import pytest

from tests.models.test_breadth_hf import assert_matches_transformers, greedy_with_logprobs
from vllm import LLM

GEMMA3 = dict(num_hidden_layers=6, sliding_window=16,
              layer_types=["sliding_attention"] * 5 + ["full_attention"])
PAGE = 2 * 16 * 2 * 16 * 4
"""Bytes of one 16-token block of one layer (K and V, 2 KV heads of 16, float32)."""
KV_BYTES = 6 * PAGE * 40
"""40 blocks of all six layers: 640 tokens when every layer keeps every token."""


def _llm(path: str, **kwargs) -> LLM:
    return LLM(model=path, dtype="float32", max_model_len=1024, block_size=16,
               kv_cache_memory_bytes=KV_BYTES, max_num_batched_tokens=64, max_num_seqs=4,
               **kwargs)


def test_long_context_fits_only_with_window_blocks(tiny_model_factory):
    path = tiny_model_factory("gemma3", **GEMMA3)
    with pytest.raises(ValueError, match="max seq len"):
        _llm(path, disable_hybrid_kv_cache_manager=True)
    llm = _llm(path)
    manager = llm.llm_engine.engine_core.scheduler.kv_cache_manager
    prompt_ids = [[(7 * i + 3) % 4000 + 100 for i in range(900)]]
    results = greedy_with_logprobs(llm, prompt_ids)
    assert len(manager.group_specs) == 6  # 1 full + 5 sliding groups sharing 1 tensor
    assert manager.block_pool.get_num_free_blocks() == 6 * 40 - 1  # all freed, but null
    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    assert_matches_transformers(path, results, prompt_ids)
