"""Qwen1.5-MoE / Qwen2-MoE: the Qwen2 decoder with routed experts plus a gated shared
expert; `mlp_only_layers` and `decoder_sparse_step` pick layers that stay dense."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index

from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.linear import (MergedColumnParallelLinear, ReplicatedLinear,
                                               RowParallelLinear)
from vllm.model_executor.models.llama import (LlamaAttention, LlamaDecoderLayer,
                                              LlamaForCausalLM, LlamaMLP, LlamaModel)
from vllm.model_executor.models.mixtral import MoECausalLMMixin, SparseMoeBlock


class SharedExpertMLP(nn.Module):
    """SwiGLU MLP whose output stays a per-rank partial sum (the MoE block reduces)."""

    def __init__(self, hidden_size: int, intermediate_size: int, prefix: str = "") -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2,
                                                       bias=False,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False,
                                           reduce_results=False, prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Qwen2MoeSparseMoeBlock(SparseMoeBlock):
    """Routed experts + sigmoid(shared_expert_gate(x)) * shared_expert(x)."""

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                         config.moe_intermediate_size,
                         renormalize=bool(getattr(config, "norm_topk_prob", False)),
                         hidden_act=config.hidden_act, prefix=prefix)
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        self.shared_expert = (SharedExpertMLP(config.hidden_size, shared,
                                              prefix=f"{prefix}.shared_expert")
                              if shared else None)
        self.shared_expert_gate = (ReplicatedLinear(config.hidden_size, 1, bias=False,
                                                    prefix=f"{prefix}.shared_expert_gate")
                                   if shared else None)

    def add_shared(self, hidden_states: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        if self.shared_expert is None:
            return routed
        gate = torch.sigmoid(self.shared_expert_gate(hidden_states))
        return routed + gate * self.shared_expert(hidden_states)


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    """HF's rule for Qwen MoE configs: which decoder layers hold experts."""
    return (layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
            and config.num_experts > 0
            and (layer_idx + 1) % (getattr(config, "decoder_sparse_step", 1) or 1) == 0)


class Qwen2MoeAttention(LlamaAttention):

    @staticmethod
    def projection_biases(config: Any) -> tuple[bool, bool]:
        return bool(getattr(config, "qkv_bias", True)), False


class Qwen2MoeDecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2MoeAttention
    sparse_block_cls = Qwen2MoeSparseMoeBlock

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        if is_sparse_layer(config, extract_layer_index(prefix)):
            return self.sparse_block_cls(config, prefix=prefix)
        return LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                        prefix=prefix)


class Qwen2MoeModel(LlamaModel):
    layer_cls = Qwen2MoeDecoderLayer


class Qwen2MoeForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = Qwen2MoeModel
