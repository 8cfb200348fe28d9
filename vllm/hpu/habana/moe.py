"""`mixture_of_experts`: Gaudi's fused MoE op, or its plain-torch stand-in.

On a Gaudi image this is `torch.ops.hpu.mixture_of_experts`. The stand-in has the
same signature and the same static-shape character: every expert in
[experts_min, experts_max] is applied to every row and weighted by its routing weight
(zero where the row was not routed to it), so the work never depends on the routing,
as on the device, where each bucket is one graph whatever the tokens chose. Experts
are summed in ascending order, the order the CPU path's `index_add_` uses, so both
give the same floats.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def fake_mixture_of_experts(hidden_states: torch.Tensor, expert_routing_table: torch.Tensor,
                            router_weights: torch.Tensor, w12: list[torch.Tensor],
                            w3: list[torch.Tensor], permuted_weights: bool = True,
                            activation: str = "silu", experts_min: int = 0,
                            experts_max: int = 0) -> torch.Tensor:
    """hidden [T, H], routing table [T, k] expert ids, weights [T, k];
    w12[e]: [2I, H] (gate rows then up rows), w3[e]: [H, I] (the down projection)."""
    if not permuted_weights:
        raise ValueError("only permuted_weights=True ([out, in] weights) is emulated.")
    if activation != "silu":
        raise ValueError(f"activation {activation!r} is not emulated; only 'silu'.")
    out = torch.zeros_like(hidden_states)
    for expert in range(experts_min, experts_max + 1):
        w = w12[expert - experts_min]
        weight = (router_weights * (expert_routing_table == expert)).sum(-1, keepdim=True)
        gate, up = F.linear(hidden_states, w).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w3[expert - experts_min])
        out += y * weight.to(y.dtype)
    return out


def real_mixture_of_experts(*args, **kwargs) -> torch.Tensor:  # pragma: no cover - Gaudi
    return torch.ops.hpu.mixture_of_experts(*args, **kwargs)
