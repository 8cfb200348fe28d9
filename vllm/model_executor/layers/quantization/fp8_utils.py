"""FP8 (float8_e4m3fn) quantization and the fp8 linear product, per platform.

Weights are stored as fp8 with a float32 scale per output channel (a per-tensor
scale is stored expanded to every channel of its part, which is exact and lets
merged q/k/v parts keep their own scales). Activations are quantized per token at
run time (dynamic) or with one checkpoint scale (static). The product is
`(x_q @ w_q^T) * x_scale * w_scale`, which every path computes with fp32
accumulation; fp8 values and their pairwise products are exact in float32, so
the paths differ only in summation order and the final rounding. The product is the
platform's `fp8_gemm` kernel (model_executor/kernels.py), bound by each backend:

CPU (vllm/cpu/ops.py): `torch._scaled_mm` exists on CPU in this torch, but measured 10-30x slower than
the bf16 GEMM at decode sizes (it converts through oneDNN each call). So on CPU, up
to 8 rows (decode) go through the native fp8 kernel (vllm/cpu/quant_ops.cpp:
fp8 weights widened to float32 in registers, reading 1 byte a weight); more rows
(prefill), or without the native library, convert the fp8 weight to the activation
dtype (exact: every fp8 value is a bf16 value) and run the ordinary GEMM.
HPU (vllm/hpu/ops.py): the shim's `cast_to_fp8_v2` / `fp8_gemm_v2` (Gaudi's ops; emulated off it).
CUDA >= 8.9 (Ada, Hopper): `torch._scaled_mm` (fp8_scaled_mm.py), chosen per layer
when its weights are final (`Fp8GemmPlan`); older GPUs and shapes it does not take
dequantize (the kernel table's torch default).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from vllm.model_executor.kernels import kernel

from vllm.model_executor.layers.quantization.fp8_scaled_mm import (Fp8GemmPlan,
                                                                   scaled_mm_fp8_gemm)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)
_MIN_SCALE = 1e-12


def scaled_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale, saturated to the fp8 range and rounded to fp8."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q, scale [M, 1]): each row scaled so its largest magnitude maps to FP8_MAX."""
    scale = (x.abs().amax(-1, keepdim=True).float() / FP8_MAX).clamp(min=_MIN_SCALE)
    return scaled_fp8(x, scale), scale


def quantize_weight(weight: torch.Tensor, per_channel: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_q [N, K] fp8, scale [N] float32) of a float weight [N, K]."""
    w = weight.float()
    amax = w.abs().amax(-1) if per_channel else w.abs().amax().expand(w.shape[0])
    scale = (amax / FP8_MAX).clamp(min=_MIN_SCALE).contiguous()
    return scaled_fp8(w, scale.unsqueeze(1)), scale


def fp8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
               input_scale: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               gemm: Optional[Callable[..., torch.Tensor]] = None,
               plan: Optional[Fp8GemmPlan] = None) -> torch.Tensor:
    """x [.., K] @ dequant(w_q [N, K])^T (+ bias), activations quantized to fp8.

    `plan` (the layer's, see fp8_scaled_mm.py) selects `torch._scaled_mm`; None or a
    dequantize plan keeps the platform's path."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if input_scale is None:
        x_q, x_scale = per_token_fp8(x2)
    else:
        x_scale = input_scale.float().reshape(1, 1)
        x_q = scaled_fp8(x2, x_scale)
    if plan is not None and plan.use_scaled_mm:
        out = scaled_mm_fp8_gemm(x_q, x_scale, w_q, w_scale, bias, x.dtype, plan)
    else:
        out = (gemm or kernel("fp8_gemm"))(x_q, x_scale, w_q, w_scale, bias, x.dtype)
    return out.reshape(*shape[:-1], w_q.shape[0])
