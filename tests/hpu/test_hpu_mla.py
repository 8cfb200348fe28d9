"""DeepSeek (MLA + DeepSeek MoE) on the fake HPU: the latent cache under the HPU
runner's buckets (flat paged attention over the latent for decodes, prompt passes with
a context for later chunks) gives the CPU platform's greedy tokens, and after warmup
nothing compiles."""
from __future__ import annotations

import pytest
import torch

from tests.models._tiny_families import save_tiny
from tests.hpu.conftest import (SMALL_BUCKETS, make_llm, platform_env, ragged_prompt_ids,
                                release, runner_of)
from vllm import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
LENGTHS = [3, 9, 17, 30]
ARGS = dict(block_size=16, kv_cache_memory_bytes=4 << 20, max_model_len=256, max_num_seqs=4)
V3 = dict(num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
          v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
          q_lora_rank=48, n_shared_experts=1, n_group=4, topk_group=2,
          first_k_dense_replace=1, routed_scaling_factor=2.5)


@pytest.fixture(scope="module")
def deepseek_v3(tmp_path_factory) -> str:
    return save_tiny(str(tmp_path_factory.mktemp("ds-v3")), "DeepseekV3Config", **V3)


def _generate(path: str, prompts=None, **kwargs):
    llm = make_llm(model=path, **ARGS, **kwargs)
    if prompts is None:
        prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return llm, prompts, [list(o.outputs[0].token_ids) for o in outs]


MODES = {"whole-prompts": {},
         "16-token-chunks": dict(max_num_batched_tokens=16, enable_prefix_caching=False),
         "fp8-latent": dict(kv_cache_dtype="fp8")}


@pytest.mark.parametrize("mode", list(MODES))
def test_fake_hpu_tokens_equal_cpu_and_nothing_compiles(deepseek_v3, mode):
    kwargs = MODES[mode]
    with platform_env("cpu"):
        llm, prompts, expected = _generate(deepseek_v3, **kwargs)
        release(llm)
    with platform_env("hpu", **SMALL_BUCKETS, PT_HPU_LAZY_MODE="1"):
        llm, _, got = _generate(deepseek_v3, prompts, **kwargs)
        runner = runner_of(llm)
        mla = {m.forward_method_name for m in runner.model.modules()
               if type(m).__name__ == "MLAAttention"}
        cache = runner.kv_caches[0]
        tracker = runner.tracker
        compiled_after = tracker.num_compiles_after_warmup
        release(llm)
    assert got == expected
    assert mla == {"mla_attention_hpu"}
    # One latent "head" of kv_lora_rank + rope per slot; no value tensor.
    assert tuple(cache.key_cache.shape[1:]) == (1, 32 + 8) and cache.value_cache.numel() == 0
    assert (cache.key_cache.dtype == torch.float8_e4m3fn) == (mode == "fp8-latent")
    assert compiled_after == 0, tracker.compiled_labels[True]
