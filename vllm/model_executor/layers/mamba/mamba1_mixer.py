"""The Mamba1 mixer of Jamba (transformers' JambaMambaMixer semantics), on state slots.

in_proj -> [x | z]; x through the causal conv1d (carried conv state) and SiLU; x_proj ->
dt (rank R), B, C, each RMS-normalized (Jamba's dt / b / c layernorms); dt = softplus(
dt_proj(dt)); the selective scan (per channel and state entry, carried SSM state
[intermediate, state]) with D skip; times silu(z); out_proj. Requests find their
states in the runner's slots exactly as for the Mamba2 mixer (whose flat / padded
batching this class reuses). Tensor parallelism is not implemented (TP 1).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.distributed import get_tp_group
from vllm.kv_cache_spec import MambaSpec
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.mamba.mamba2_mixer import Mamba2Mixer, _Params
from vllm.worker.state_cache import get_state_metadata


class Mamba1Mixer(Mamba2Mixer):
    """Reuses Mamba2Mixer's slot handling (`_flat`, `_padded`, `_initial`, `_store`):
    its "xbc" rows are x here and its "dt" rows the gate z."""

    def __init__(self, hidden_size: int, intermediate_size: int, state_size: int,
                 conv_kernel: int, dt_rank: int, eps: float, use_bias: bool = False,
                 use_conv_bias: bool = True,
                 state_dtypes: tuple[torch.dtype, torch.dtype] = (torch.float32,) * 2,
                 prefix: str = "") -> None:
        nn.Module.__init__(self)
        if get_tp_group().world_size > 1:
            raise NotImplementedError("Mamba1 (Jamba) mixers: tensor parallelism is not "
                                      "implemented yet.")
        self.layer_idx = extract_layer_index(prefix) if prefix else 0
        self.state_key = self.layer_idx
        self.intermediate_size, self.state_size = intermediate_size, state_size
        self.conv_kernel, self.dt_rank = conv_kernel, dt_rank
        self.conv_dim = intermediate_size
        self.conv_dtype, self.ssm_dtype = state_dtypes
        self.in_proj = ReplicatedLinear(hidden_size, 2 * intermediate_size, bias=use_bias,
                                        prefix=f"{prefix}.in_proj")
        self.conv1d = _Params(weight=(intermediate_size, 1, conv_kernel),
                              bias=(intermediate_size,) if use_conv_bias else None)
        self.x_proj = ReplicatedLinear(intermediate_size, dt_rank + 2 * state_size,
                                       bias=False, prefix=f"{prefix}.x_proj")
        self.dt_proj = ReplicatedLinear(dt_rank, intermediate_size, bias=True,
                                        prefix=f"{prefix}.dt_proj")
        dtype = torch.get_default_dtype()
        self.A_log = nn.Parameter(torch.zeros(intermediate_size, state_size, dtype=dtype),
                                  requires_grad=False)
        self.D = nn.Parameter(torch.zeros(intermediate_size, dtype=dtype), requires_grad=False)
        self.dt_layernorm = RMSNorm(dt_rank, eps=eps)
        self.b_layernorm = RMSNorm(state_size, eps=eps)
        self.c_layernorm = RMSNorm(state_size, eps=eps)
        self.out_proj = ReplicatedLinear(intermediate_size, hidden_size, bias=use_bias,
                                         prefix=f"{prefix}.out_proj")

    def state_spec(self, block_size: int) -> MambaSpec:
        return MambaSpec(block_size, (self.intermediate_size, self.conv_kernel - 1),
                         (self.intermediate_size, self.state_size),
                         self.conv_dtype, self.ssm_dtype)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x, z = self.in_proj(hidden_states).chunk(2, dim=-1)
        md = get_state_metadata()
        if md is None:
            y = self._sequences(x[None], z[None], None, None, None)[0][0]
        elif md.padded:
            y = self._padded(x, z, md)
        else:
            y = self._flat(x, z, md)
        return self.out_proj(y.to(hidden_states.dtype))

    def _ssm_inputs(self, x: torch.Tensor):
        """dt (softplus'ed, [..., d]), B, C ([..., n]) from the conv output x."""
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.state_size, self.state_size],
                                        dim=-1)
        dt = self.dt_proj(self.dt_layernorm(dt.contiguous()))  # bias inside, then softplus
        return (torch.nn.functional.softplus(dt.float()),
                self.b_layernorm(B.contiguous()), self.c_layernorm(C.contiguous()))

    def _sequences(self, x: torch.Tensor, z: torch.Tensor, conv0: Optional[torch.Tensor],
                   ssm0: Optional[torch.Tensor], lengths: Optional[torch.Tensor]):
        b, t = x.shape[:2]
        if conv0 is None:
            conv0 = x.new_zeros(b, self.conv_dim, self.conv_kernel - 1)
        if ssm0 is None:
            ssm0 = torch.zeros(b, self.intermediate_size, self.state_size,
                               dtype=torch.float32, device=x.device)
        xc, conv1 = self._op("causal_conv1d")(x, self.conv_weight, self.conv_bias, conv0,
                                              lengths)
        dt, B, C = self._ssm_inputs(xc)
        if lengths is not None:
            valid = torch.arange(t, device=x.device).view(1, t) < lengths.view(b, 1)
            dt = dt * valid.unsqueeze(-1)
        y, ssm1 = self._op("selective_scan")(xc, dt, -torch.exp(self.A_log.float()), B, C,
                                             self.D, ssm0)
        return y * torch.nn.functional.silu(z.float()), conv1, ssm1

    def _step(self, x: torch.Tensor, z: torch.Tensor, conv0: torch.Tensor,
              ssm0: torch.Tensor, slots: Optional[torch.Tensor] = None):
        xc, conv1 = self._op("causal_conv1d_step")(x, self.conv_weight, self.conv_bias,
                                                   conv0, slots)
        dt, B, C = self._ssm_inputs(xc)
        y, ssm1 = self._op("selective_step")(xc, dt, -torch.exp(self.A_log.float()), B, C,
                                             self.D, ssm0, slots)
        return y * torch.nn.functional.silu(z.float()), conv1, ssm1
