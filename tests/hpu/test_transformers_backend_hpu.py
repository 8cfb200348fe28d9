"""The Transformers modeling backend on the fake HPU: bucketed static shapes, the same
greedy tokens as transformers, and nothing compiled after warmup."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from tests.models.test_transformers_backend import MAX_TOKENS, PROMPTS, _hf_greedy
from vllm import SamplingParams

ARCHS = ["olmo2", "cohere2", "phi", "gpt2", "glm4"]
"""q/k norms (olmo2), sliding-window layers and a logit scale (cohere2), partial rotary
and a parallel block (phi), learned positions and tied embeddings (gpt2), GLM's
interleaved rotary (glm4)."""


@pytest.mark.parametrize("arch", ARCHS)
def test_backend_on_fake_hpu_matches_transformers_without_compiles(tiny_model_factory,
                                                                   arch):
    path = tiny_model_factory(arch)
    expected = _hf_greedy(path)
    with platform_env("hpu", **SMALL_BUCKETS, PT_HPU_LAZY_MODE="1"):
        llm = make_llm(model=path, max_model_len=256, max_num_seqs=4,
                       kv_cache_memory_bytes=1 << 20, model_impl="transformers")
        try:
            tracker = runner_of(llm).tracker
            outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                        ignore_eos=True), use_tqdm=False)
            assert [list(o.outputs[0].token_ids) for o in outs] == expected
            assert tracker.num_compiles_after_warmup == 0, tracker.compiled_labels[True]
        finally:
            release(llm)
