"""Triton kernels of the layers' elementwise ops on CUDA: RMSNorm (with the residual
add), SiLU-and-mul and the rotary embedding of queries and keys.

Each replaces several torch kernels per layer with one. At batch 1 a decode step of a
~1B Llama ran 324 kernels on an H200, a fifth of its GPU time in elementwise ops of a
few microseconds each (benchmarks/README.md, "CUDA"), and every kernel is also a node
the CUDA graph launch walks on the host.

Roundings follow the torch ops they replace (`forward_native` of each layer), so the
results equal them in float32 and stay within one rounding in bfloat16/float16:
- RMSNorm: the residual sum rounded to the activation dtype (torch's add), the norm in
  float32, `x * rstd` rounded, then times the weight, rounded (transformers' order);
- SiLU-and-mul: silu(gate) rounded, then the product rounded (torch's two ops);
- rotary: `x * cos` rounded, then `+ x_pair * (+-sin)` rounded once (torch's addcmul),
  with the cos/sin of the layer's `cos_sin_cache` (already in the activation dtype).

Compiled per device by `TritonKernel` (vllm/attention/ops/triton_reshape_and_cache.py):
`triton.jit` for CUDA tensors, the interpreter for CPU tensors (the tests). No helper
functions, for the reason given there.
"""
from __future__ import annotations

from typing import Optional

import torch

from vllm.attention.ops.triton_reshape_and_cache import (HAS_TRITON, TritonKernel,
                                                         require_triton, tl, triton)


def _rms_norm_kernel(
    X, RES, W, OUT,
    stride_x, stride_r, stride_o,
    hidden, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per row: OUT = rms_norm(X (+ RES)) * W; with RES, RES becomes the
    sum (in place, as vLLM's fused_add_rms_norm)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RES:
        r = tl.load(RES + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(RES + row * stride_r + cols, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / hidden + eps)
    normed = (xf * rstd).to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (normed * w).to(OUT.dtype.element_ty), mask=ok)


def _silu_and_mul_kernel(
    X, OUT, stride_x, stride_o, d,
    BLOCK: tl.constexpr,
):
    """Program (row, block of BLOCK columns): OUT = silu(X[:, :d]) * X[:, d:]."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < d
    gate = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + d + cols, mask=ok, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (act * up).to(OUT.dtype.element_ty), mask=ok)


def _rotary_kernel(
    POS, CACHE, Q, K,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_cache,
    num_q_heads, rot_dim,
    NEOX: tl.constexpr, HALF_PAD: tl.constexpr,
):
    """Program (token, head of q then of k): rotates the first rot_dim elements of the
    head in place. Each program owns its head, so it reads the pairs before writing."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    half = rot_dim // 2
    j = tl.arange(0, HALF_PAD)
    ok = j < half
    pos = tl.load(POS + t).to(tl.int64)
    cos = tl.load(CACHE + pos * stride_cache + j, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(CACHE + pos * stride_cache + half + j, mask=ok, other=0.0).to(tl.float32)
    if NEOX:
        first, second = j, j + half
    else:
        first, second = 2 * j, 2 * j + 1
    if h < num_q_heads:
        base = Q + t * stride_q_t + h * stride_q_h
    else:
        base = K + t * stride_k_t + (h - num_q_heads) * stride_k_h
    x1 = tl.load(base + first, mask=ok, other=0.0)
    x2 = tl.load(base + second, mask=ok, other=0.0)
    a1 = (x1.to(tl.float32) * cos).to(x1.dtype).to(tl.float32)
    a2 = (x2.to(tl.float32) * cos).to(x1.dtype).to(tl.float32)
    tl.store(base + first, (a1 - x2.to(tl.float32) * sin).to(x1.dtype), mask=ok)
    tl.store(base + second, (a2 + x1.to(tl.float32) * sin).to(x1.dtype), mask=ok)


if HAS_TRITON:
    _RMS_NORM = TritonKernel(_rms_norm_kernel)
    _SILU_AND_MUL = TritonKernel(_silu_and_mul_kernel)
    _ROTARY = TritonKernel(_rotary_kernel)


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """rms_norm(x + residual) * weight for rows `x` [T, hidden]. With `residual`, it
    becomes x + residual and the result is written over `x` (both in place; callers
    pass tensors they own), as the CPU kernel does; else a new tensor."""
    require_triton("rms_norm")
    rows, hidden = x.shape
    out = x if residual is not None else torch.empty_like(x)
    if rows == 0:
        return out
    block = triton.next_power_of_2(hidden)
    res = residual if residual is not None else x
    _RMS_NORM.on(x.device)[(rows,)](
        x, res, weight, out, x.stride(0), res.stride(0), out.stride(0), hidden, float(eps),
        HAS_RES=residual is not None, BLOCK=block, num_warps=_warps(block))
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[:, :d]) * x[:, d:] for rows `x` [T, 2d]."""
    require_triton("silu_and_mul")
    rows, width = x.shape
    d = width // 2
    out = torch.empty(rows, d, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(d))
    _SILU_AND_MUL.on(x.device)[(rows, triton.cdiv(d, block))](
        x, out, x.stride(0), out.stride(0), d, BLOCK=block, num_warps=_warps(block))
    return out


def rotary_qk_(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
               cos_sin_cache: torch.Tensor, rot_dim: int, is_neox_style: bool) -> None:
    """Rotate `query` [T, Hq, D] and `key` [T, Hk, D] in place at `positions` [T],
    the first `rot_dim` elements of each head; `cos_sin_cache` rows are
    `[cos | sin]` of rot_dim / 2 each."""
    require_triton("rotary_qk_")
    tokens, num_q, _ = query.shape
    num_k = key.shape[1]
    if tokens == 0:
        return
    _ROTARY.on(query.device)[(tokens, num_q + num_k)](
        positions, cos_sin_cache, query, key, query.stride(0), query.stride(1),
        key.stride(0), key.stride(1), cos_sin_cache.stride(0), num_q, rot_dim,
        NEOX=is_neox_style, HALF_PAD=max(16, triton.next_power_of_2(rot_dim // 2)),
        num_warps=1)
