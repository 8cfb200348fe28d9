"""GLM-4.5 (`Glm4MoeForCausalLM`) against transformers on tiny random checkpoints:
whole-prompt logits without a cache, 6 prompts x 32 greedy tokens identical and top-5
logprobs within 1e-3 (fp32) through the whole engine, TP=2 and expert parallel equal
to one process, and the multi-token-prediction layer of released checkpoints skipped.

The checkpoints cover what GLM adds to a Llama decoder: q/k/v bias without an o_proj
bias, a half-width partial rotary, optional q/k norms, a dense first layer, and
DeepSeek-V3's routing (sigmoid, a random correction bias, groups, a scaling factor,
a shared expert)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.models._model_helpers import full_prompt_logits, hf_logits, make_vllm_config, prompt_ids
from tests.models._tiny_families import save_tiny
from tests.models.test_breadth_hf import assert_matches_transformers, run_engine
from tests.models.test_deepseek import _randomize_correction_bias, _tp_worker
from vllm.model_executor.model_loader import get_model

MOE = dict(num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
           norm_topk_prob=True, attention_bias=True, num_hidden_layers=3)
CASES = {
    # The released GLM-4.5 shape: no q/k norm, groups of experts, scaled routing.
    "glm45": dict(MOE, n_group=2, topk_group=1, routed_scaling_factor=2.5),
    # GLM-4.5-Air-like with q/k norms, one group, no scaling, partial rotary 0.25.
    "glm45-qknorm": dict(MOE, use_qk_norm=True, n_group=1, topk_group=1,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                              partial_rotary_factor=0.25)),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(case: str) -> str:
        if case not in cache:
            path = save_tiny(str(tmp_path_factory.mktemp(case)), "Glm4MoeConfig",
                             **CASES[case])
            _randomize_correction_bias(path)
            cache[case] = path
        return cache[case]
    return get


@pytest.mark.parametrize("case", list(CASES))
def test_prompt_logits_match_transformers(case, tiny):
    path = tiny(case)
    ids = prompt_ids(40)
    ours = full_prompt_logits(get_model(make_vllm_config(path)), ids)
    torch.testing.assert_close(ours, hf_logits(path, ids), atol=1e-4, rtol=1e-4)


def test_greedy_and_logprobs_match_transformers(tiny):
    path = tiny("glm45")
    ids, results = run_engine(path)
    assert_matches_transformers(path, results, ids)


def test_the_mtp_layer_of_released_checkpoints_is_skipped(tiny, tmp_path):
    """Released checkpoints carry `num_nextn_predict_layers` extra layers after the
    last decoder layer; the model loads and its logits are unchanged."""
    import json
    import shutil
    from safetensors.torch import load_file, save_file
    src = tiny("glm45")
    path = str(tmp_path / "with-mtp")
    shutil.copytree(src, path)
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    last = CASES["glm45"]["num_hidden_layers"] - 1
    for name, t in list(tensors.items()):
        if name.startswith(f"model.layers.{last}."):
            tensors[name.replace(f"layers.{last}.", f"layers.{last + 1}.")] = t.clone()
    tensors[f"model.layers.{last + 1}.eh_proj.weight"] = torch.zeros(64, 128)
    save_file(tensors, file, metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(path, "config.json")))
    assert cfg.get("num_nextn_predict_layers", 0) >= 1
    ids = prompt_ids(24)
    torch.testing.assert_close(full_prompt_logits(get_model(make_vllm_config(path)), ids),
                               full_prompt_logits(get_model(make_vllm_config(src)), ids))


@pytest.mark.timeout(300)
def test_tp2_and_expert_parallel_match_single_process(tiny, tmp_path):
    from tests.models.test_parallel import _free_port
    ids = prompt_ids(24)
    cases = [("tp2-glm45", tiny("glm45"), False), ("ep2-glm45-qknorm", tiny("glm45-qknorm"), True)]
    expected = {name: full_prompt_logits(get_model(make_vllm_config(path)), ids)
                for name, path, _ in cases}
    mp.spawn(_tp_worker, args=(2, f"tcp://127.0.0.1:{_free_port()}",
                               [(n, p, ep, ids) for n, p, ep in cases], str(tmp_path)),
             nprocs=2, join=True)
    for name, _, ep in cases:
        for rank in range(2):
            r = torch.load(tmp_path / f"{name}-{rank}.pt")
            torch.testing.assert_close(r["logits"], expected[name], atol=1e-4, rtol=1e-4)
            assert r["local_experts"] == (4 if ep else 8), name
