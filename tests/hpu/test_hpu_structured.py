"""Structured outputs on the (fake) HPU: the bitmask is applied to whole buckets, so a
mix of constrained and free requests after warmup compiles nothing."""
from __future__ import annotations

import json

import jsonschema

from tests.hpu.conftest import make_llm, platform_env, release, runner_of
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

ENV = {"PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "2",
       "VLLM_PROMPT_SEQ_BUCKET_MAX": "128", "VLLM_DECODE_BS_BUCKET_MAX": "4",
       "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION": "1"}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                 "maximum": 99}}, "required": ["n"]}


def test_constrained_and_free_requests_compile_nothing_after_warmup(monkeypatch):
    with platform_env("hpu", **ENV):
        llm = make_llm(enable_prefix_caching=False, max_num_seqs=4, num_gpu_blocks_override=16)
        runner = runner_of(llm)
        assert runner.num_compiles_after_warmup == 0
        shapes = []
        stage = runner.sampling_stage
        apply = stage.apply_bitmask

        def spy(logits, bitmask):
            shapes.append((tuple(logits.shape), tuple(bitmask.shape)))
            return apply(logits, bitmask)

        monkeypatch.setattr(stage, "apply_bitmask", spy)
        so = [StructuredOutputsParams(json=SCHEMA), None,
              StructuredOutputsParams(choice=["alpha", "beta"]), None]
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, structured_outputs=s)
                  for i, s in enumerate(so)]
        prompts = ["A number as JSON:", "Once upon a time", "Pick one:", "The sky is"]
        outs = llm.generate(prompts, params, use_tqdm=False)
        jsonschema.validate(json.loads(outs[0].outputs[0].text), SCHEMA)
        assert outs[2].outputs[0].text in ("alpha", "beta")
        assert runner.num_compiles_after_warmup == 0
        bucket_sizes = ({b.batch_size for b in runner.bucketing.decode_buckets}
                        | {b.batch_size for b in runner.bucketing.prompt_buckets})
        assert shapes, "the bitmask was never applied"
        for logits_shape, mask_shape in shapes:
            assert mask_shape[0] == logits_shape[0] in bucket_sizes
            assert mask_shape[1] == (logits_shape[1] + 31) // 32
        release(llm)
