"""JambaForCausalLM (Mamba1 mixers beside attention without rotary, sparse MoE every
other layer) on CPU: greedy tokens and top-5 logprobs equal transformers' (fp32),
16-token chunked prefill and a preempted request equal the plain run."""
from __future__ import annotations

import torch

from tests.models.test_breadth_hf import assert_matches_transformers
from tests.models.test_mamba2 import PROMPTS, _run, assert_preempted_request_recomputes

JAMBA = dict(vocab_size=49152, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2,
             attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=4,
             num_experts_per_tok=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
             mamba_dt_rank=8, bos_token_id=1, eos_token_id=2, pad_token_id=0,
             max_position_embeddings=1024)
STATE_BYTES = 2 * (128 * 3 + 128 * 16) * 4
"""2 Mamba1 layers x (conv state [128, 3] + SSM state [128, 16]) fp32."""


def save_jamba(directory: str, **overrides) -> str:
    import transformers
    from tests.models._tiny_families import _save_tokenizer
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.JambaConfig(**{**JAMBA, **overrides}), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory, safe_serialization=True)
    _save_tokenizer(directory)
    return directory


def test_jamba_matches_transformers_chunked_and_preempted(tmp_path):
    path = save_jamba(str(tmp_path))
    results, info = _run(path)
    config = info["config"]
    assert config.kv_cache_groups[0].layer_ids == [1, 3] and sorted(config.state_specs) == [0, 2]
    assert config.state_bytes_per_request() == STATE_BYTES
    assert_matches_transformers(path, results, PROMPTS)
    tokens = [r[0] for r in results]
    chunked, _ = _run(path, max_num_batched_tokens=16)
    assert [r[0] for r in chunked] == tokens
    assert_preempted_request_recomputes(path, tokens)
