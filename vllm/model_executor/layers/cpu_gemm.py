"""bf16 matmuls on CPU with weights packed once, after loading, for a fast kernel.

`F.linear` on a bf16 CPU tensor hands the plain `[out, in]` weight to oneDNN, which
re-blocks it on every call: at decode batch sizes (a few rows) that reorder costs as
much as the product itself. So each linear weight is packed once, into one of:

- the native kernel's layout (vllm/native, AVX512-BF16 CPUs): k-pairs of 16 output
  features per vector, the operand layout of VDPBF16PS. It streams the weight once
  per step and is 1.3-1.8x faster than oneDNN at decode sizes (1-32 rows), equal at
  prefill sizes (both near the bf16 peak);
- else oneDNN's blocked layout (`mkldnn._reorder_linear_weight`), whose packed kernel
  gives the same numbers as `F.linear` at 1.3-2x its speed for 1-16 rows.

The packed copy is a plain attribute (`packed_weight`, and `packed_kind`) next to the
parameter, so `state_dict`, `.to()` and weight loading still see the ordinary weight.
Reloading weights must drop the packs first (`drop_packed_weights`): a pack is a copy.
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
KIND_ATTR = "packed_kind"
NATIVE, ONEDNN = "native", "onednn"


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
    packed = cpu_ops.pack_bf16(weight.detach())
    kind = NATIVE
    if packed is None:
        packed, kind = torch.ops.mkldnn._reorder_linear_weight(weight.detach()), ONEDNN
    setattr(module, PACKED_ATTR, packed)
    setattr(module, KIND_ATTR, kind)
    return True


def pack_linear_weights(model: nn.Module) -> int:
    """Pack the weight of every module marked `packable_weight = True`; returns how many."""
    count, kinds = 0, set()
    for module in model.modules():
        if getattr(module, "packable_weight", False) and pack_module(module):
            count += 1
            kinds.add(module.__dict__[KIND_ATTR])
    if count:
        logger.info("Packed %d bf16 linear weights for the %s kernel", count,
                    "/".join(sorted(kinds)))
    return count


def drop_packed_weights(model: nn.Module) -> None:
    """Forget all packed copies (before the weights change)."""
    for module in model.modules():
        for attr in (PACKED_ATTR, KIND_ATTR):
            if attr in module.__dict__:
                delattr(module, attr)


def linear(module: nn.Module, x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the module's packed weight when it has one."""
    packed = module.__dict__.get(PACKED_ATTR)
    if packed is not None and x.dtype == torch.bfloat16 and x.device.type == "cpu":
        if module.__dict__[KIND_ATTR] == NATIVE:
            if x.dim() == 2 and x.stride(-1) == 1:
                return cpu_ops.gemm_bf16_packed(x, packed, weight.shape[0], bias)
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)
