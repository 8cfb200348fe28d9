"""RMSNorm, optionally fused with the residual add that precedes it."""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.custom_op import CustomOp


@CustomOp.register("rms_norm")
class RMSNorm(CustomOp):
    """Root-mean-square layer norm, statistics in float32 as HF Llama/Qwen compute them.

    `forward(x)` returns the normalized `x`. `forward(x, residual)` first forms
    `x + residual` (in the model dtype), normalizes that sum and also returns it
    as the new residual: decoder layers chain these without keeping a separate
    add, which is the layout vLLM's fused kernels expect.

    Per platform (chosen once, see CustomOp):
    - CPU: in float32/bf16 both forms run as one native kernel that computes HF's
      formula with HF's roundings; the residual form then works in place as vLLM's
      `fused_add_rms_norm` does (vllm/cpu/ops.py).
    - HPU: Gaudi's `FusedRMSNorm` kernel after the add (vllm/hpu/ops.py).
    - CUDA: one Triton kernel for the add and the norm, HF's roundings, the residual
      form in place as on CPU (vllm/cuda/ops.py).
    - elsewhere: `F.rms_norm`, one call instead of eight elementwise ops; in bf16 it
      rounds once at the end where HF rounds before the weight multiply.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6,
                 params_dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype or
                                              torch.get_default_dtype()), requires_grad=False)

    def forward_native(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
                       ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if residual is not None:
            x = x + residual
            residual = x
        out = F.rms_norm(x, (self.hidden_size,), self.weight, self.variance_epsilon)
        return out if residual is None else (out, residual)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}"
