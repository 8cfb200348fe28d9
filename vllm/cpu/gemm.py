"""bf16 matmuls on CPU with weights packed once, after loading, for a fast kernel.

`F.linear` on a bf16 CPU tensor hands the plain `[out, in]` weight to oneDNN, which
re-blocks it on every call: at decode batch sizes (a few rows) that reorder costs as
much as the product itself. So each linear weight is packed once, for the kernels that
gemm_autotune.py measured to be the fastest on this CPU for its shape at some row count:

- the native kernel's layout (vllm/cpu): k-pairs of 16 output features per vector,
  the operand layout of VDPBF16PS on AVX512-BF16 CPUs; AVX2 CPUs widen the same pairs
  to float32 in registers. It streams the weight once per step: the winner at decode
  sizes, and at every size on CPUs without AMX. The same tensor is the right-hand
  operand of AMX tiles (`amx`), the winner on AMX CPUs from a few rows up to tens;
- oneDNN's blocked layout (`mkldnn._reorder_linear_weight`), whose packed kernel uses
  AMX where the CPU has it (2-3x the native kernel from ~16 rows up on such CPUs);
- a float32 copy (`fp32`), for AVX2-only CPUs where oneDNN has no bf16 kernel and
  torch's own bf16 matmul is a scalar loop (the copy doubles that weight's memory, so
  it is made only where the measurement chose it, or as the fallback there);
- none: `F.linear` on the plain weight.

Each call then goes to its row count's winner (`GemmPlan`). The packs are plain
attributes (`gemm_packs`: kind -> tensor, and `gemm_plan`) next to the parameter, so
`state_dict`, `.to()` and weight loading still see the ordinary weight. Reloading
weights must drop the packs first (`drop_packed_weights`): a pack is a copy.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.model_executor.kernels import torch_linear
from vllm.cpu import gemm_autotune
from vllm.cpu.gemm_autotune import AMX, FP32, NATIVE, ONEDNN, SHARED_LAYOUT, TORCH, GemmPlan
from vllm.cpu import cpu_ops

logger = logging.getLogger(__name__)

PACKS_ATTR = "gemm_packs"
PLAN_ATTR = "gemm_plan"


def packing_supported(weight: torch.Tensor) -> bool:
    """A 2-D bf16 CPU weight, with oneDNN available in this torch build."""
    return (weight.dim() == 2 and weight.device.type == "cpu"
            and weight.dtype == torch.bfloat16 and not weight.requires_grad
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_module(module: nn.Module, plan: GemmPlan) -> GemmPlan:
    """Attach the packs `plan` needs to `module`; returns the plan actually used (a
    kind whose pack cannot be made, e.g. the native one for an odd K, becomes oneDNN,
    or plain torch where oneDNN has no bf16 kernel)."""
    weight = module.weight.detach()
    packs, by_layout = {}, {}
    for kind in sorted(plan.needed - {TORCH}):
        layout = SHARED_LAYOUT.get(kind, kind)
        packed = by_layout.get(layout)
        if packed is None:
            packed = by_layout[layout] = gemm_autotune.pack(kind, weight)
        if packed is None:
            fallback = NATIVE if kind == AMX else gemm_autotune.fallback_kind()
            plan = GemmPlan(tuple(fallback if k == kind else k for k in plan.kinds))
            continue
        packs[kind] = packed
    for kind in plan.needed - {TORCH} - set(packs):  # the fallback's pack
        packs[kind] = gemm_autotune.pack(kind, weight)
    module.__dict__[PACKS_ATTR] = packs
    module.__dict__[PLAN_ATTR] = plan
    return plan


def pack_linear_weights(model: nn.Module) -> int:
    """Pack the weight of every module marked `packable_weight = True` for the kernels
    chosen for its shape; returns how many were packed."""
    modules = [m for m in model.modules()
               if getattr(m, "packable_weight", False)
               and packing_supported(getattr(m, "weight", torch.empty(0)))]
    if not modules:
        return 0
    shapes: dict[tuple[int, int], torch.Tensor] = {}
    for m in modules:
        shapes.setdefault(tuple(m.weight.shape), m.weight.detach())
    plans = gemm_autotune.plan_shapes(shapes)
    kinds = set()
    for m in modules:
        kinds |= pack_module(m, plans[tuple(m.weight.shape)]).needed
    logger.info("Packed %d bf16 linear weights for the %s kernel(s)", len(modules),
                "/".join(sorted(kinds)))
    return len(modules)


def native_pack(module: nn.Module) -> Optional[torch.Tensor]:
    """The module's weight in the native kernel's layout (which AMX shares), if it was
    packed for it."""
    packs = module.__dict__.get(PACKS_ATTR)
    if packs is None:
        return None
    return packs[NATIVE] if NATIVE in packs else packs.get(AMX)


def plan_of(module: nn.Module) -> Optional[GemmPlan]:
    return module.__dict__.get(PLAN_ATTR)


def drop_packed_weights(model: nn.Module) -> None:
    """Forget all packed copies (before the weights change)."""
    for module in model.modules():
        for attr in (PACKS_ATTR, PLAN_ATTR):
            if attr in module.__dict__:
                delattr(module, attr)


def linear(module: nn.Module, x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the kernel chosen for this many rows
    (with VLLM_BATCH_INVARIANT=1 and no native plan: in fixed row tiles)."""
    plan = module.__dict__.get(PLAN_ATTR)
    if plan is None or x.dtype != torch.bfloat16 or x.device.type != "cpu":
        return torch_linear(module, x, weight, bias)
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    kind = plan.kind_for(rows)
    if kind == TORCH or rows == 0:
        return torch_linear(module, x, weight, bias)
    packed = module.__dict__[PACKS_ATTR][kind]
    if kind in (NATIVE, AMX):  # one pack, two kernels
        x2 = x.reshape(rows, k)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        gemm = cpu_ops.gemm_bf16_packed if kind == NATIVE else cpu_ops.gemm_bf16_amx
        out = gemm(x2, packed, weight.shape[0], bias)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], weight.shape[0])
    if kind == FP32:
        return gemm_autotune.run(FP32, x, weight, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
