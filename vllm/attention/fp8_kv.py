"""FP8 KV cache: the `--kv-cache-dtype` values, and how K/V are stored and read.

vLLM's semantics: `fp8` is `fp8_e4m3`; `fp8_inc` is the name Intel Neural Compressor
(Gaudi) uses for the same e4m3 format; `fp8_e5m2` trades mantissa for range. Each
attention layer has a per-tensor `k_scale` and `v_scale` (from the checkpoint, see
vllm/model_executor/layers/quantization/kv_cache.py, else 1.0). The cache holds
`fp8(clamp(x / scale))`, saturated at the format's largest finite value (torch's cast
alone turns overflow into NaN on e4m3fn); a read gives `fp8 * scale` in the model
dtype.

Every attention read sees K/V as stored in the cache, including the tokens of the
prompt being processed (a prefill that attends to its own fresh K/V quantizes them
first): the result then does not depend on which kernel a step takes (the native
single-query kernel also serves short prefills), and a reference is simply the model
with K and V quantize-dequantized.

The cache tensor's dtype is the one source of truth: the backends check it, not a flag.
"""
from __future__ import annotations

import torch

# The flag's values are config (vllm/config.py); re-exported for the attention code.
from vllm.config import KV_CACHE_DTYPES, check_kv_cache_dtype  # noqa: F401

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def kv_cache_torch_dtype(cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype KV cache tensors are allocated in."""
    check_kv_cache_dtype(cache_dtype)
    return KV_CACHE_DTYPES[cache_dtype] or model_dtype


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def quantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x / scale, saturated and rounded (to nearest even) to the fp8 `dtype`."""
    fmax = float(torch.finfo(dtype).max)
    xf = x.float() if scale == 1.0 else x.float() / scale
    return xf.clamp(-fmax, fmax).to(dtype)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """fp8 values times their scale, in `dtype`."""
    xf = x.float() if scale == 1.0 else x.float() * scale
    return xf.to(dtype)


def qdq_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x as an fp8 cache of `dtype` gives it back (quantize, then dequantize), in
    x's dtype: what attention reads for a K/V row the cache stores."""
    return dequantize_kv(quantize_kv(x, scale, dtype), scale, x.dtype)
