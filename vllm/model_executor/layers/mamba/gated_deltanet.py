"""Gated DeltaNet, Qwen3-Next's linear attention (transformers' Qwen3NextGatedDeltaNet
semantics), on state slots.

in_proj_qkvz and in_proj_ba, laid out per key head ([q, k, v..., z...] and [b..., a...]
for the value heads it serves); q, k, v through the causal conv1d (carried conv state,
SiLU); q and k L2-normalized and repeated to the value heads, q scaled by dk^-1/2;
beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); the gated delta rule (chunked
for prefill, one step for decode; carried state [value heads, dk, dv]); per head
weight * rmsnorm(o) * silu(z); out_proj. The slot handling (flat and padded batches)
is the Mamba2 mixer's. Tensor parallelism is not implemented (TP 1).

Qwen3.5 (`split_projections`) has the same mixer with plain projections: in_proj_qkv
([q | k | v], head-major), in_proj_z, in_proj_b and in_proj_a.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.distributed import get_tp_group
from vllm.kv_cache_spec import MambaSpec
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.mamba.mamba2_mixer import Mamba2Mixer, _Params
from vllm.worker.state_cache import get_state_metadata


class GatedDeltaNetMixer(Mamba2Mixer):
    """Its "xbc" rows are the conv input [q | k | v], its "dt" rows [z | b | a]."""

    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int,
                 head_k_dim: int, head_v_dim: int, conv_kernel: int, eps: float,
                 chunk_size: int = 64,
                 state_dtypes: tuple[torch.dtype, torch.dtype] = (torch.float32,) * 2,
                 prefix: str = "", split_projections: bool = False) -> None:
        nn.Module.__init__(self)
        if get_tp_group().world_size > 1:
            raise NotImplementedError("Gated DeltaNet (Qwen3-Next) mixers: tensor "
                                      "parallelism is not implemented yet.")
        self.layer_idx = extract_layer_index(prefix) if prefix else 0
        self.state_key = self.layer_idx
        self.hk, self.hv, self.dk, self.dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel, self.chunk_size, self.eps = conv_kernel, chunk_size, eps
        self.intermediate_size = self.value_dim  # the width of the slots' outputs
        self.conv_dtype, self.ssm_dtype = state_dtypes
        self.split_projections = split_projections
        if split_projections:
            for name, width in (("in_proj_qkv", self.conv_dim), ("in_proj_z", self.value_dim),
                                ("in_proj_b", num_v_heads), ("in_proj_a", num_v_heads)):
                setattr(self, name, ReplicatedLinear(hidden_size, width, bias=False,
                                                     prefix=f"{prefix}.{name}"))
        else:
            self.in_proj_qkvz = ReplicatedLinear(hidden_size,
                                                 2 * self.key_dim + 2 * self.value_dim,
                                                 bias=False, prefix=f"{prefix}.in_proj_qkvz")
            self.in_proj_ba = ReplicatedLinear(hidden_size, 2 * num_v_heads, bias=False,
                                               prefix=f"{prefix}.in_proj_ba")
        self.conv1d = _Params(weight=(self.conv_dim, 1, conv_kernel), bias=None)
        dtype = torch.get_default_dtype()
        self.dt_bias = nn.Parameter(torch.zeros(num_v_heads, dtype=dtype), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(num_v_heads, dtype=dtype), requires_grad=False)
        self.norm = _Params(weight=(head_v_dim,))
        self.out_proj = ReplicatedLinear(self.value_dim, hidden_size, bias=False,
                                         prefix=f"{prefix}.out_proj")

    def state_spec(self, block_size: int) -> MambaSpec:
        return MambaSpec(block_size, (self.conv_dim, self.conv_kernel - 1),
                         (self.hv, self.dk, self.dv), self.conv_dtype, self.ssm_dtype)

    def _reorder(self, qkvz: torch.Tensor, ba: torch.Tensor):
        """Per key head [q, k, v (r heads), z (r heads)] and [b (r), a (r)] ->
        ([q | k | v] flat, [z | b | a] flat)."""
        lead = qkvz.shape[:-1]
        r = self.hv // self.hk
        g = qkvz.view(*lead, self.hk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = g.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        b, a = ba.view(*lead, self.hk, 2 * r).split([r, r], dim=-1)
        flat = lambda t: t.reshape(*lead, -1)  # noqa: E731
        return (torch.cat([flat(q), flat(k), flat(v)], dim=-1),
                torch.cat([flat(z), flat(b), flat(a)], dim=-1))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.split_projections:
            qkv = self.in_proj_qkv(hidden_states)
            zba = torch.cat([self.in_proj_z(hidden_states), self.in_proj_b(hidden_states),
                             self.in_proj_a(hidden_states)], dim=-1)
        else:
            qkv, zba = self._reorder(self.in_proj_qkvz(hidden_states),
                                     self.in_proj_ba(hidden_states))
        md = get_state_metadata()
        if md is None:
            y = self._sequences(qkv[None], zba[None], None, None, None)[0][0]
        elif md.padded:
            y = self._padded(qkv, zba, md)
        else:
            y = self._flat(qkv, zba, md)
        return self.out_proj(y.to(hidden_states.dtype))

    def _prepare(self, qkv: torch.Tensor, zba: torch.Tensor):
        """Conv output [..., conv_dim] and [..., z | b | a] -> q, k, v, z per value head,
        g, beta per value head."""
        lead = qkv.shape[:-1]
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        r = self.hv // self.hk
        q = q.reshape(*lead, self.hk, self.dk).repeat_interleave(r, dim=-2).float()
        k = k.reshape(*lead, self.hk, self.dk).repeat_interleave(r, dim=-2).float()
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * self.dk ** -0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        v = v.reshape(*lead, self.hv, self.dv)
        z, b, a = zba.split([self.value_dim, self.hv, self.hv], dim=-1)
        beta = torch.sigmoid(b.float())
        g = -torch.exp(self.A_log.float()) * F.softplus(a.float() + self.dt_bias.float())
        return q, k, v, z.reshape(*lead, self.hv, self.dv), g, beta

    def _gate(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """weight * rmsnorm(o) * silu(z) per value head, flattened."""
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        o = self.norm.weight.float() * o * F.silu(z.float())
        return o.reshape(*o.shape[:-2], self.value_dim)

    def _sequences(self, qkv: torch.Tensor, zba: torch.Tensor, conv0: Optional[torch.Tensor],
                   ssm0: Optional[torch.Tensor], lengths: Optional[torch.Tensor]):
        b, t = qkv.shape[:2]
        if conv0 is None:
            conv0 = qkv.new_zeros(b, self.conv_dim, self.conv_kernel - 1)
        if ssm0 is None:
            ssm0 = torch.zeros(b, self.hv, self.dk, self.dv, dtype=torch.float32,
                               device=qkv.device)
        conv_out, conv1 = self._op("causal_conv1d")(qkv, self.conv_weight, None, conv0,
                                                    lengths)
        q, k, v, z, g, beta = self._prepare(conv_out, zba)
        if lengths is not None:
            valid = (torch.arange(t, device=qkv.device).view(1, t)
                     < lengths.view(b, 1)).unsqueeze(-1)
            g, beta = g * valid, beta * valid
        o, ssm1 = self._op("gated_delta_rule_chunked")(q, k, v, g, beta, ssm0,
                                                       self.chunk_size)
        return self._gate(o, z), conv1, ssm1

    def _step(self, qkv: torch.Tensor, zba: torch.Tensor, conv0: torch.Tensor,
              ssm0: torch.Tensor, slots: Optional[torch.Tensor] = None):
        conv_out, conv1 = self._op("causal_conv1d_step")(qkv, self.conv_weight, None, conv0,
                                                         slots)
        q, k, v, z, g, beta = self._prepare(conv_out, zba)
        o, ssm1 = self._op("gated_delta_rule_step")(q, k, v, g, beta, ssm0, slots)
        return self._gate(o, z), conv1, ssm1
