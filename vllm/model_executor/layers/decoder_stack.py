"""A model's decoder layers as one op, so a platform can run a whole decode step of
them as one kernel call per layer.

At decode batch sizes a layer's arithmetic takes well under a millisecond and the
Python around it (a dozen module calls) becomes a third of the step. The CPU binds a
native layer call to this op (vllm/cpu/fused_decode.py, through
`CustomOp.register_forward` like every platform kernel); other platforms have none,
and `forward_native` declines every step.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from vllm.model_executor.custom_op import CustomOp


@CustomOp.register("fused_decode_layers")
class DecoderStack(CustomOp):
    """`forward(positions, hidden, residual)` runs all `layers` and returns (hidden,
    residual), or returns None when this step or these layers do not fit the
    platform's fused form (prefills in the step, weights it cannot read, ...): the
    model then calls its modules. The result must equal the module path's."""

    def __init__(self, layers: list[Any]) -> None:
        super().__init__()
        # A plain list: the layers stay the model's own submodules, not this op's.
        self.layers = list(layers)
        self.state: dict[str, Any] = {}
        """Whatever the bound forward keeps between steps (its prepared layer calls)."""

    def forward_native(self, positions: torch.Tensor, hidden: torch.Tensor,
                       residual: Optional[torch.Tensor]) -> None:
        return None
