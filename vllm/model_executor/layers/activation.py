"""Gated activations of the MLP blocks."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """SwiGLU: x = [gate | up] on the last dim -> silu(gate) * up (half the width).

    The product is taken in place in silu's fresh output: one temporary, not two.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]).mul_(x[..., d:])
