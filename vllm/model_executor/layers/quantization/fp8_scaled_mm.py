"""The fp8 GEMM on Ada / Hopper GPUs through `torch._scaled_mm` (one fp8 tensor-core
GEMM, no dequantized weight copy).

Why: dequantizing the fp8 weight to bf16 each call (the portable path in
fp8_utils.py) reads the weight twice and writes it once, so on an H100 fp8 ran
slower than bf16. `torch._scaled_mm` multiplies the fp8 operands directly and
applies the scales in its fp32 epilogue.

What torch's CUDA `_scaled_mm` accepts (aten ScaledBlas.cpp), and so what the plan
checks once per layer at load time:
- compute capability >= 8.9 (Ada, Hopper and later);
- mat1 [M, K] row-major, mat2 [K, N] column-major (the fp8 weight [N, K] contiguous,
  transposed), K and N multiples of 16; M is free (no padding needed);
- scales float32: both one element (tensor-wise), or `scale_a [M, 1]` with
  `scale_b [1, N]` (row-wise). Row-wise runs on cuBLAS >= 12.9 or torch's CUTLASS
  kernel, which torch builds for Hopper; on Ada the row-wise product is run
  unfused (tensor-wise GEMM with unit scales into float32, then the scales);
- a bias must have the output dtype, and only bf16 / fp16 outputs take one (a
  float32 output gets its bias added after the GEMM).
Anything else (older GPU, K or N not a multiple of 16, non-fp8 weight) keeps the
dequantize path.

Weight scales are stored per output channel [N]; a per-tensor checkpoint scale is
expanded per merged part. When every channel holds the same value (one part, or
parts that share a scale) the plan records it and the GEMM runs tensor-wise with a
static activation scale, which is the cheapest cuBLAS mode.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

logger = logging.getLogger(__name__)

SCALED_MM_MIN_CAPABILITY = (8, 9)
"""Ada: the first NVIDIA architecture with fp8 tensor cores."""
ROWWISE_MIN_CAPABILITY = (9, 0)
"""Hopper: where torch's fused row-wise scaled GEMM is built."""
_ALIGNMENT = 16
_FP8_WEIGHT_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True)
class Fp8GemmPlan:
    """How one fp8 linear layer multiplies, decided once when its weights are final.

    `use_scaled_mm` False keeps the dequantize path. `per_tensor_weight`: every
    channel's scale is equal (the scalar is `weight_scale[0]`). `rowwise`: fused
    row-wise scales are available (else a row-wise product runs unfused).
    `device`: the weight's device when planned (a moved weight is planned again).
    """
    use_scaled_mm: bool
    per_tensor_weight: bool = False
    rowwise: bool = False
    device: Optional[torch.device] = None
    reason: str = ""


DEQUANT_PLAN = Fp8GemmPlan(use_scaled_mm=False, reason="not a CUDA device")


def device_capability(device: torch.device) -> Optional[tuple[int, int]]:
    """(major, minor) of a CUDA device; None for any other device."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def scaled_mm_supported(capability: Optional[tuple[int, int]], k: int, n: int) -> bool:
    """Whether `_scaled_mm` takes an [M, K] x [K, N] fp8 product on this GPU."""
    return (capability is not None and tuple(capability) >= SCALED_MM_MIN_CAPABILITY
            and k % _ALIGNMENT == 0 and n % _ALIGNMENT == 0)


def plan_fp8_gemm(capability: Optional[tuple[int, int]], w_q: torch.Tensor,
                  w_scale: torch.Tensor) -> Fp8GemmPlan:
    """The layer's plan from the GPU's capability (None: not CUDA) and its final
    weight [N, K] and scale ([N] or one element)."""
    n, k = w_q.shape
    device = w_q.device
    if w_q.dtype != _FP8_WEIGHT_DTYPE:
        return Fp8GemmPlan(False, device=device, reason=f"weight dtype {w_q.dtype}")
    if not scaled_mm_supported(capability, k, n):
        why = (f"capability {capability}" if capability is None
               or tuple(capability) < SCALED_MM_MIN_CAPABILITY
               else f"K={k} or N={n} not a multiple of {_ALIGNMENT}")
        return Fp8GemmPlan(False, device=device, reason=why)
    per_tensor = w_scale.numel() == 1 or bool((w_scale == w_scale.reshape(-1)[0]).all())
    rowwise = tuple(capability) >= ROWWISE_MIN_CAPABILITY
    return Fp8GemmPlan(True, per_tensor, rowwise, device, "scaled_mm")


def scaled_mm_fp8_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor,
                       w_scale: torch.Tensor, bias: Optional[torch.Tensor],
                       out_dtype: torch.dtype, plan: Fp8GemmPlan) -> torch.Tensor:
    """(x_q [M, K] @ w_q [N, K]^T) * x_scale * w_scale (+ bias) in `out_dtype`.

    x_scale is [M, 1] (per token) or one element (static); w_scale [N] or one
    element. A pure function of tensors (any device where `_scaled_mm` runs, CPU
    included), so the CUDA path's arithmetic is testable without a GPU.
    """
    w_t = w_q.t()
    m, n = x_q.shape[0], w_q.shape[0]
    if x_scale.numel() == 1 and plan.per_tensor_weight:
        return _tensorwise(x_q, w_t, x_scale.reshape(()).float(),
                           w_scale.reshape(-1)[0].float(), bias, out_dtype)
    if plan.rowwise and out_dtype == torch.bfloat16:
        scale_a = x_scale.float().reshape(-1, 1).expand(m, 1).contiguous()
        scale_b = w_scale.float().reshape(-1).expand(n).reshape(1, n).contiguous()
        return torch._scaled_mm(x_q, w_t, scale_a=scale_a, scale_b=scale_b,
                                bias=_bias_for(bias, out_dtype), out_dtype=out_dtype)
    return _unfused(x_q, w_t, x_scale, w_scale, bias, out_dtype)


def _tensorwise(x_q: torch.Tensor, w_t: torch.Tensor, scale_a: torch.Tensor,
                scale_b: torch.Tensor, bias: Optional[torch.Tensor],
                out_dtype: torch.dtype) -> torch.Tensor:
    fused_bias = _bias_for(bias, out_dtype)
    out = torch._scaled_mm(x_q, w_t, scale_a=scale_a, scale_b=scale_b, bias=fused_bias,
                           out_dtype=out_dtype)
    if bias is not None and fused_bias is None:
        out = (out.float() + bias.float()).to(out_dtype)
    return out


def _unfused(x_q: torch.Tensor, w_t: torch.Tensor, x_scale: torch.Tensor,
             w_scale: torch.Tensor, bias: Optional[torch.Tensor],
             out_dtype: torch.dtype) -> torch.Tensor:
    """Row-wise scales without the fused kernel: the unscaled product in float32 (exact
    fp8 products, fp32 sums), then the scales, as the dequantize path does."""
    one = torch.ones((), dtype=torch.float32, device=x_q.device)
    out = torch._scaled_mm(x_q, w_t, scale_a=one, scale_b=one, out_dtype=torch.float32)
    out = out * x_scale.float().reshape(-1, 1) * w_scale.float().reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def _bias_for(bias: Optional[torch.Tensor], out_dtype: torch.dtype
              ) -> Optional[torch.Tensor]:
    """The bias as `_scaled_mm` takes it (the output's dtype, bf16 / fp16 outputs
    only); None when it must be added after the GEMM instead."""
    if bias is None or out_dtype not in (torch.bfloat16, torch.float16):
        return None
    return bias.to(out_dtype)
