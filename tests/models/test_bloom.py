"""BLOOM (ALiBi attention) against transformers on tiny random checkpoints: full-prompt
logits without a cache, then greedy tokens and top-5 logprobs through the whole engine
(paged KV cache, torch and native CPU ops, chunked prefill over a cached context)."""
from __future__ import annotations

import pytest
import torch

from _model_helpers import full_prompt_logits, hf_logits, make_vllm_config, prompt_ids
from tests.models.test_breadth_hf import (assert_matches_transformers, greedy_with_logprobs,
                                          run_engine)
from vllm.attention.ops.alibi import get_alibi_slopes
from vllm.model_executor.model_loader import get_model

# 4 heads: a power of two; 6 heads: the extra odd-power slopes of 8 heads.
HEADS = {"4-heads": dict(n_head=4), "6-heads": dict(n_head=6, hidden_size=96)}


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 32, 112])
def test_slopes_match_transformers(heads):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    torch.testing.assert_close(get_alibi_slopes(heads), _get_alibi_slopes(heads, "cpu"),
                               atol=0, rtol=0)


@pytest.mark.parametrize("case", list(HEADS))
def test_prompt_logits_match_transformers(case, tiny_model_factory):
    path = tiny_model_factory("bloom", **HEADS[case])
    ids = prompt_ids(48)
    ours = full_prompt_logits(get_model(make_vllm_config(path)), ids)
    torch.testing.assert_close(ours, hf_logits(path, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("native", [True, False], ids=["native-ops", "torch-ops"])
@pytest.mark.parametrize("case", list(HEADS))
def test_greedy_and_logprobs_match_transformers(case, native, tiny_model_factory,
                                                monkeypatch):
    monkeypatch.setenv("VLLM_CPU_NATIVE_OPS", "1" if native else "0")
    path = tiny_model_factory("bloom", **HEADS[case])
    prompt_ids_, results = run_engine(path)
    assert_matches_transformers(path, results, prompt_ids_)


def test_chunked_prefill_over_cached_context(tiny_model_factory):
    """16-token chunks: later chunks score their ALiBi bias against the cached context."""
    from tests.engine.conftest import PROMPTS
    from vllm import LLM
    path = tiny_model_factory("bloom", **HEADS["6-heads"])
    llm = LLM(model=path, dtype="float32", max_model_len=512, kv_cache_memory_bytes=32 << 20,
              block_size=16, max_num_batched_tokens=16, max_num_seqs=4)
    tok = llm.get_tokenizer()
    ids = [tok.encode(" ".join(PROMPTS[i:i + 3]))[:n] for i, n in ((0, 40), (3, 23))]
    results = greedy_with_logprobs(llm, ids)
    llm.llm_engine.shutdown()
    assert_matches_transformers(path, results, ids)


def test_wrong_slope_count_is_refused():
    from vllm.attention import Attention
    with pytest.raises(ValueError, match="alibi_slopes"):
        Attention(4, 16, 0.25, alibi_slopes=get_alibi_slopes(8))
