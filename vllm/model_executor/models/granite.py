"""Granite 3.x: the Llama decoder with four multipliers from the config.

- `embedding_multiplier` scales the input embeddings;
- `attention_multiplier` is the attention scale (instead of head_dim ** -0.5);
- `residual_multiplier` scales each block's output before it joins the residual;
- logits are divided by `logits_scaling`.
"""
from __future__ import annotations

from typing import Any

import torch

from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.llama import (LlamaAttention, LlamaDecoderLayer,
                                              LlamaForCausalLM, LlamaModel)


class GraniteAttention(LlamaAttention):

    fused_decode_ok = False  # the native layer knows no multipliers

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        self.attn.scale = float(config.attention_multiplier)


class GraniteDecoderLayer(LlamaDecoderLayer):
    attention_cls = GraniteAttention

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states) * self.residual_multiplier
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states) * self.residual_multiplier, residual


class GraniteModel(LlamaModel):
    layer_cls = GraniteDecoderLayer

    def __init__(self, vllm_config: Any, prefix: str = "model") -> None:
        super().__init__(vllm_config, prefix)
        self.embedding_multiplier = float(self.config.embedding_multiplier)


class GraniteForCausalLM(LlamaForCausalLM):
    model_cls = GraniteModel

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config, prefix)
        if self.model.is_last_stage:
            self.logits_processor.scale = 1.0 / float(self.config.logits_scaling)
