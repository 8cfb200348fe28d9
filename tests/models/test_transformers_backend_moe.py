"""MoE models on the Transformers modeling backend: the model's own router, the experts
on our fused MoE op (moe.py). Greedy tokens and top-5 logprobs equal transformers' for
MoE architectures with no native class (and Mixtral, whose checkpoint names transformers
renames on load), TP=2 (experts' intermediate split) and expert parallel equal one
process, the fake HPU equals CPU with 0 compiles after warmup, and the stacked
checkpoint layout loads as the per-expert one."""
from __future__ import annotations

import pytest

from tests.models._tiny_families import save_tiny
from tests.models.test_breadth_hf import assert_matches_transformers, run_engine

MOE = dict(num_key_value_heads=2, num_experts_per_tok=2)
MOE_ARCHS = {
    "olmoe": ("OlmoeConfig", dict(MOE, num_experts=4, intermediate_size=32)),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(num_key_value_heads=2, moe_num_experts=4,
                                                moe_k=2, moe_intermediate_size=32,
                                                moe_layer_start_index=1)),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", dict(num_key_value_heads=2, num_experts=4,
                                                  moe_topk=2, moe_intermediate_size=32,
                                                  head_dim=16)),
    "dots1": ("Dots1Config", dict(MOE, n_routed_experts=4, moe_intermediate_size=32,
                                  n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                                  topk_group=1)),
    "flex_olmo": ("FlexOlmoConfig", dict(MOE, num_experts=4, intermediate_size=32,
                                         pad_token_id=0)),
    "mixtral": ("MixtralConfig", dict(MOE, num_local_experts=4, intermediate_size=32)),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(arch: str) -> str:
        if arch not in cache:
            cls, fields = MOE_ARCHS[arch]
            cache[arch] = save_tiny(str(tmp_path_factory.mktemp(arch)), cls, **fields)
        return cache[arch]
    return get


@pytest.mark.parametrize("arch", list(MOE_ARCHS))
def test_greedy_and_logprobs_match_transformers(arch, tiny):
    path = tiny(arch)
    prompts, results = run_engine(path, model_impl="transformers")
    assert_matches_transformers(path, results, prompts)


def _experts(llm):
    from vllm.model_executor.models.transformers.moe import TransformersExperts
    model = llm.llm_engine.engine_core.executor.worker.model_runner.model
    return [m for m in model.modules() if isinstance(m, TransformersExperts)]


def test_stacked_checkpoint_layout_loads(tiny, tmp_path):
    """A checkpoint holding the experts as the library does ([E, 2I, H] / [E, H, I])."""
    import os
    import shutil
    import torch
    from safetensors.torch import load_file, save_file
    from vllm import LLM, SamplingParams
    src = tiny("olmoe")
    path = str(tmp_path / "stacked")
    shutil.copytree(src, path)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    out = {k: v for k, v in tensors.items() if ".experts." not in k}
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts"
        out[f"{p}.gate_up_proj"] = torch.stack([torch.cat(
            [tensors[f"{p}.{e}.gate_proj.weight"], tensors[f"{p}.{e}.up_proj.weight"]])
            for e in range(4)])
        out[f"{p}.down_proj"] = torch.stack([tensors[f"{p}.{e}.down_proj.weight"]
                                             for e in range(4)])
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = []
    for model in (src, path):
        llm = LLM(model, dtype="float32", max_model_len=256, model_impl="transformers",
                  kv_cache_memory_bytes=16 << 20)
        assert len(_experts(llm)) == 2
        got.append(llm.generate(["The capital of France is"], params,
                                use_tqdm=False)[0].outputs[0].token_ids)
        llm.llm_engine.shutdown()
    assert list(got[0]) == list(got[1])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "ep2"])
def test_tp2_matches_one_process(tiny, ep):
    from vllm import LLM, SamplingParams
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    outs = []
    for tp in (1, 2):
        kwargs = dict(tensor_parallel_size=2, distributed_executor_backend="mp",
                      enable_expert_parallel=ep) if tp == 2 else {}
        llm = LLM(tiny("olmoe"), dtype="float32", max_model_len=256,
                  model_impl="transformers", kv_cache_memory_bytes=16 << 20, **kwargs)
        outs.append([list(o.outputs[0].token_ids)
                     for o in llm.generate(prompts, params, use_tqdm=False)])
        llm.llm_engine.shutdown()
    assert outs[0] == outs[1]


def test_fake_hpu_equals_cpu_without_compiles(tiny):
    from tests.hpu.conftest import (make_llm, platform_env, ragged_prompt_ids, release,
                                    runner_of)
    from tests.hpu.test_hpu_models import GREEDY, LENGTHS
    buckets = {"PT_HPU_LAZY_MODE": "1", "VLLM_PROMPT_BS_BUCKET_MAX": "4",
               "VLLM_PROMPT_SEQ_BUCKET_MAX": "64", "VLLM_DECODE_BS_BUCKET_MAX": "4"}
    results = []
    for target, env in (("cpu", {}), ("hpu", buckets)):
        with platform_env(target, **env):
            llm = make_llm(model=tiny("olmoe"), model_impl="transformers", block_size=16,
                           kv_cache_memory_bytes=16 << 20, max_model_len=128,
                           max_num_seqs=4)
            try:
                prompts = ragged_prompt_ids(llm.get_tokenizer(), LENGTHS)
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                    use_tqdm=False)
                results.append([list(o.outputs[0].token_ids) for o in outs])
                if target == "hpu":
                    assert runner_of(llm).num_compiles_after_warmup == 0
                    assert _experts(llm)[0].forward_method_name == "fused_moe_hpu"
            finally:
                release(llm)
    assert results[0] == results[1]
