"""FalconH1ForCausalLM (a Mamba2 mixer and attention side by side in every layer, muP
multipliers) on CPU: each layer keeps its attention's KV blocks and its mixer's state
slot (keyed past the layer count); greedy tokens and top-5 logprobs equal
transformers' (fp32, non-trivial multipliers; gate without norm, and the group norm
before the gate), 16-token chunked prefill and a preempted request equal the plain run."""
from __future__ import annotations

import torch

from tests.models.test_breadth_hf import assert_matches_transformers
from tests.models.test_mamba2 import PROMPTS, _run, assert_preempted_request_recomputes

FALCON_H1 = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=128,
                 mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2,
                 mamba_chunk_size=8, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                 max_position_embeddings=1024, embedding_multiplier=1.5,
                 lm_head_multiplier=0.5, ssm_in_multiplier=0.8, ssm_out_multiplier=1.2,
                 attention_in_multiplier=0.9, attention_out_multiplier=1.1,
                 key_multiplier=0.7, mlp_multipliers=[1.3, 0.6],
                 ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05])


def save_falcon_h1(directory: str, **overrides) -> str:
    import transformers
    from tests.models._tiny_families import _save_tokenizer
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.FalconH1Config(**{**FALCON_H1, **overrides}), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory, safe_serialization=True)
    _save_tokenizer(directory)
    return directory


def test_falcon_h1_matches_transformers_chunked_and_preempted(tmp_path):
    path = save_falcon_h1(str(tmp_path / "plain"))
    results, info = _run(path)
    config = info["config"]
    assert config.kv_cache_groups[0].layer_ids == [0, 1] and sorted(config.state_specs) == [2, 3]
    assert_matches_transformers(path, results, PROMPTS)
    tokens = [r[0] for r in results]
    chunked, _ = _run(path, max_num_batched_tokens=16)
    assert [r[0] for r in chunked] == tokens
    assert_preempted_request_recomputes(path, tokens)

    normed = save_falcon_h1(str(tmp_path / "normed"), mamba_rms_norm=True,
                            mamba_norm_before_gate=True)
    results, _ = _run(normed)
    assert_matches_transformers(normed, results, PROMPTS)
