"""GPT-OSS on the fake HPU: attention sinks in the masked prompt path and the flat
paged decode, sliding-window layers shorter than the prompts, and the experts' biases
and clamped SwiGLU through the static-shape dense experts, whole prompts and 16-token
chunks; CPU's greedy tokens, warmed up, 0 compiles after warmup."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release, runner_of
from tests.hpu.test_hpu_models import GREEDY, LENGTHS
from tests.models.test_gpt_oss import save_tiny_gpt_oss

BUCKETS = {"PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
           "VLLM_PROMPT_SEQ_BUCKET_MAX": "64", "VLLM_DECODE_BS_BUCKET_MAX": "4"}


def _generate(path: str, prompts=None, **engine_kwargs):
    llm = make_llm(model=path, block_size=16, kv_cache_memory_bytes=16 << 20,
                   max_model_len=128, max_num_seqs=4, **engine_kwargs)
    try:
        if prompts is None:
            prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                            use_tqdm=False)
        compiles = getattr(runner_of(llm), "num_compiles_after_warmup", None)
    finally:
        release(llm)
    return prompts, [list(o.outputs[0].token_ids) for o in outs], compiles


@pytest.mark.parametrize("engine_kwargs", [
    {},
    # 16-token chunks: later chunks are prompt passes with a context (sinks + window).
    dict(max_num_batched_tokens=16, enable_prefix_caching=False)], ids=["whole", "chunked"])
def test_fake_hpu_gpt_oss_equals_cpu_without_compiles(engine_kwargs, tmp_path):
    path = save_tiny_gpt_oss(str(tmp_path))
    with platform_env("cpu"):
        prompts, expected, _ = _generate(path, **engine_kwargs)
    with platform_env("hpu", **BUCKETS):
        _, got, compiles = _generate(path, prompts, **engine_kwargs)
    assert got == expected
    assert compiles == 0
