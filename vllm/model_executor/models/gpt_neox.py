"""GPT-NeoX (Pythia, GPT-NeoX-20B, StableLM-alpha): a LayerNorm decoder with

- partial rotary: neox-style RoPE on the first `partial_rotary_factor` (HF's
  `rotary_pct`, 0.25 by default) of each head's features;
- `query_key_value` rows laid out per head as `[q, k, v]`, biases on by default
  (`attention_bias`);
- the parallel residual (`use_parallel_residual`, default):
  `x + attn(ln1(x)) + mlp(ln2(x))`; without it the usual sequential block;
- an untied LM head named `embed_out`, the decoder under `gpt_neox.`.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.gpt_base import (FusedQKVAttention, GeluMLP, GPTStyleForCausalLM,
                                                 GPTStyleModel, split_per_head)


class GPTNeoXLayer(nn.Module):

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        head_dim = hidden // heads
        self.attention = FusedQKVAttention(hidden, heads, heads, head_dim, rotary_emb,
                                           bool(getattr(config, "attention_bias", True)),
                                           split_per_head(heads, heads, head_dim),
                                           prefix=f"{prefix}.attention")
        self.mlp = GeluMLP(hidden, config.intermediate_size, config.hidden_act, bias=True,
                           prefix=f"{prefix}.mlp")
        self.input_layernorm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.use_parallel_residual = bool(config.use_parallel_residual)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        attn_out = self.attention(positions, self.input_layernorm(hidden_states))
        if self.use_parallel_residual:
            mlp_out = self.mlp(self.post_attention_layernorm(hidden_states))
            return mlp_out + attn_out + hidden_states
        attn_out = attn_out + hidden_states
        return self.mlp(self.post_attention_layernorm(attn_out)) + attn_out


class GPTNeoXModel(GPTStyleModel):
    embed_name = "embed_in"
    layers_name = "layers"
    norm_name = "final_layer_norm"

    def layer_norm_eps(self) -> float:
        return float(self.config.layer_norm_eps)

    def make_block(self, prefix: str) -> nn.Module:
        return GPTNeoXLayer(self.config, self.rotary_emb, prefix=prefix)


class GPTNeoXForCausalLM(GPTStyleForCausalLM):
    model_cls = GPTNeoXModel
    base_name = "gpt_neox"
    head_name = "embed_out"
