"""GraniteMoeHybridForCausalLM (Granite 4: Mamba2 mixers beside attention layers, per
`layer_types`) on CPU: the attention layers keep the paged KV cache, the mixers their
state slots; greedy tokens and top-5 logprobs equal transformers' (fp32; sparse MoE
without rotary, and the dense shared-MLP variant with rotary); 16-token chunked prefill,
a budget that caps the running requests, and a preempted request equal the plain run."""
from __future__ import annotations

import torch

from tests.models.test_breadth_hf import assert_matches_transformers
from tests.models.test_mamba2 import PROMPTS, _run, assert_preempted_request_recomputes

HYBRID = dict(vocab_size=49152, hidden_size=64, intermediate_size=32,
              shared_intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, layer_types=["mamba", "attention", "mamba", "attention"],
              mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2,
              mamba_chunk_size=8, num_local_experts=4, num_experts_per_tok=2,
              embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.25,
              logits_scaling=2.0, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              max_position_embeddings=1024)
STATE_BYTES = 2 * (192 * 3 + 8 * 16 * 16) * 4
KV_BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4
"""2 attention layers x (K, V) x 16 tokens x 2 KV heads x 16 fp32."""


def _save(directory: str, **overrides) -> str:
    import transformers
    from tests.models._tiny_families import _save_tokenizer
    torch.manual_seed(0)
    config = transformers.GraniteMoeHybridConfig(**{**HYBRID, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory, safe_serialization=True)
    _save_tokenizer(directory)
    return directory


def test_granite_hybrid_moe_matches_transformers_chunked_and_preempted(tmp_path):
    path = _save(str(tmp_path))
    results, info = _run(path)
    config = info["config"]
    assert [g.kv_cache_spec.kind for g in config.kv_cache_groups] == ["full_attention"]
    assert config.kv_cache_groups[0].layer_ids == [1, 3]
    assert sorted(config.state_specs) == [0, 2]
    assert config.state_bytes_per_request() == STATE_BYTES and not info["caching"]
    assert_matches_transformers(path, results, PROMPTS)
    tokens = [r[0] for r in results]

    chunked, _ = _run(path, max_num_batched_tokens=16)
    assert [r[0] for r in chunked] == tokens

    block = KV_BLOCK_BYTES + -(-STATE_BYTES // (128 // 16))
    capped, info = _run(path, kv_cache_memory_bytes=20 * block, max_model_len=128)
    assert info["slots"] == 2
    assert [r[0] for r in capped] == tokens
    assert info["held"] == {}

    assert_preempted_request_recomputes(path, tokens)


def test_granite_hybrid_dense_with_rope_matches_transformers(tmp_path):
    path = _save(str(tmp_path), num_local_experts=0, position_embedding_type="rope",
                 layer_types=["attention", "mamba", "mamba", "attention"])
    results, _ = _run(path)
    assert_matches_transformers(path, results, PROMPTS)
