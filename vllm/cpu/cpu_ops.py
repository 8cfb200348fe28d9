"""Tensor-level wrappers of the native CPU kernels (cpu_ops.cpp).

Callers first ask `usable(tensor)`: true for a float32 or bfloat16 CPU tensor when the
library loaded. The wrappers then take tensors whose last dimension is contiguous
(rows may be strided, e.g. views into a fused projection) and pass raw pointers and
strides; the C side trusts them, so the shape checks live here.

Each op has a torch twin in the module that calls it (RMSNorm, RotaryEmbedding,
SiluAndMul, the torch_sdpa backend): the twin is the reference in the tests and the
path taken whenever `supports` is false.

torch.compile: every kernel is also a torch custom op (`torch.ops.vllm.*`, declared
with the arguments it mutates and a fake implementation that only makes the output
shapes). Traced code sees one opaque call instead of ctypes calls on raw data
pointers, which dynamo cannot trace (a graph break per call, and guards that made it
recompile on every new tensor). Eager calls skip the dispatcher and call the kernel
directly: going through `torch.ops` costs ~40 us per call, more than the kernels
themselves at decode sizes. Both ways run the same function, so results are identical.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from vllm import envs
from vllm.cpu.loader import get_native_lib
from vllm.utils.compile_markers import assume_constant_result

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
CACHE_DTYPE_CODES = {**DTYPE_CODES, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}
"""KV cache dtypes of write_kv / decode_attention: the model's, or fp8 (see
vllm/attention/fp8_kv.py)."""


def supports(dtype: torch.dtype) -> bool:
    """Whether the native kernels take this dtype (float32/bf16) and the library loaded.

    The CPU layers ask this; they run only on the CPU platform, so the device is known.
    """
    return dtype in DTYPE_CODES and _lib_loaded()


@assume_constant_result
def _lib_loaded() -> bool:
    """Constant per process for torch.compile (no guard on the loader's state)."""
    return get_native_lib() is not None


def usable(t: torch.Tensor) -> bool:
    """Whether the native kernels can take this tensor (CPU, float32/bf16, lib loaded)."""
    return t.device.type == "cpu" and supports(t.dtype)


def _torch_op(name: str, mutates_args: Iterable[str],
              fake: Callable[..., Any]) -> Callable[[Callable], Callable]:
    """Register `fn` as the custom op `torch.ops.vllm.<name>` with `fake` as its meta
    function; the returned callable runs the op while torch.compile traces, else `fn`."""
    def register(fn: Callable) -> Callable:
        op = torch.library.custom_op(f"vllm::{name}", fn, mutates_args=tuple(mutates_args))
        op.register_fake(fake)

        def call(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return op(*args, **kwargs)
            return fn(*args, **kwargs)
        call.__name__, call.__doc__, call.op = fn.__name__, fn.__doc__, op
        return call
    return register


def _no_output(*args: Any) -> None:
    return None


def _rows_ok(t: torch.Tensor, name: str) -> None:
    if t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1):
        raise ValueError(f"{name} must be 2-D with a contiguous last dimension, got shape "
                         f"{tuple(t.shape)} strides {t.stride()}.")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: Optional[torch.Tensor] = None,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Normalize rows of `x` [T, d] into `out` (new when None; may be `x` itself).

    With `residual`, first `residual <- x + residual` in place, then normalize that
    sum: vLLM's fused_add_rms_norm. Under torch.compile the two forms the layers use
    (a new output; or residual with `out=x`) are the ops `rms_norm` and
    `fused_add_rms_norm`.
    """
    if torch.compiler.is_compiling():
        if residual is None and out is None:
            return _rms_norm_new(x, weight, eps)
        if residual is not None and out is x:
            _fused_add_rms_norm(x, residual, weight, eps)
            return x
        raise ValueError("under torch.compile rms_norm takes out=None, or residual with "
                         "out=x.")
    return _rms_norm(x, weight, eps, residual, out)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
              residual: Optional[torch.Tensor], out: Optional[torch.Tensor]) -> torch.Tensor:
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


@_torch_op("rms_norm", (), lambda x, weight, eps: x.new_empty(x.shape))
def _rms_norm_new(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms_norm(x, weight, eps, None, None)


@_torch_op("fused_add_rms_norm", ("x", "residual"), _no_output)
def _fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> None:
    _rms_norm(x, weight, eps, residual, x)


@_torch_op("rotary", ("x",), _no_output)
def rotary_(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
            num_heads: int, head_size: int, rotary_dim: int, is_neox_style: bool) -> None:
    """Rotate heads [0, num_heads) of every row of `x` [T, >= num_heads * head_size] in
    place; `cos_sin_cache` [max_pos, rotary_dim] of `[cos | sin]`, x's dtype."""
    _rows_ok(x, "x")
    if x.shape[1] < num_heads * head_size:
        raise ValueError(f"x has {x.shape[1]} features per row, fewer than {num_heads} heads "
                         f"of {head_size}.")
    _rotary_rows(x.data_ptr(), x, positions, cos_sin_cache, num_heads, head_size,
                 rotary_dim, is_neox_style)


def _rotary_rows(ptr: int, x: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor, num_heads: int, head_size: int,
                 rotary_dim: int, is_neox_style: bool) -> None:
    if positions.dtype != torch.int64 or not positions.is_contiguous():
        positions = positions.to(torch.int64).contiguous()
    if positions.shape[0] != x.shape[0]:
        raise ValueError(f"{positions.shape[0]} positions for {x.shape[0]} rows.")
    get_native_lib().vllm_rotary(DTYPE_CODES[x.dtype], ptr, x.shape[0], x.stride(0),
                                 num_heads, head_size, rotary_dim, positions.data_ptr(),
                                 cos_sin_cache.data_ptr(), int(is_neox_style),
                                 torch.get_num_threads())


@_torch_op("rotary_qk", ("query", "key"), _no_output)
def rotary_qk_(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
               cos_sin_cache: torch.Tensor, head_size: int, rotary_dim: int,
               is_neox_style: bool) -> None:
    """Rotate every head of `query` [T, hq * head_size] and `key` [T, hkv * head_size] in
    place. When `key` directly follows `query` in the same rows (both views of one
    fused qkv projection, the usual case) one kernel call rotates both."""
    _rows_ok(query, "query")
    _rows_ok(key, "key")
    hq, hkv = query.shape[1] // head_size, key.shape[1] // head_size
    if hq * head_size != query.shape[1] or hkv * head_size != key.shape[1]:
        raise ValueError(f"query and key widths must be multiples of head_size={head_size}.")
    adjacent = (key.dtype == query.dtype and key.stride(0) == query.stride(0)
                and key.data_ptr() == query.data_ptr() + query.shape[1] * query.element_size())
    if adjacent:
        _rotary_rows(query.data_ptr(), query, positions, cos_sin_cache, hq + hkv, head_size,
                     rotary_dim, is_neox_style)
        return
    for x, heads in ((query, hq), (key, hkv)):
        _rotary_rows(x.data_ptr(), x, positions, cos_sin_cache, heads, head_size, rotary_dim,
                     is_neox_style)


def _silu_and_mul_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1] // 2)


@_torch_op("silu_and_mul", (), _silu_and_mul_fake)
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2d] -> [T, d]: silu(x[:, :d]) * x[:, d:]."""
    _rows_ok(x, "x")
    rows, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, d, dtype=x.dtype)
    get_native_lib().vllm_silu_and_mul(DTYPE_CODES[x.dtype], x.data_ptr(), x.stride(0),
                                       out.data_ptr(), out.stride(0), rows, d,
                                       torch.get_num_threads())
    return out


def argmax(logits: torch.Tensor) -> Optional[torch.Tensor]:
    """Row-wise argmax of 2-D float32 / bf16 `logits` [rows, vocab] (int64 [rows]): the
    first index among equal maxima, the first NaN in a row that has one (as
    `logits.max(-1).indices`). None where the native library cannot take it."""
    if (logits.dim() != 2 or logits.dtype not in (torch.float32, torch.bfloat16)
            or logits.shape[1] == 0 or logits.stride(1) != 1 or logits.device.type != "cpu"
            or get_native_lib() is None):
        return None
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    get_native_lib().vllm_argmax(DTYPE_CODES[logits.dtype], logits.data_ptr(),
                                 logits.stride(0), logits.shape[0], logits.shape[1],
                                 out.data_ptr(), torch.get_num_threads())
    return out


@_torch_op("write_kv", ("kv_cache",), _no_output)
def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store each token's K and V rows at its slot of a `[2, kv_heads, slots, head]` cache.

    key, value: [T, kv_heads * head_size], the same row stride (views of one fused
    projection, or contiguous), of the cache's dtype (an fp8 cache takes rows already
    quantized); slot_mapping: [T] int64.
    """
    _rows_ok(key, "key")
    _rows_ok(value, "value")
    if key.stride(0) != value.stride(0):
        raise ValueError("key and value must have the same row stride.")
    _, kv_heads, num_slots, head_size = kv_cache.shape
    if not kv_cache.is_contiguous() or slot_mapping.dtype != torch.int64:
        raise ValueError("kv_cache must be contiguous and slot_mapping int64.")
    if key.dtype != kv_cache.dtype or value.dtype != kv_cache.dtype:
        raise ValueError(f"key/value ({key.dtype}) must have the cache's dtype "
                         f"({kv_cache.dtype}).")
    get_native_lib().vllm_write_kv(CACHE_DTYPE_CODES[key.dtype], key.data_ptr(),
                                   value.data_ptr(),
                                   key.stride(0), kv_cache[0].data_ptr(),
                                   kv_cache[1].data_ptr(), num_slots, slot_mapping.data_ptr(),
                                   key.shape[0], kv_heads, head_size, torch.get_num_threads())


@_torch_op("decode_attention", ("out",), _no_output)
def decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, num_heads: int, block_size: int, scale: float,
                     out: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """One query per row against its paged context, written into `out` [n, hq * d].

    query: [n, >= num_heads * head_size]; block_table: [n, max_blocks] int32;
    seq_lens: [n] int32, each row's context length including its new token.
    kv_cache: the query's dtype, or fp8 holding K / k_scale and V / v_scale (the
    kernel reads fp8 through a table and applies the scales once per row).
    """
    _rows_ok(query, "query")
    _rows_ok(out, "out")
    _rows_ok(block_table, "block_table")
    _, kv_heads, num_slots, head_size = kv_cache.shape
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("block_table and seq_lens must be int32.")
    if kv_cache.dtype != query.dtype and kv_cache.dtype not in CACHE_DTYPE_CODES:
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} is not supported.")
    if kv_cache.dtype == query.dtype and (k_scale != 1.0 or v_scale != 1.0):
        raise ValueError("k_scale/v_scale apply to fp8 caches only.")
    n = query.shape[0]
    get_native_lib().vllm_decode_attention(
        DTYPE_CODES[query.dtype], CACHE_DTYPE_CODES[kv_cache.dtype], query.data_ptr(),
        query.stride(0), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), num_slots,
        block_table.data_ptr(), block_table.stride(0), seq_lens.data_ptr(), n, num_heads,
        kv_heads, head_size, block_size, scale * k_scale, v_scale, out.data_ptr(),
        out.stride(0), torch.get_num_threads())


def gemm_supported() -> bool:
    """A loaded library with the packed bf16 GEMM (built where the CPU has AVX512-BF16,
    or AVX2 + FMA), and VLLM_CPU_NATIVE_GEMM not 0."""
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
    library has no packed GEMM (see gemm_supported)."""
    n, k = weight.shape
    if k % 2 or weight.dtype != torch.bfloat16 or not gemm_supported():
        return None
    weight = weight.contiguous()
    lib = get_native_lib()
    out = torch.empty(lib.vllm_packed_numel(n, k), dtype=torch.bfloat16)
    lib.vllm_pack_bf16(weight.data_ptr(), n, k, out.data_ptr(), torch.get_num_threads())
    return out


def _gemm_fake(x: torch.Tensor, packed: torch.Tensor, n: int,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return x.new_empty(x.shape[0], n)


@_torch_op("gemm_bf16_packed", (), _gemm_fake)
def _gemm_bf16_packed(x: torch.Tensor, packed: torch.Tensor, n: int,
                      bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _gemm(x, packed, n, bias)


def gemm_bf16_packed(x: torch.Tensor, packed: torch.Tensor, n: int,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for bf16 `x` [M, K] with `packed = pack_bf16(weight)`."""
    return _gemm_bf16_packed(x, packed, n, bias)


def amx_gemm_supported() -> bool:
    """Whether `gemm_bf16_amx` runs here: the packed GEMM built with AMX tiles, and
    Linux lending this process the tile state."""
    cached = _GEMM.get("amx")
    if cached is None:
        cached = bool(gemm_supported() and get_native_lib().vllm_has_amx_gemm())
        _GEMM["amx"] = cached
    return cached


@_torch_op("gemm_bf16_amx", (), _gemm_fake)
def _gemm_bf16_amx(x: torch.Tensor, packed: torch.Tensor, n: int,
                   bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _gemm(x, packed, n, bias, amx=True)


def gemm_bf16_amx(x: torch.Tensor, packed: torch.Tensor, n: int,
                  bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`gemm_bf16_packed` on AMX tiles (the same packed weight; K a multiple of 32)."""
    return _gemm_bf16_amx(x, packed, n, bias)


def _gemm(x: torch.Tensor, packed: torch.Tensor, n: int,
          bias: Optional[torch.Tensor], amx: bool = False) -> torch.Tensor:
    _rows_ok(x, "x")
    m, k = x.shape
    out = torch.empty(m, n, dtype=torch.bfloat16)
    lib = get_native_lib()
    fn = lib.vllm_gemm_bf16_amx if amx else lib.vllm_gemm_bf16_packed
    if not fn(x.data_ptr(), x.stride(0), m, packed.data_ptr(), n, k,
              0 if bias is None else bias.data_ptr(), out.data_ptr(), out.stride(0),
              torch.get_num_threads()):
        raise ValueError(f"The {'AMX' if amx else 'packed'} bf16 GEMM cannot run here "
                         f"(K = {k}).")
    return out
