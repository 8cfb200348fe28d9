"""Gemma's variants of the shared layers: (1 + w) RMSNorm and the tanh-GELU gated MLP
activation. Plain torch on every platform (they are not on any hot native path)."""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn


class GemmaRMSNorm(nn.Module):
    """RMSNorm whose weight is stored as an offset from 1: `norm(x) * (1 + w)`.

    Computed in float32 and rounded once at the end, as HF Gemma does (Llama's norm
    rounds before the weight multiply). `forward(x, residual)` first adds the
    residual in the model dtype and returns `(norm, sum)`, like `RMSNorm`.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6,
                 params_dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size, dtype=params_dtype or
                                               torch.get_default_dtype()), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if residual is not None:
            x = x + residual
            residual = x
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = (out * (1.0 + self.weight.float())).to(x.dtype)
        return out if residual is None else (out, residual)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}"


class GeluAndMul(nn.Module):
    """x = [gate | up] -> gelu(gate) * up; `approximate="tanh"` is HF's
    `gelu_pytorch_tanh` (Gemma's `hidden_activation`)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}.")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]


def gelu_and_mul_for(act: str) -> GeluAndMul:
    """The gated activation of an HF activation name (Gemma checkpoints use the tanh GELU)."""
    if act == "gelu_pytorch_tanh":
        return GeluAndMul("tanh")
    if act == "gelu":
        return GeluAndMul("none")
    raise ValueError(f"hidden activation {act!r} is not supported for Gemma models.")
