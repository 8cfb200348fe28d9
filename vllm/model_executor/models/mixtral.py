"""Mixtral: the Mistral decoder with a sparse MoE block (top-k of E SwiGLU experts).

`MoECausalLMMixin` holds what every MoE model here shares: expert checkpoint names
(`experts.{e}.w1/w2/w3` or `gate/up/down_proj`) mapped into the stacked FusedMoE
weights, and Mixtral's `block_sparse_moe` module name mapped to `mlp`.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import nn

from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.model_executor.layers.fused_moe import FusedMoE, expert_param_name
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class SparseMoeBlock(nn.Module):
    """Router (`gate`, replicated) + FusedMoE `experts`; one all-reduce at the end, after
    whatever subclasses add to the routed output (shared experts)."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int,
                 intermediate_size: int, renormalize: bool, hidden_act: str = "silu",
                 prefix: str = "") -> None:
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False,
                                     prefix=f"{prefix}.gate")
        self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size,
                                renormalize=renormalize, reduce_results=False,
                                activation=hidden_act, prefix=f"{prefix}.experts")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.experts(hidden_states, self.gate(hidden_states))
        out = self.add_shared(hidden_states, out)
        if self.experts.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out

    def add_shared(self, hidden_states: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """This rank's partial routed output plus any shared-expert part (none here)."""
        return routed


class MixtralDecoderLayer(LlamaDecoderLayer):

    def build_mlp(self, config: Any, prefix: str) -> nn.Module:
        return SparseMoeBlock(config.hidden_size, config.num_local_experts,
                              config.num_experts_per_tok, config.intermediate_size,
                              renormalize=True, hidden_act=config.hidden_act, prefix=prefix)


class MixtralModel(LlamaModel):
    layer_cls = MixtralDecoderLayer


class MoECausalLMMixin:
    """Checkpoint names of MoE models -> parameters (put before LlamaForCausalLM)."""

    def _param_name(self, name: str) -> tuple[str, Optional[Union[str, int, tuple]]]:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        expert = expert_param_name(name)
        if expert is not None:
            return expert
        return super()._param_name(name)  # type: ignore[misc]


class MixtralForCausalLM(MoECausalLMMixin, LlamaForCausalLM):
    model_cls = MixtralModel

