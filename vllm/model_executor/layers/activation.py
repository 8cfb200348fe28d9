"""Gated activations of the MLP blocks."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.model_executor.custom_op import CustomOp


@CustomOp.register("silu_and_mul")
class SiluAndMul(CustomOp):
    """SwiGLU: x = [gate | up] on the last dim -> silu(gate) * up (half the width).

    On CPU in float32/bf16 a native kernel does both in one pass (vllm/cpu/ops.py);
    elsewhere (HPU included: Gaudi's graph compiler fuses the two ops itself) the
    product is taken in place in silu's fresh output.
    """

    def __init__(self) -> None:
        super().__init__()

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]).mul_(x[..., d:])
