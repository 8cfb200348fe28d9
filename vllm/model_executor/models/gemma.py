"""Gemma (1): the Llama skeleton with Gemma's norms, embedding scale and GELU MLP.

- (1 + w) RMSNorm computed in float32 (`GemmaRMSNorm`), two per layer as in Llama;
- input embeddings scaled by sqrt(hidden_size), rounded to the model dtype as HF does;
- tanh-GELU gated MLP (the legacy `hidden_act="gelu"` of the first releases means the
  tanh approximation too, as transformers decides);
- `head_dim` from the config (256 in the released models, not hidden / heads);
- tied embeddings.
Gemma 2/3 (soft-caps, sandwich norms, windows) live in gemma2.py / gemma3.py.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.model_executor.layers.gemma_layers import GemmaRMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.gemma2 import GemmaMLP
from vllm.model_executor.models.llama import (LlamaAttention, LlamaDecoderLayer,
                                              LlamaForCausalLM, LlamaModel)


def gemma_act_of(config: Any) -> str:
    """The MLP activation: `hidden_activation`, else `hidden_act` with 'gelu' read as
    the tanh GELU (what the released checkpoints were trained with)."""
    act = getattr(config, "hidden_activation", None) or config.hidden_act
    return "gelu_pytorch_tanh" if act == "gelu" else act


class GemmaAttention(LlamaAttention):
    fused_decode_ok = False  # the native layer knows Llama's norm, not Gemma's (1 + w)


class GemmaDecoderLayer(LlamaDecoderLayer):
    attention_cls = GemmaAttention

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        return GemmaMLP(config.hidden_size, config.intermediate_size, gemma_act_of(config),
                        prefix=prefix)


class GemmaModel(LlamaModel):
    layer_cls = GemmaDecoderLayer

    def __init__(self, vllm_config: Any, prefix: str = "model") -> None:
        super().__init__(vllm_config, prefix)
        dtype = vllm_config.model_config.torch_dtype
        self.embedding_multiplier = torch.tensor(self.config.hidden_size ** 0.5,
                                                 dtype=dtype).item()
        if self.is_last_stage:
            self.norm = GemmaRMSNorm(self.config.hidden_size, self.config.rms_norm_eps)


class GemmaForCausalLM(LlamaForCausalLM):
    model_cls = GemmaModel
