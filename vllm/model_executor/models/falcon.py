"""Falcon (7B/40B/180B, Falcon-RW and Falcon 2): a LayerNorm decoder with rotary and
three attention layouts, read from the config as transformers does.

- `new_decoder_architecture` (40B, 180B, Falcon 2): grouped-query attention with
  `num_kv_heads` KV heads, the fused qkv rows grouped per KV head
  (`[q * heads/kv_heads, k, v]`); attention and MLP in parallel from two LayerNorms
  (`ln_attn`, `ln_mlp`; one shared `input_layernorm` when `num_ln_in_parallel_attn`
  is 1);
- `multi_query` (7B): one KV head, rows `[all q, k, v]`; `parallel_attn`: attention and
  MLP side by side from one `input_layernorm`;
- otherwise full multi-head attention, rows `[q, k, v]` per head, and with
  `parallel_attn=False` the sequential block (`post_attention_layernorm`).
The residual is added once after both branches in the parallel forms. ALiBi Falcons
(`alibi=True`, Falcon-RW) are refused: HF scales their bias differently from BLOOM's.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.gpt_base import (FusedQKVAttention, GeluMLP, GPTStyleForCausalLM,
                                                 GPTStyleModel, split_blocks, split_per_head)


def falcon_kv_heads(config: Any) -> int:
    """KV heads of a Falcon config (HF's rule)."""
    if config.new_decoder_architecture:
        return int(config.num_kv_heads)
    if config.multi_query:
        return 1
    return int(config.num_attention_heads)  # [q, k, v] per head


class FalconDecoderLayer(nn.Module):

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        head_dim = hidden // heads
        kv_heads = falcon_kv_heads(config)
        split = (split_blocks(heads, kv_heads, head_dim)
                 if config.multi_query and not config.new_decoder_architecture
                 else split_per_head(heads, kv_heads, head_dim))
        self.self_attention = FusedQKVAttention(hidden, heads, kv_heads, head_dim, rotary_emb,
                                                bool(config.bias), split,
                                                prefix=f"{prefix}.self_attention")
        ffn = getattr(config, "ffn_hidden_size", None) or 4 * hidden
        self.mlp = GeluMLP(hidden, ffn, getattr(config, "activation", None) or "gelu",
                           bool(config.bias), prefix=f"{prefix}.mlp")
        eps = config.layer_norm_epsilon
        self.new_arch = bool(config.new_decoder_architecture)
        self.parallel = self.new_arch or bool(config.parallel_attn)
        num_ln = getattr(config, "num_ln_in_parallel_attn", None)
        self.two_norms = self.new_arch and (num_ln is None or num_ln == 2)
        if self.two_norms:
            self.ln_attn = nn.LayerNorm(hidden, eps=eps)
            self.ln_mlp = nn.LayerNorm(hidden, eps=eps)
        else:
            self.input_layernorm = nn.LayerNorm(hidden, eps=eps)
            if not self.parallel:
                self.post_attention_layernorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        residual = hidden_states
        if self.two_norms:
            attn_in, mlp_in = self.ln_attn(hidden_states), self.ln_mlp(hidden_states)
        else:
            attn_in = mlp_in = self.input_layernorm(hidden_states)
        attn_out = self.self_attention(positions, attn_in)
        if not self.parallel:
            residual = residual + attn_out
            return residual + self.mlp(self.post_attention_layernorm(residual))
        return residual + (self.mlp(mlp_in) + attn_out)


class FalconModel(GPTStyleModel):

    def __init__(self, config: Any, prefix: str) -> None:
        if getattr(config, "alibi", False):
            raise ValueError("Falcon with alibi=True is not supported (only rotary Falcons).")
        super().__init__(config, prefix)

    def make_block(self, prefix: str) -> nn.Module:
        return FalconDecoderLayer(self.config, self.rotary_emb, prefix=prefix)


class FalconForCausalLM(GPTStyleForCausalLM):
    model_cls = FalconModel
