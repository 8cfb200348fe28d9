"""LongRoPE cos/sin against transformers' own longrope frequencies and attention factor."""
from __future__ import annotations

import torch

from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.utils import rope_config


def test_longrope_cache_matches_transformers_short_and_long():
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    orig, long_max, rd = 64, 512, 8
    config = transformers.Phi3Config(
        vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=long_max, original_max_position_embeddings=orig, pad_token_id=0,
        rope_parameters=dict(rope_type="longrope", rope_theta=500.0, partial_rotary_factor=0.5,
                             short_factor=[1.0, 1.2, 3.0, 7.0], long_factor=[1.5, 4.0, 8.0, 20.0]))
    theta, scaling = rope_config(config)
    rope = get_rope(16, rd, long_max, theta, scaling, dtype=torch.float32)
    init = ROPE_INIT_FUNCTIONS["longrope"]
    for seq_len, positions in ((None, torch.arange(0, orig)), (orig + 1,
                                                                torch.arange(orig, long_max))):
        inv_freq, attention_factor = init(config, "cpu", seq_len=seq_len)
        assert attention_factor > 1.0  # sqrt(1 + ln(8) / ln(64))
        freqs = torch.outer(positions.float(), inv_freq)
        expected = torch.cat((freqs.cos(), freqs.sin()), -1) * attention_factor
        torch.testing.assert_close(rope.cos_sin_cache[positions], expected, atol=1e-5, rtol=0)
