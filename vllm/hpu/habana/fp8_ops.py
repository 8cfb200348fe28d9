"""Stand-ins for the Gaudi fp8 and int4 ops the quantized linear layers call.

On Gaudi these are `torch.ops.hpu.cast_to_fp8_v2`, `torch.ops.hpu.fp8_gemm_v2`,
`torch.ops.hpu.cast_from_fp8` and `torch.ops.hpu.convert_from_uint4`. Off hardware
each one is emulated with float8 casts and float32 math so the numbers are the ones
the hardware computes up to the summation order: every fp8 value is exact in
float32 and the product of two fp8 values is exact in float32.

Scale conventions (as the Gaudi ops): `cast_to_fp8_v2(x, scale)` stores
`x * scale` (scale = 1 / dequantization scale); `fp8_gemm_v2` multiplies the
product by `A_scale_inv * B_scale_inv` (the dequantization scales). A scale is a
tensor (a runtime input of the graph) or a Python float (Gaudi's `.scalar`
overloads: a constant compiled into the graph); None skips the multiply.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)

Scale = Optional[Union[torch.Tensor, float]]


def _factor(scale: Union[torch.Tensor, float]) -> Union[torch.Tensor, float]:
    return scale.float() if isinstance(scale, torch.Tensor) else float(scale)


def cast_to_fp8_v2(x: torch.Tensor, scale: Scale = None,
                   stochastic_rounding: bool = False, is_amax: bool = False,
                   dtype: torch.dtype = torch.float8_e4m3fn
                   ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(x * scale saturated and rounded to fp8, amax of x if is_amax)."""
    if stochastic_rounding:
        raise ValueError("stochastic_rounding is not emulated off Gaudi.")
    xf = x.float() if scale is None else x.float() * _factor(scale)
    fmax = float(torch.finfo(dtype).max)
    out = xf.clamp(-fmax, fmax).to(dtype)
    return out, (x.abs().amax().float() if is_amax else None)


def cast_from_fp8(x: torch.Tensor, scale: Scale,
                  out_dtype: torch.dtype) -> torch.Tensor:
    xf = x.float() if scale is None else x.float() * _factor(scale)
    return xf.to(out_dtype)


def fp8_gemm_v2(A: torch.Tensor, trans_A: bool, B: torch.Tensor, trans_B: bool,
                D: Optional[torch.Tensor], out_dtype: torch.dtype,
                A_scale_inv: Scale = None, B_scale_inv: Scale = None,
                bias: Optional[torch.Tensor] = None, accumulate: bool = False) -> torch.Tensor:
    """op(A) @ op(B) * A_scale_inv * B_scale_inv (+ bias), in float32, cast to out_dtype.

    Scales may be scalars, per-row of op(A) ([M, 1]) or per-column of op(B) ([1, N] /
    [N]).
    """
    a = A.float().t() if trans_A else A.float()
    b = B.float().t() if trans_B else B.float()
    out = a @ b
    if A_scale_inv is not None:
        out = out * _factor(A_scale_inv)
    if B_scale_inv is not None:
        b_scale = _factor(B_scale_inv)
        out = out * (b_scale.reshape(1, -1) if isinstance(b_scale, torch.Tensor) else b_scale)
    if bias is not None:
        out = out + bias.float()
    if accumulate and D is not None:
        out = out + D.float()
    return out.to(out_dtype)


def convert_from_uint4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                       out_dtype: torch.dtype) -> torch.Tensor:
    """Dequantize int4 weights packed 8 per int32 along the input dimension.

    qweight [K/8, N] int32 (element k of a word in bits 4k..4k+3), scales and zeros
    [K/g, N] (zeros as plain integers): W[k, n] = (q - zero) * scale of k's group.
    Returns W [K, N] in out_dtype.
    """
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    q = (qweight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF   # [K/8, 8, N]
    q = q.reshape(-1, qweight.shape[1]).float()
    group = q.shape[0] // scales.shape[0]
    w = (q - zeros.float().repeat_interleave(group, 0)) * scales.float().repeat_interleave(
        group, 0)
    return w.to(out_dtype)
