"""GLM-4.5 / 4.5-Air / 4.6 (`Glm4MoeForCausalLM`): a GQA decoder with DeepSeek-V3 routing.

Attention: Llama's, with a bias on q/k/v (`attention_bias`) but none on `o_proj`, an
optional per-head RMSNorm on q and k (`use_qk_norm`, as Qwen3) and a partial rotary:
neox-style on the first `partial_rotary_factor` (0.5 in the released configs) of each
head, which `LlamaModel.build_rotary_emb` already reads from the config.

Feed-forward: the first `first_k_dense_replace` layers are a dense SwiGLU MLP, the rest
DeepSeek-V3's MoE (sigmoid scores, `e_score_correction_bias` added for the choice only,
groups ranked by their two best experts, renormalized top-k times
`routed_scaling_factor`, `n_shared_experts` always-on experts), which is
`DeepseekV2MoE` once the config reads as V3's.

The released checkpoints carry `num_nextn_predict_layers` multi-token-prediction layers
after the last decoder layer (`model.layers.{num_hidden_layers + i}`); like vLLM's
main model, this one skips them (the loader drops tensors of layers it does not own).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.models.deepseek_v2 import DeepseekV2MoE
from vllm.model_executor.models.llama import (LlamaAttention, LlamaDecoderLayer,
                                              LlamaForCausalLM, LlamaMLP, LlamaModel)
from vllm.model_executor.models.mixtral import MoECausalLMMixin


class Glm4MoeAttention(LlamaAttention):
    """GQA with q/k/v bias, no o_proj bias, optional per-head q/k RMSNorm."""

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        self.use_qk_norm = bool(getattr(config, "use_qk_norm", False))
        if self.use_qk_norm:
            self.fused_decode_ok = False  # the norms sit between projection and rotary
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    @staticmethod
    def projection_biases(config: Any) -> tuple[bool, bool]:
        return bool(getattr(config, "attention_bias", False)), False

    def rotate_qk(self, positions: torch.Tensor, qkv: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.use_qk_norm:
            return super().rotate_qk(positions, qkv)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        t = qkv.shape[0]
        q = self.q_norm(q.reshape(t, self.num_heads, self.head_dim))
        k = self.k_norm(k.reshape(t, self.num_kv_heads, self.head_dim))
        q, k = self.rotary_emb(positions, q, k)
        return q.reshape(t, self.q_size), k.reshape(t, self.kv_size), v


class _V3RoutingView:
    """The GLM config read as DeepSeek-V3's by `DeepseekV2MoE` (sigmoid + bias,
    grouped top-k); every other attribute is the config's own."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self.topk_method = "noaux_tc"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def is_moe_layer(config: Any, layer_idx: int) -> bool:
    """GLM's rule: routed experts from layer `first_k_dense_replace` on."""
    return (bool(getattr(config, "n_routed_experts", 0))
            and layer_idx >= (getattr(config, "first_k_dense_replace", 0) or 0))


class Glm4MoeDecoderLayer(LlamaDecoderLayer):
    attention_cls = Glm4MoeAttention

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        if is_moe_layer(config, extract_layer_index(prefix)):
            return DeepseekV2MoE(_V3RoutingView(config), prefix=prefix)
        return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                        prefix=prefix)


class Glm4MoeModel(LlamaModel):
    layer_cls = Glm4MoeDecoderLayer


class Glm4MoeForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = Glm4MoeModel
