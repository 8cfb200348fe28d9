"""bf16 matmuls on CPU with weights pre-packed once into oneDNN's blocked layout.

`F.linear` on a bf16 CPU tensor hands the plain `[out, in]` weight to oneDNN, which
re-blocks it on every call: at decode batch sizes (a few rows) that reorder costs as
much as the product itself. Packing each weight once after loading and calling the
packed kernel instead gives the same numbers (bit for bit: the same oneDNN
kernel runs) at 1.3-2x the speed for 1-16 rows; large prefill batches are unchanged.

The packed copy is a plain attribute (`packed_weight`) next to the parameter, so
`state_dict`, `.to()` and weight loading still see the ordinary weight. Reloading
weights must drop the packs first (`drop_packed_weights`), since a pack is a copy.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.native import cpu_ops

logger = logging.getLogger(__name__)

PACKED_ATTR = "packed_weight"


def packing_supported(weight: torch.Tensor) -> bool:
    """A 2-D bf16 CPU weight, with oneDNN available in this torch build."""
    return (weight.dim() == 2 and weight.device.type == "cpu"
            and weight.dtype == torch.bfloat16 and not weight.requires_grad
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_module(module: nn.Module) -> bool:
    """Attach a packed copy of `module.weight`; False if this weight cannot be packed."""
    weight = getattr(module, "weight", None)
    if weight is None or not packing_supported(weight):
        return False
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    setattr(module, PACKED_ATTR, packed)
    return True


def pack_linear_weights(model: nn.Module) -> int:
    """Pack the weight of every module marked `packable_weight = True`; returns how many."""
    count = 0
    for module in model.modules():
        if getattr(module, "packable_weight", False) and pack_module(module):
            count += 1
    if count:
        logger.debug("Packed %d bf16 linear weights for oneDNN", count)
    return count


def drop_packed_weights(model: nn.Module) -> None:
    """Forget all packed copies (before the weights change)."""
    for module in model.modules():
        if PACKED_ATTR in module.__dict__:
            delattr(module, PACKED_ATTR)


def linear(module: nn.Module, x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the module's packed weight when it has one.

    With 1-3 rows (decode of a small batch) and a packed (so bf16, CPU) weight, the
    native GEMV (vllm/native) reads the plain weight instead: the product is bound by
    reading the weight once, and its single sequential stream per thread reads it
    1.5-2x faster than oneDNN does (measured on 2 AVX512-BF16 cores, 30 Llama layers
    of SmolLM2-135M: 9.6 vs 16 ms at 1 row, ~equal at 4, oneDNN ahead from 8).
    """
    packed = module.__dict__.get(PACKED_ATTR)
    if packed is not None and x.dtype == torch.bfloat16 and x.device.type == "cpu":
        if (x.dim() == 2 and x.shape[0] <= cpu_ops.GEMV_MAX_ROWS and x.stride(-1) == 1
                and cpu_ops.gemv_supported()):
            out = cpu_ops.gemv_bf16(x, weight, bias)
            if out is not None:
                return out
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)
