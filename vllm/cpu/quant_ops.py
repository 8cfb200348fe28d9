"""Tensor-level wrappers of the quantized GEMM kernels (quant_ops.cpp).

A separate library from cpu_ops (same loader, flags and cache) so the quantized
kernels build and change on their own. `None` library (no compiler, disabled with
VLLM_CPU_NATIVE_OPS=0, failed build): callers keep their torch path.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Optional

import torch


logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("quant_ops.cpp")
MAX_ROWS = 8
_i64, _i32, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "vllm_gemm_int4": ((_ptr, _i64, _i64, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _i32),
                       None),
    "vllm_gemm_fp8": ((_ptr, _i64, _i64, _ptr, _i64, _ptr, _i32), None),
    "vllm_int4_linear_bf16": ((_ptr, _ptr, _i64, _i64, _ptr, _i64, _i32), None),
    "vllm_quant_has_avx512": ((), ctypes.c_int),
    "vllm_quant_int8_runs": ((), ctypes.c_int),
}
Int4Ctx = ctypes.c_int64 * 7
"""An int4 layer for `vllm_int4_linear_bf16`: w_q, N, K, scales, zeros, G, bias (bf16)."""


def get_quant_lib() -> Optional[ctypes.CDLL]:
    from vllm.cpu.loader import load_side_library
    return load_side_library(SOURCE, _SIGNATURES,
                             "Native quantized kernels unavailable, dequantizing in torch")


def _rows_ok(x: torch.Tensor) -> bool:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return (x.device.type == "cpu" and 0 < rows <= MAX_ROWS
            and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and get_quant_lib() is not None)


def int4_supported(x: torch.Tensor, group_size: int) -> bool:
    """Whether `gemm_int4` takes these activations and groups (runs of 32 inputs)."""
    return group_size % 32 == 0 and _rows_ok(x)


def int8_activation_runs() -> bool:
    """Whether bf16 rows reach the int4 kernel rounded to int8 runs of 32 (AVX2 builds:
    exact integer products, ~1.6x the decode speed of widening nibbles to float; see
    quant_ops.cpp). Float32 rows, and other builds, keep exact float32 activations."""
    lib = get_quant_lib()
    return lib is not None and bool(lib.vllm_quant_int8_runs())


def int4_ctx(w_q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
             bias: Optional[torch.Tensor]) -> Optional[ctypes.Array]:
    """The layer as `vllm_int4_linear_bf16` reads it (raw pointers: the caller keeps the
    tensors alive); None when the bias is not bf16 (that entry reads bf16 only)."""
    if bias is not None and (bias.dtype != torch.bfloat16 or not bias.is_contiguous()):
        return None
    n, k2 = w_q.shape
    return Int4Ctx(w_q.data_ptr(), n, 2 * k2, scales.data_ptr(), zeros.data_ptr(),
                   scales.shape[1], 0 if bias is None else bias.data_ptr())


def int4_linear_fn() -> int:
    """Address of `vllm_int4_linear_bf16`, for native callers (the fused decode layer)."""
    return ctypes.cast(get_quant_lib().vllm_int4_linear_bf16, ctypes.c_void_p).value


def gemm_int4(x: torch.Tensor, w_q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [.., K] @ W^T (+ bias) for the int4 layout of int_weights.py; x's dtype."""
    k = x.shape[-1]
    if x.dtype == torch.bfloat16:
        ctx = int4_ctx(w_q, scales, zeros, bias)
        if ctx is not None:
            x2 = x.reshape(-1, k)
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            m, n = x2.shape[0], w_q.shape[0]
            out = torch.empty(m, n, dtype=torch.bfloat16)
            get_quant_lib().vllm_int4_linear_bf16(ctx, x2.data_ptr(), x2.stride(0), m,
                                                  out.data_ptr(), n, torch.get_num_threads())
            return out.reshape(*x.shape[:-1], n)
    x2 = x.reshape(-1, k).float().contiguous()
    m, n, g = x2.shape[0], w_q.shape[0], scales.shape[1]
    out = torch.empty(m, n, dtype=torch.float32)
    b = None if bias is None else bias.float().contiguous()
    get_quant_lib().vllm_gemm_int4(x2.data_ptr(), m, k, w_q.data_ptr(), n, scales.data_ptr(),
                                   zeros.data_ptr(), g, 0 if b is None else b.data_ptr(),
                                   out.data_ptr(), torch.get_num_threads())
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


def fp8_supported(x: torch.Tensor) -> bool:
    return _rows_ok(x)


def gemm_fp8(x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """x_q [M, K] fp8 @ w_q [N, K]^T in float32, unscaled (M <= MAX_ROWS)."""
    x2 = x_q.float().contiguous()
    m, k = x2.shape
    n = w_q.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    get_quant_lib().vllm_gemm_fp8(x2.data_ptr(), m, k, w_q.view(torch.uint8).data_ptr(), n,
                                  out.data_ptr(), torch.get_num_threads())
    return out
