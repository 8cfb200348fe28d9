"""Speculation with tensor parallelism: the ranks that do not sample drop the drafts
after the forward and learn the 1 + k new tokens from the next step; a draft model
runs whole (TP 1) on the driver rank beside the TP 2 target."""
from __future__ import annotations

import gc

from vllm import LLM, SamplingParams

from tests.spec_decode.test_spec_decode_e2e import COMMON, NGRAM, PROMPTS


def test_tp2_ngram_and_tp1_draft_match_tp1_without_speculation(tiny_model_factory):
    model = tiny_model_factory("llama")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = []
    draft = {"model": model, "num_speculative_tokens": 3}
    for tp, spec in ((1, None), (2, NGRAM), (2, draft)):
        llm = LLM(model=model, tensor_parallel_size=tp, speculative_config=spec, **COMMON)
        try:
            outs.append([list(o.outputs[0].token_ids)
                         for o in llm.generate(PROMPTS[:8], params, use_tqdm=False)])
            if spec is not None:
                stats = llm.llm_engine.get_stats().spec_decoding_stats
                assert stats.num_accepted_tokens
                if "model" in spec:  # the target itself, unsharded: (nearly) always right
                    assert stats.acceptance_rate > 0.9
        finally:
            del llm
            gc.collect()
    assert outs[0] == outs[1] == outs[2]
