"""InternLM2 / InternLM2.5 config (model_type "internlm2"): the fields of the
checkpoints' own configuration file, with their defaults."""
from __future__ import annotations

from typing import Any, Optional

from transformers import PretrainedConfig


class InternLM2Config(PretrainedConfig):
    model_type = "internlm2"

    def __init__(self, vocab_size: int = 103168, hidden_size: int = 4096,
                 intermediate_size: int = 11008, num_hidden_layers: int = 32,
                 num_attention_heads: int = 32, num_key_value_heads: Optional[int] = None,
                 hidden_act: str = "silu", max_position_embeddings: int = 2048,
                 initializer_range: float = 0.02, rms_norm_eps: float = 1e-6,
                 use_cache: bool = True, pad_token_id: int = 0, bos_token_id: int = 1,
                 eos_token_id: int = 2, tie_word_embeddings: bool = False, bias: bool = True,
                 rope_theta: float = 10000.0, rope_scaling: Optional[dict] = None,
                 attn_implementation: Optional[str] = None, **kwargs: Any) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.bias = bias
        self.rope_theta = rope_theta
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings,
                         **kwargs)
        # The checkpoints' `rope_scaling` ({"type": "dynamic", "factor": 2.0} in the chat
        # models), held as transformers 5's `rope_parameters` (which deprecates the former).
        scaling = dict(rope_scaling or {})
        rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))
        self.rope_parameters = {"rope_type": rope_type, "rope_theta": rope_theta, **scaling}
