"""Qwen3NextForCausalLM (Gated DeltaNet linear attention on state slots beside gated
full attention, Qwen2-MoE blocks, (1 + w) RMSNorms) on CPU: greedy tokens and top-5
logprobs equal transformers' (fp32; a prompt longer than the 64-token delta-rule
chunk), 16-token chunked prefill and a preempted request equal the plain run."""
from __future__ import annotations

import torch

from tests.models.test_breadth_hf import assert_matches_transformers
from tests.models.test_mamba2 import PROMPTS, _run, assert_preempted_request_recomputes

QWEN3_NEXT = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                  decoder_sparse_step=2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  max_position_embeddings=1024,
                  layer_types=["linear_attention"] * 3 + ["full_attention"])
LONG = [(11 * i + 5) % 4000 + 100 for i in range(70)]


def save_qwen3_next(directory: str) -> str:
    import transformers
    from tests.models._tiny_families import _save_tokenizer
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3NextConfig(**QWEN3_NEXT), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
            else:  # (1 + w) norms, A_log, dt_bias away from their initial values
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    _save_tokenizer(directory)
    return directory


def test_qwen3_next_matches_transformers_chunked_and_preempted(tmp_path):
    path = save_qwen3_next(str(tmp_path))
    results, info = _run(path)
    config = info["config"]
    assert config.kv_cache_groups[0].layer_ids == [3] and sorted(config.state_specs) == [0, 1, 2]
    assert_matches_transformers(path, results, PROMPTS)
    tokens = [r[0] for r in results]
    chunked, _ = _run(path, max_num_batched_tokens=16)
    assert [r[0] for r in chunked] == tokens
    assert_preempted_request_recomputes(path, tokens)

    from tests.models.test_breadth_hf import greedy_with_logprobs
    from vllm import LLM
    llm = LLM(model=path, dtype="float32", block_size=16, max_model_len=256)
    long = greedy_with_logprobs(llm, [LONG])
    llm.llm_engine.shutdown()
    assert_matches_transformers(path, long, [LONG])


def save_qwen3_5(directory: str, moe: bool = False) -> str:
    """A tiny Qwen3.5 text model (dense, or MoE) of Qwen3-Next's sizes."""
    import transformers
    from tests.models._tiny_families import _save_tokenizer
    common = {k: v for k, v in QWEN3_NEXT.items()
              if k not in ("moe_intermediate_size", "shared_expert_intermediate_size",
                           "num_experts", "num_experts_per_tok", "decoder_sparse_step",
                           "max_position_embeddings")}
    config = (transformers.Qwen3_5MoeTextConfig(
        moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, **common) if moe else transformers.Qwen3_5TextConfig(**common))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0) if p.dim() >= 2 else p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    _save_tokenizer(directory)
    return directory


def test_qwen3_5_dense_and_moe_match_transformers(tmp_path):
    """Qwen3.5 text models: the same design with plain linear-attention projections
    (in_proj_qkv / _z / _b / _a); the MoE one's router always renormalizes. Each also
    gives its plain run's tokens in 16-token chunks and when a request is preempted."""
    for name in ("dense", "moe"):
        path = save_qwen3_5(str(tmp_path / name), moe=name == "moe")
        results, _ = _run(path)
        assert_matches_transformers(path, results, PROMPTS)
        tokens = [r[0] for r in results]
        chunked, _ = _run(path, max_num_batched_tokens=16)
        assert [r[0] for r in chunked] == tokens, name
        assert_preempted_request_recomputes(path, tokens)
