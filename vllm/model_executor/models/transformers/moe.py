"""transformers' MoE experts on our fused MoE op.

transformers 5 keeps a MoE block's experts in one module (decorated with
`use_experts_implementation`) holding stacked `gate_up_proj` [E, 2I, H] and `down_proj`
[E, H, I], called by the block as `experts(hidden, top_k_index, top_k_weights)` after
the model's own router has chosen. The backend keeps the router (the model's routing
rules, whatever they are) and swaps the experts for `TransformersExperts`: our
`FusedMoE` (the platform's kernel: packed GEMMs on CPU, Gaudi's mixture_of_experts on
the HPU; the intermediate dimension split over TP ranks, or whole experts with expert
parallel) fed the router's choice instead of routing itself.

Checkpoints store the experts one by one (`experts.{e}.gate_proj.weight`, Mixtral's
`w1/w3/w2`) or stacked as the library holds them; both load (`expert_weights`).
"""
from __future__ import annotations

import re
from typing import Any, Iterator, Optional

import torch
from torch import nn

from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.model_executor.layers.fused_moe import FusedMoE, expert_param_name

_STACKED = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
_TOP_K_FIELDS = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts")


def is_experts_module(module: nn.Module) -> bool:
    """A transformers experts module: stacked 3-D `gate_up_proj` and `down_proj`."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    return (isinstance(gate_up, nn.Parameter) and gate_up.dim() == 3
            and isinstance(down, nn.Parameter) and down.dim() == 3)


class TransformersExperts(FusedMoE):
    """`FusedMoE` called with transformers' experts signature (pre-routed)."""

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        x = hidden_states.reshape(-1, self.hidden_size)
        routed = (top_k_weights.reshape(x.shape[0], -1),
                  top_k_index.reshape(x.shape[0], -1))
        return self._forward_method(x, routed).view(hidden_states.shape)

    def run(self, hidden_states: torch.Tensor, routed: Any, experts: Any) -> torch.Tensor:
        """FusedMoE.run with the router's (weights, ids) in place of router logits."""
        topk_weights, topk_ids = routed
        if self.ep_size > 1:
            topk_weights, topk_ids = self.to_local_experts(topk_weights, topk_ids)
        out = experts(self, hidden_states, topk_weights, topk_ids)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out


def _top_k(config: Any) -> int:
    for name in _TOP_K_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError("the MoE config names no experts-per-token field "
                     f"({', '.join(_TOP_K_FIELDS)}).")


def _check_activation(module: nn.Module, name: str) -> None:
    act = getattr(module, "act_fn", None)
    if getattr(module, "has_bias", False) or getattr(module, "gate_up_proj_bias", None) is not None:
        raise ValueError(f"{name}: experts with biases are not supported by the fused MoE op")
    if act is not None and not isinstance(act, nn.SiLU) and type(act).__name__ != "SiLUActivation":
        raise ValueError(f"{name}: experts activation {type(act).__name__} is not supported; "
                         "only SiLU (SwiGLU experts)")


def replace_experts(base: nn.Module, config: Any, prefix: str) -> int:
    """Swap every experts module of `base` for a `TransformersExperts`; the count."""
    count = 0
    for name, module in list(base.named_modules()):
        if not is_experts_module(module):
            continue
        full = f"{prefix}.{name}" if prefix else name
        _check_activation(module, full)
        experts, double_inter, hidden = module.gate_up_proj.shape
        if tuple(module.down_proj.shape) != (experts, hidden, double_inter // 2):
            raise ValueError(f"{full}: stacked expert weights of shapes "
                             f"{tuple(module.gate_up_proj.shape)} / "
                             f"{tuple(module.down_proj.shape)} are not transformers' "
                             "[E, 2I, H] / [E, H, I] layout")
        fused = TransformersExperts(experts, _top_k(config), hidden, double_inter // 2,
                                    renormalize=False, reduce_results=True,
                                    params_dtype=module.gate_up_proj.dtype, prefix=full)
        parent, _, child = name.rpartition(".")
        setattr(base.get_submodule(parent) if parent else base, child, fused)
        count += 1
    return count


def expert_weights(name: str, tensor: torch.Tensor
                   ) -> Optional[Iterator[tuple[str, torch.Tensor, str, int]]]:
    """(parameter, tensor, shard id, expert id) loads of an expert checkpoint tensor,
    per-expert or stacked; None for any other tensor."""
    single = expert_param_name(name)
    if single is not None:
        param, (shard, expert) = single
        return iter([(param, tensor, shard, expert)])
    m = _STACKED.search(name)
    if m is None:
        return None
    base = name[:m.start()] + ".experts."
    if m.group(1) == "down_proj":
        return ((base + "w2_weight", tensor[e], "w2", e) for e in range(tensor.shape[0]))
    inter = tensor.shape[1] // 2
    return ((base + "w13_weight", tensor[e, rows], shard, e)
            for e in range(tensor.shape[0])
            for shard, rows in (("w1", slice(0, inter)), ("w3", slice(inter, None))))
