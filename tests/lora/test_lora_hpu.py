"""LoRA on the (fake) HPU: peft's tokens, and no compilation after warmup while the
adapters, their slots and the mix of a batch change."""
from __future__ import annotations

import pytest

from tests.hpu.conftest import make_llm, platform_env, release, runner_of
from tests.lora.conftest import ADAPTERS, MAX_TOKENS
from vllm import SamplingParams
from vllm.hpu import habana
from vllm.lora.request import LoRARequest

GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
ENV = {"VLLM_PROMPT_BS_BUCKET_MAX": "2", "VLLM_PROMPT_SEQ_BUCKET_MAX": "128",
       "VLLM_DECODE_BS_BUCKET_MAX": "4", "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION": "1"}


@pytest.mark.parametrize("mode", ["hpu-graphs", "eager"])
def test_adapters_switch_without_compiles(mode, qwen2_base, qwen2_adapters, qwen2_prompt_ids,
                                          qwen2_references):
    env = dict(ENV, PT_HPU_LAZY_MODE="1" if mode == "hpu-graphs" else "0")
    with platform_env("hpu", **env):
        llm = make_llm(model=qwen2_base, enable_lora=True, max_loras=2, max_lora_rank=16,
                       enable_prefix_caching=False, max_num_seqs=4, max_model_len=256,
                       num_gpu_blocks_override=16, enforce_eager=mode == "eager")
        runner = runner_of(llm)
        assert runner.tracker.warmup_done and runner.num_compiles_after_warmup == 0
        captures = habana.graph_stats(runner.forward_module).captures \
            if mode == "hpu-graphs" else None
        ids = {name: i + 1 for i, (name, _) in enumerate(ADAPTERS)}

        def lora(name):
            return None if name is None else LoRARequest(name, ids[name], qwen2_adapters[name])

        def generate(names, prompts):
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                use_tqdm=False, lora_request=[lora(n) for n in names])
            return [list(o.outputs[0].token_ids) for o in outs]

        # Base only, then each adapter alone (five adapters through two slots).
        prompts = qwen2_prompt_ids[:2]
        assert generate([None, None], prompts) == qwen2_references[None][:2]
        for name in qwen2_adapters:
            assert generate([name, name], prompts) == qwen2_references[name][:2], name
        # Mixed batches: base + three adapters, twice with the pairs rotated.
        names = [None, "sql", "poet", "chat"]
        for shift in range(2):
            order = names[shift:] + names[:shift]
            prompts = [qwen2_prompt_ids[i % len(qwen2_prompt_ids)] for i in range(4)]
            expected = [qwen2_references[n][i % len(qwen2_prompt_ids)]
                        for i, n in enumerate(order)]
            assert generate(order, prompts) == expected
        assert runner.lora_manager.num_slot_loads > 5
        assert runner.num_compiles_after_warmup == 0
        if captures is not None:
            assert habana.graph_stats(runner.forward_module).captures == captures
        release(llm)
