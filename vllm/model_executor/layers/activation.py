"""Gated activations of the MLP blocks."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.model_executor.custom_op import CustomOp
from vllm.native import cpu_ops


@CustomOp.register("silu_and_mul")
class SiluAndMul(CustomOp):
    """SwiGLU: x = [gate | up] on the last dim -> silu(gate) * up (half the width).

    On CPU in float32/bf16 a native kernel does both in one pass (vllm/native);
    elsewhere (HPU included: Gaudi's graph compiler fuses the two ops itself) the
    product is taken in place in silu's fresh output.
    """

    def __init__(self) -> None:
        super().__init__()

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]).mul_(x[..., d:])

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dim() == 2 and x.stride(-1) == 1 and cpu_ops.supports(x.dtype)
                and not x.requires_grad):
            return cpu_ops.silu_and_mul(x)
        return self.forward_native(x)
