"""Gemma 2: the Llama skeleton with Gemma's own details.

- (1 + w) RMSNorm (`GemmaRMSNorm`), four per layer: before and after attention and
  before and after the MLP (the "post" norms act on the block output before it joins
  the residual);
- input embeddings scaled by sqrt(hidden_size) (rounded to the model dtype, as HF);
- tanh-GELU gated MLP;
- attention scale `query_pre_attn_scalar ** -0.5`, scores soft-capped
  (`attn_logit_softcapping`), and sliding-window attention on the layers
  `layer_types` marks "sliding_attention" (every other one in older configs);
- final logits soft-capped (`final_logit_softcapping`); tied embeddings.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vllm.attention import Attention
from vllm.attention.layer import extract_layer_index
from vllm.model_executor.layers.gemma_layers import GemmaRMSNorm, gelu_and_mul_for
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.llama import LlamaAttention, LlamaForCausalLM, LlamaModel


def is_sliding_layer(config: Any, layer_idx: int) -> bool:
    """Whether decoder layer `layer_idx` uses the sliding window (HF's layer rules)."""
    types = getattr(config, "layer_types", None)
    if types:
        return types[layer_idx] == "sliding_attention"
    pattern = getattr(config, "sliding_window_pattern", None)  # Gemma 3, older configs
    if pattern:
        return (layer_idx + 1) % pattern != 0
    return layer_idx % 2 == 0  # Gemma 2, older configs


def hidden_act_of(config: Any) -> str:
    return getattr(config, "hidden_activation", None) or config.hidden_act


class GemmaMLP(nn.Module):

    def __init__(self, hidden_size: int, intermediate_size: int, act: str,
                 prefix: str = "") -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2,
                                                       bias=False,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False,
                                           prefix=f"{prefix}.down_proj")
        self.act_fn = gelu_and_mul_for(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Gemma2Attention(LlamaAttention):
    """Llama's projections and rotary; Gemma's scale, soft-cap and per-layer window."""

    fused_decode_ok = False

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        window = (int(config.sliding_window)
                  if is_sliding_layer(config, extract_layer_index(prefix)) else None)
        self.attn = Attention(self.num_heads, self.head_dim,
                              float(config.query_pre_attn_scalar) ** -0.5, self.num_kv_heads,
                              prefix=f"{prefix}.attn",
                              logits_soft_cap=getattr(config, "attn_logit_softcapping", None),
                              per_layer_sliding_window=window)


class Gemma2DecoderLayer(nn.Module):
    """Sandwich norms; the residual travels beside the hidden states as in Llama."""

    attention_cls: type[LlamaAttention] = Gemma2Attention

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__()
        self.self_attn = self.attention_cls(config, rotary_emb, prefix=f"{prefix}.self_attn")
        self.mlp = GemmaMLP(config.hidden_size, config.intermediate_size, hidden_act_of(config),
                            prefix=f"{prefix}.mlp")
        eps, size = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.post_attention_layernorm(self.self_attn(positions, hidden_states))
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
        return hidden_states, residual


class Gemma2Model(LlamaModel):
    layer_cls = Gemma2DecoderLayer

    def __init__(self, vllm_config: Any, prefix: str = "model") -> None:
        super().__init__(vllm_config, prefix)
        config = self.config
        dtype = vllm_config.model_config.torch_dtype
        # HF multiplies by sqrt(hidden) held as a tensor of the model dtype.
        self.embedding_multiplier = torch.tensor(config.hidden_size ** 0.5, dtype=dtype).item()
        if self.is_last_stage:
            self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_cls = Gemma2Model

    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config, prefix)
        if self.model.is_last_stage:
            self.logits_processor.soft_cap = (
                getattr(self.config, "final_logit_softcapping", None) or None)
