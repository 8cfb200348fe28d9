"""BLOOM (ALiBi) on the fake HPU: greedy tokens and top-5 logprobs equal to the CPU
platform's (which tests/models/test_bloom.py checks against transformers). Logprobs,
not only tokens: a tiny random BLOOM repeats one token, so tokens alone would not see
a wrong bias."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release
from vllm import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
FAST = {"VLLM_SKIP_WARMUP": "1", "PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
        "VLLM_PROMPT_SEQ_BUCKET_MAX": "64"}
LENGTHS = [3, 9, 17, 30]


def _generate(path: str, prompts=None, **kwargs):
    llm = make_llm(model=path, block_size=16, kv_cache_memory_bytes=32 << 20,
                   max_model_len=256, **kwargs)
    if prompts is None:
        prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    release(llm)
    return prompts, [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outs]


# 6 heads: non-power-of-2 slopes. 16-token chunks: later chunks are prompt passes whose
# bias spans the cached context; contiguous PA: the other decode KV fetch.
CASES = {"plain": ({}, {}),
         "chunked": (dict(max_num_batched_tokens=16, enable_prefix_caching=False), {}),
         "contiguous-pa": ({}, {"VLLM_CONTIGUOUS_PA": "1"})}


@pytest.mark.parametrize("case", list(CASES))
def test_fake_hpu_alibi_equals_cpu(case, tiny_model_factory):
    engine_kwargs, env = CASES[case]
    path = tiny_model_factory("bloom", n_head=6, hidden_size=96)
    with platform_env("cpu"):
        prompts, expected = _generate(path, **engine_kwargs)
    with platform_env("hpu", **FAST, **env):
        _, got = _generate(path, prompts, **engine_kwargs)
    for (tokens, lps), (ref_tokens, ref_lps) in zip(got, expected):
        assert tokens == ref_tokens
        for step, (ours, ref) in enumerate(zip(lps, ref_lps)):
            for tid, lp in ref.items():
                assert tid in ours, (step, tid)
                assert abs(ours[tid].logprob - lp.logprob) < 1e-3, (step, tid)
