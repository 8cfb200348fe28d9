"""Tensor-level wrappers of the native CPU kernels (cpu_ops.cpp).

Callers first ask `usable(tensor)`: true for a float32 or bfloat16 CPU tensor when the
library loaded. The wrappers then take tensors whose last dimension is contiguous
(rows may be strided, e.g. views into a fused projection) and pass raw pointers and
strides; the C side trusts them, so the shape checks live here.

Each op has a torch twin in the module that calls it (RMSNorm, RotaryEmbedding,
SiluAndMul, the torch_sdpa backend): the twin is the reference in the tests and the
path taken whenever `usable` is false.
"""
from __future__ import annotations

from typing import Optional

import torch

from vllm import envs
from vllm.native.loader import get_native_lib

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


def usable(t: torch.Tensor) -> bool:
    """Whether the native kernels can take this tensor (CPU, float32/bf16, lib loaded)."""
    return (t.device.type == "cpu" and t.dtype in DTYPE_CODES
            and get_native_lib() is not None)


def _rows_ok(t: torch.Tensor, name: str) -> None:
    if t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1):
        raise ValueError(f"{name} must be 2-D with a contiguous last dimension, got shape "
                         f"{tuple(t.shape)} strides {t.stride()}.")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: Optional[torch.Tensor] = None,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Normalize rows of `x` [T, d] into `out` (new when None; may be `x` itself).

    With `residual`, first `residual <- x + residual` in place, then normalize that
    sum: vLLM's fused_add_rms_norm.
    """
    _rows_ok(x, "x")
    rows, d = x.shape
    if out is None:
        out = torch.empty(rows, d, dtype=x.dtype)
    res_ptr, res_stride = 0, 0
    if residual is not None:
        _rows_ok(residual, "residual")
        res_ptr, res_stride = residual.data_ptr(), residual.stride(0)
    get_native_lib().vllm_rms_norm(DTYPE_CODES[x.dtype], x.data_ptr(), x.stride(0), res_ptr,
                                   res_stride, weight.data_ptr(), out.data_ptr(),
                                   out.stride(0), rows, d, eps, torch.get_num_threads())
    return out


def rotary_(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
            num_heads: int, head_size: int, rotary_dim: int, is_neox_style: bool) -> None:
    """Rotate heads [0, num_heads) of every row of `x` [T, >= num_heads * head_size] in
    place; `cos_sin_cache` [max_pos, rotary_dim] of `[cos | sin]`, x's dtype."""
    _rows_ok(x, "x")
    if positions.dtype != torch.int64 or not positions.is_contiguous():
        positions = positions.to(torch.int64).contiguous()
    get_native_lib().vllm_rotary(DTYPE_CODES[x.dtype], x.data_ptr(), x.shape[0], x.stride(0),
                                 num_heads, head_size, rotary_dim, positions.data_ptr(),
                                 cos_sin_cache.data_ptr(), int(is_neox_style),
                                 torch.get_num_threads())


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2d] -> [T, d]: silu(x[:, :d]) * x[:, d:]."""
    _rows_ok(x, "x")
    rows, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, d, dtype=x.dtype)
    get_native_lib().vllm_silu_and_mul(DTYPE_CODES[x.dtype], x.data_ptr(), x.stride(0),
                                       out.data_ptr(), out.stride(0), rows, d,
                                       torch.get_num_threads())
    return out


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store each token's K and V rows at its slot of a `[2, kv_heads, slots, head]` cache.

    key, value: [T, kv_heads * head_size], the same row stride (views of one fused
    projection, or contiguous); slot_mapping: [T] int64.
    """
    _rows_ok(key, "key")
    _rows_ok(value, "value")
    if key.stride(0) != value.stride(0):
        raise ValueError("key and value must have the same row stride.")
    _, kv_heads, num_slots, head_size = kv_cache.shape
    if not kv_cache.is_contiguous() or slot_mapping.dtype != torch.int64:
        raise ValueError("kv_cache must be contiguous and slot_mapping int64.")
    get_native_lib().vllm_write_kv(DTYPE_CODES[key.dtype], key.data_ptr(), value.data_ptr(),
                                   key.stride(0), kv_cache[0].data_ptr(),
                                   kv_cache[1].data_ptr(), num_slots, slot_mapping.data_ptr(),
                                   key.shape[0], kv_heads, head_size, torch.get_num_threads())


def decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, num_heads: int, block_size: int, scale: float,
                     out: torch.Tensor) -> None:
    """One query per row against its paged context, written into `out` [n, hq * d].

    query: [n, >= num_heads * head_size]; block_table: [n, max_blocks] int32;
    seq_lens: [n] int32, each row's context length including its new token.
    """
    _rows_ok(query, "query")
    _rows_ok(out, "out")
    _rows_ok(block_table, "block_table")
    _, kv_heads, num_slots, head_size = kv_cache.shape
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("block_table and seq_lens must be int32.")
    n = query.shape[0]
    get_native_lib().vllm_decode_attention(
        DTYPE_CODES[query.dtype], query.data_ptr(), query.stride(0), kv_cache[0].data_ptr(),
        kv_cache[1].data_ptr(), num_slots, block_table.data_ptr(), block_table.stride(0),
        seq_lens.data_ptr(), n, num_heads, kv_heads, head_size, block_size, scale,
        out.data_ptr(), out.stride(0), torch.get_num_threads())


def gemm_supported() -> bool:
    """A loaded library built with AVX512-BF16, and VLLM_CPU_NATIVE_GEMM not 0."""
    cached = _GEMM.get("ok")
    if cached is None:
        lib = get_native_lib()
        cached = bool(lib is not None and envs.VLLM_CPU_NATIVE_GEMM is not False
                      and lib.vllm_has_bf16_gemm())
        _GEMM["ok"] = cached
    return cached


_GEMM: dict[str, bool] = {}


def pack_bf16(weight: torch.Tensor) -> Optional[torch.Tensor]:
    """`weight` [N, K] (bf16, K even) in the layout of `gemm_bf16_packed`; None when the
    library has no AVX512-BF16 kernels."""
    n, k = weight.shape
    if k % 2 or weight.dtype != torch.bfloat16 or not gemm_supported():
        return None
    weight = weight.contiguous()
    lib = get_native_lib()
    out = torch.empty(lib.vllm_packed_numel(n, k), dtype=torch.bfloat16)
    lib.vllm_pack_bf16(weight.data_ptr(), n, k, out.data_ptr(), torch.get_num_threads())
    return out


def gemm_bf16_packed(x: torch.Tensor, packed: torch.Tensor, n: int,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for bf16 `x` [M, K] with `packed = pack_bf16(weight)`."""
    _rows_ok(x, "x")
    m, k = x.shape
    out = torch.empty(m, n, dtype=torch.bfloat16)
    get_native_lib().vllm_gemm_bf16_packed(x.data_ptr(), x.stride(0), m, packed.data_ptr(), n,
                                           k, 0 if bias is None else bias.data_ptr(),
                                           out.data_ptr(), out.stride(0),
                                           torch.get_num_threads())
    return out
