"""NemotronHForCausalLM (Nemotron-H: single-mixer blocks, Mamba2 / attention without
rotary / relu^2 MLP per `layers_block_type`) on CPU: greedy tokens and top-5 logprobs
equal transformers' (fp32), 16-token chunked prefill and a preempted request equal the
plain run; MoE blocks are refused by name."""
from __future__ import annotations

import pytest
import torch

from tests.models.test_breadth_hf import assert_matches_transformers
from tests.models.test_mamba2 import PROMPTS, _run, assert_preempted_request_recomputes

NEMOTRON_H = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=4,
                  layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"],
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, mamba_num_heads=8, mamba_head_dim=16,
                  ssm_state_size=16, n_groups=2, chunk_size=8, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)


def save_nemotron_h(directory: str, **overrides) -> str:
    import transformers
    from tests.models._tiny_families import _save_tokenizer
    torch.manual_seed(0)
    config = transformers.NemotronHConfig(**{**NEMOTRON_H, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    model.save_pretrained(directory, safe_serialization=True)
    _save_tokenizer(directory)
    return directory


def test_nemotron_h_matches_transformers_chunked_and_preempted(tmp_path):
    path = save_nemotron_h(str(tmp_path))
    results, info = _run(path)
    config = info["config"]
    assert config.kv_cache_groups[0].layer_ids == [2] and sorted(config.state_specs) == [0]
    assert_matches_transformers(path, results, PROMPTS)
    tokens = [r[0] for r in results]
    chunked, _ = _run(path, max_num_batched_tokens=16)
    assert [r[0] for r in chunked] == tokens
    assert_preempted_request_recomputes(path, tokens)


def test_nemotron_h_moe_blocks_are_refused(tmp_path):
    from vllm.model_executor.models.nemotron_h import block_types
    cfg = type("C", (), {"hybrid_override_pattern": "M-*E"})()
    assert block_types(cfg) == ["mamba", "mlp", "attention", "moe"]
    from vllm.model_executor.models.nemotron_h import NemotronHBlock
    with pytest.raises(NotImplementedError, match="moe"):
        NemotronHBlock(cfg, None, "moe", "backbone.layers.3")


def test_checkpoint_ssm_state_dtype_is_the_default(tmp_path):
    """Nemotron-H configs name mamba_ssm_cache_dtype (float32): with --mamba-ssm-cache-dtype
    auto the SSM state takes it while the conv state keeps the model dtype (vLLM's rule);
    the flag overrides it."""
    from vllm.model_executor.layers.mamba.mamba2_mixer import state_dtypes
    cache = type("CC", (), {"mamba_cache_dtype": "auto", "mamba_ssm_cache_dtype": "auto"})()
    hf = type("HF", (), {"mamba_ssm_cache_dtype": "float32"})()
    assert state_dtypes(cache, torch.bfloat16, hf) == (torch.bfloat16, torch.float32)
    cache.mamba_ssm_cache_dtype = "float16"
    assert state_dtypes(cache, torch.bfloat16, hf) == (torch.bfloat16, torch.float16)
    assert state_dtypes(cache, torch.bfloat16, None) == (torch.bfloat16, torch.float16)
