"""Mixture-of-experts feed-forward: routing plus one fused layer holding all experts."""
from vllm.model_executor.layers.fused_moe.layer import (FusedMoE, expert_param_name,
                                                        expert_parallel_scope)
from vllm.model_executor.layers.fused_moe.routing import select_experts

__all__ = ["FusedMoE", "expert_param_name", "select_experts"]
