"""Gated activations of the MLP blocks."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm.native import cpu_ops


class SiluAndMul(nn.Module):
    """SwiGLU: x = [gate | up] on the last dim -> silu(gate) * up (half the width).

    On CPU in float32/bf16 a native kernel does both in one pass (vllm/native);
    otherwise the product is taken in place in silu's fresh output.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.stride(-1) == 1 and cpu_ops.usable(x) and not x.requires_grad:
            return cpu_ops.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]).mul_(x[..., d:])
