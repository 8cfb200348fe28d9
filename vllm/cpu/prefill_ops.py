"""Tensor-level wrapper of the blocked prefill attention kernel (prefill_ops.cpp).

A separate library from cpu_ops (same loader, flags and cache), so the prefill kernel
builds and changes on its own. `None` library (no compiler, VLLM_CPU_NATIVE_OPS=0,
failed build): `usable` is false and the torch_sdpa backend keeps its other paths.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Optional

import torch

from vllm.cpu.cpu_ops import DTYPE_CODES, _no_output, _rows_ok, _torch_op

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("prefill_ops.cpp")
_i64, _i32, _f32, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
_SIGNATURE = (_i32, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64,
              _i64, _i64, _i64, _f32, _ptr, _i64, _i32, _i32)
_SIGNATURES = {"vllm_prefill_attention": (_SIGNATURE, None),
               "vllm_prefill_ops_version": ((), ctypes.c_int),
               "vllm_prefill_bf16_kernel": ((), ctypes.c_int)}
FMA, DOT, AMX = 0, 1, 2
"""bf16 kernels of prefill_ops.cpp: float32 FMAs on converted bf16 (any x86), AVX512-BF16
dot products, AMX tiles. A call names the fastest it may take (`bf16_kernel`) and runs
the best of those the library has (`best_bf16_kernel`)."""


def get_prefill_lib() -> Optional[ctypes.CDLL]:
    from vllm.cpu.loader import load_side_library
    return load_side_library(SOURCE, _SIGNATURES,
                             "Native prefill attention unavailable, using the other paths")


def usable(kv_cache: torch.Tensor) -> bool:
    """A contiguous float32/bf16 CPU cache and a loaded library."""
    return (kv_cache.device.type == "cpu" and kv_cache.dtype in DTYPE_CODES
            and kv_cache.is_contiguous() and get_prefill_lib() is not None)


def best_bf16_kernel() -> int:
    """The fastest kernel bf16 calls with head sizes that are a multiple of 32 take:
    AMX where the library was built for a CPU with AMX and Linux lent the process the
    tile state, DOT on AVX512-BF16, else FMA (also without a library)."""
    lib = get_prefill_lib()
    return FMA if lib is None else int(lib.vllm_prefill_bf16_kernel())


@_torch_op("prefill_attention", ("out",), _no_output)
def prefill_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                      query_start: torch.Tensor, query_len: torch.Tensor,
                      context_len: torch.Tensor, num_heads: int, block_size: int,
                      scale: float, out: torch.Tensor, bf16_kernel: int = AMX) -> None:
    """Causal attention of each sequence's new rows to its paged context and itself.

    query: [T, >= num_heads * head_size] (rows may be strided); kv_cache: one layer's
    `[2, kv_heads, slots, head_size]`, already holding the new rows' K/V; block_table
    [num_seqs, max_blocks] int32; query_start / query_len / context_len [num_seqs]
    int32 (sequence s owns query rows [start, start + len) at positions context_len
    + r); out: [T, num_heads * head_size], written at those rows. bf16_kernel: the
    fastest kernel a bf16 call may take (FMA / DOT / AMX; lower ones let the paths be
    compared on one machine); float32 calls and head sizes not a multiple of 32 always
    take the float32 path.
    """
    _rows_ok(query, "query")
    _rows_ok(out, "out")
    _rows_ok(block_table, "block_table")
    _, kv_heads, num_slots, head_size = kv_cache.shape
    for name, t in (("block_table", block_table), ("query_start", query_start),
                    ("query_len", query_len), ("context_len", context_len)):
        if t.dtype != torch.int32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 tensor.")
    if num_heads % kv_heads or query.dtype != kv_cache.dtype or out.dtype != query.dtype:
        raise ValueError("num_heads must be a multiple of the cache's KV heads, and query, "
                         "cache and out must share one dtype.")
    get_prefill_lib().vllm_prefill_attention(
        DTYPE_CODES[query.dtype], query.data_ptr(), query.stride(0), kv_cache[0].data_ptr(),
        kv_cache[1].data_ptr(), num_slots, block_table.data_ptr(), block_table.stride(0),
        query_start.data_ptr(), query_len.data_ptr(), context_len.data_ptr(),
        query_len.shape[0], num_heads, kv_heads, head_size, block_size, scale, out.data_ptr(),
        out.stride(0), torch.get_num_threads(), bf16_kernel)
