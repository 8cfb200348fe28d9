"""The added architectures on the fake HPU (bucketed shapes, the shim's ops such as
mixture_of_experts) give the CPU platform's greedy tokens."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import make_llm, platform_env, ragged_prompt_ids, release, runner_of
from vllm import SamplingParams
from vllm.model_executor.layers.fused_moe import FusedMoE

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
FAST = {"VLLM_SKIP_WARMUP": "1", "PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
        "VLLM_PROMPT_SEQ_BUCKET_MAX": "64"}
LENGTHS = [3, 9, 17, 30]


def _generate(path: str, prompts=None, **kwargs):
    llm = make_llm(model=path, block_size=16, kv_cache_memory_bytes=32 << 20,
                   max_model_len=256, **kwargs)
    if prompts is None:
        prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    moe_ops = {m.forward_method_name for m in runner_of(llm).model.modules()
               if isinstance(m, FusedMoE)}
    release(llm)
    return prompts, [list(o.outputs[0].token_ids) for o in outs], moe_ops


MOE_ARCHS = ["mixtral", "qwen2_moe", "qwen3_moe"]
CASES = {arch: (arch, {}, {}) for arch in MOE_ARCHS + ["phi3", "granite"]}
CASES.update({
    # Windows shorter than the prompts: soft-capped, windowed prompt and decode passes.
    "gemma2-window": ("gemma2", dict(sliding_window=8), {}),
    "gemma3-window": ("gemma3", dict(sliding_window=8, layer_types=["sliding_attention",
                                                                     "full_attention"]), {}),
    # 16-token chunks: later chunks are prompt passes with a context.
    "mistral-window-chunked": ("mistral", dict(sliding_window=8),
                               dict(max_num_batched_tokens=16, enable_prefix_caching=False)),
})


@pytest.mark.parametrize("case", list(CASES))
def test_fake_hpu_tokens_equal_cpu(case, tiny_model_factory):
    arch, overrides, engine_kwargs = CASES[case]
    path = tiny_model_factory(arch, **overrides)
    with platform_env("cpu"):
        prompts, expected, cpu_ops = _generate(path, **engine_kwargs)
    with platform_env("hpu", **FAST):
        _, got, hpu_ops = _generate(path, prompts, **engine_kwargs)
    assert got == expected
    if arch in MOE_ARCHS:  # grouped GEMMs on the CPU, the shim's op on the HPU
        assert (cpu_ops, hpu_ops) == ({"fused_moe_cpu"}, {"fused_moe_hpu"})
