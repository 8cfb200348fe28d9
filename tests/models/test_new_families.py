"""Gemma 1, Falcon (new decoder architecture, multi-query, sequential multi-head),
GPT-NeoX (partial rotary, parallel and sequential residual), GraniteMoE and InternLM2
against transformers on tiny random checkpoints: whole-prompt logits without a cache
(cheap, every variant), then 6 prompts x 32 greedy tokens identical and top-5 logprobs
within 1e-3 (fp32) through the whole engine.

InternLM2 is not in transformers: its reference is the Llama checkpoint it was packed
from (`internlm2_from_llama`: q/k/v packed into wqkv per KV group, names renamed), run
by transformers' LlamaForCausalLM.
"""
from __future__ import annotations

import pytest
import torch

from tests.models._model_helpers import full_prompt_logits, hf_logits, make_vllm_config, prompt_ids
from tests.models._tiny_families import internlm2_from_llama, save_tiny
from tests.models.test_breadth_hf import assert_matches_transformers, run_engine
from vllm.model_executor.model_loader import get_model

CASES = {
    "gemma": ("GemmaConfig", dict(head_dim=16, num_key_value_heads=2, pad_token_id=0)),
    "falcon-new-arch": ("FalconConfig", dict(new_decoder_architecture=True, num_kv_heads=2,
                                             bias=False)),
    "falcon-multi-query": ("FalconConfig", dict(multi_query=True, parallel_attn=True,
                                                bias=False)),
    "falcon-mha-sequential": ("FalconConfig", dict(multi_query=False, parallel_attn=False,
                                                   bias=True)),
    "falcon-new-arch-one-norm": ("FalconConfig", dict(
        new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1)),
    "gpt_neox": ("GPTNeoXConfig", dict(rotary_pct=0.25)),
    "gpt_neox-sequential": ("GPTNeoXConfig", dict(use_parallel_residual=False, rotary_pct=0.5)),
    "granitemoe": ("GraniteMoeConfig", dict(
        num_key_value_heads=2, intermediate_size=48, num_local_experts=4,
        num_experts_per_tok=2, embedding_multiplier=2.0, attention_multiplier=0.1,
        residual_multiplier=0.5, logits_scaling=0.5)),
}
ENGINE_CASES = ["gemma", "falcon-new-arch", "falcon-multi-query", "gpt_neox", "granitemoe"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(case: str) -> str:
        if case not in cache:
            cls, fields = CASES[case]
            cache[case] = save_tiny(str(tmp_path_factory.mktemp(case)), cls, **fields)
        return cache[case]
    return get


@pytest.fixture(scope="module")
def internlm2(tmp_path_factory) -> tuple[str, str]:
    """(InternLM2 checkpoint, the Llama checkpoint it is equivalent to)."""
    llama = save_tiny(str(tmp_path_factory.mktemp("llama-ref")), "LlamaConfig",
                      num_key_value_heads=2, rms_norm_eps=1e-6, attention_bias=True,
                      tie_word_embeddings=False)
    ours = internlm2_from_llama(llama, str(tmp_path_factory.mktemp("internlm2")), bias=True)
    return ours, llama


@pytest.mark.parametrize("case", list(CASES))
def test_prompt_logits_match_transformers(case, tiny):
    path = tiny(case)
    ids = prompt_ids(40)
    ours = full_prompt_logits(get_model(make_vllm_config(path)), ids)
    torch.testing.assert_close(ours, hf_logits(path, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ENGINE_CASES)
def test_greedy_and_logprobs_match_transformers(case, tiny):
    path = tiny(case)
    ids, results = run_engine(path)
    assert_matches_transformers(path, results, ids)


def test_internlm2_matches_its_llama_equivalent(internlm2):
    path, llama = internlm2
    ids = prompt_ids(40)
    ours = full_prompt_logits(get_model(make_vllm_config(path)), ids)
    torch.testing.assert_close(ours, hf_logits(llama, ids), atol=1e-4, rtol=1e-4)
    prompts, results = run_engine(path)
    assert_matches_transformers(llama, results, prompts)


def test_falcon_alibi_is_refused(tmp_path):
    path = save_tiny(str(tmp_path), "FalconConfig", alibi=True, num_hidden_layers=1)
    with pytest.raises(ValueError, match="alibi"):
        get_model(make_vllm_config(path))



def test_internlm2_chat_rope_scaling_loads(internlm2, tmp_path):
    """The chat checkpoints' `rope_scaling: {"type": "dynamic", "factor": 2.0}` (vLLM's
    dynamic NTK: one enlarged base; factor 1 would be the plain model above)."""
    import json
    import shutil
    from vllm.model_executor.layers.rotary_dynamic_ntk import DynamicNTKScalingRotaryEmbedding
    path = str(tmp_path / "internlm2-chat")
    shutil.copytree(internlm2[0], path)
    cfg = json.load(open(f"{path}/config.json"))
    cfg["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
    json.dump(cfg, open(f"{path}/config.json", "w"))
    rope = get_model(make_vllm_config(path)).model.rotary_emb
    assert isinstance(rope, DynamicNTKScalingRotaryEmbedding) and rope.scaling_factor == 2.0
