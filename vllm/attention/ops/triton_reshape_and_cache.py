"""Triton kernel that writes a step's new K/V rows into the paged KV cache.

Cache layout (vllm/attention/backends/torch_sdpa.py): `[2, num_kv_heads, num_slots,
head_size]`, K then V, head-major; slot = block_id * block_size + offset. Key and
value arrive as `[T, num_kv_heads, head_size]`, often strided views of the fused qkv
projection, so the kernel reads them through their strides instead of asking for a
contiguous copy. A negative slot marks a padding row (a CUDA graph replayed for more
rows than the step has) and is skipped.

An fp8 cache stores `clamp(x / scale, -fmax, fmax)` rounded to nearest even, exactly
as vllm/attention/fp8_kv.py's `quantize_kv`. The kernel encodes the fp8 bit pattern
itself with integer ops and stores it through a uint8 view of the cache: Triton's CPU
interpreter rounds fp8 casts half away from zero (and ignores
`fp_downcast_rounding`), so a plain cast would differ from torch on ties there, while
the integer encoding gives the same bits on every device.

The kernels are kept as plain functions and compiled per device by `TritonKernel`:
`triton.jit` for CUDA tensors, Triton's interpreter for CPU tensors (tests and
machines without a GPU), so neither needs TRITON_INTERPRET at import time. Helper
functions called from a kernel would need the same choice made twice inside one
module namespace, so the kernels here are written without them.
"""
from __future__ import annotations

import logging
import types
from typing import Callable, Dict

import torch

logger = logging.getLogger(__name__)

try:
    import triton
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.interpreter import InterpretedFunction
    HAS_TRITON = True
except ImportError:  # CPU-only installs: the ops refuse to run, the module imports.
    triton = None
    tl = None
    interpreter = None
    InterpretedFunction = None
    HAS_TRITON = False

# fp8 formats: (mantissa bits, exponent bias) of the stored encoding.
_FP8_FORMATS = {
    torch.float8_e4m3fn: (3, 7),
    torch.float8_e5m2: (2, 15),
}


def require_triton(op: str) -> None:
    if not HAS_TRITON:
        raise RuntimeError(f"{op} needs the `triton` package, which is not installed; "
                           "use the torch attention backend instead.")


class TritonKernel:
    """One kernel function, compiled for the device of the tensors it is launched on.

    CUDA tensors get `triton.jit(fn)`; CPU tensors get Triton's interpreter, built
    from the same function, so the CPU tests run the code a GPU runs.
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self._by_device: Dict[str, object] = {}

    def on(self, device: torch.device):
        kind = "cpu" if device.type == "cpu" else "jit"
        kernel = self._by_device.get(kind)
        if kernel is None:
            kernel = (_Interpreted(InterpretedFunction(self.fn)) if kind == "cpu"
                      else triton.jit(self.fn))
            self._by_device[kind] = kernel
        return kernel


class _Interpreted:
    """An interpreted kernel whose calls of Triton's own jitted library functions
    (`tl.sum`, `tl.max`, `tl.zeros`, ...) are interpreted too.

    Those are `triton.jit` functions built when triton was imported; with
    TRITON_INTERPRET unset they refuse to be called from Python, which is what the
    interpreter does. For the duration of a launch, `JITFunction.__call__` runs the
    function's interpreted rewrite instead (compiled GPU kernels never go through
    `__call__`: the compiler inlines the functions they call). The interpreter swaps
    the builtins of the `triton.language` namespaces its functions see for numpy
    ones; the library's own namespace (`triton.language.core`) is swapped here, once
    per launch, and always put back: `InterpretedFunction.__call__` would swap it
    without restoring, and a later CUDA compile in the same process would then fail.
    """

    _rewritten: Dict[Callable, Callable] = {}

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            jit_cls = triton.runtime.jit.JITFunction
            original = jit_cls.__call__
            scope = interpreter._patch_lang(_LIBRARY_PROBE)
            jit_cls.__call__ = _Interpreted._call_interpreted
            try:
                return self.kernel[grid](*args, **kwargs)
            finally:
                jit_cls.__call__ = original
                scope.restore()
        return launch

    @staticmethod
    def _call_interpreted(jit_fn, *args, **kwargs):
        fn = _Interpreted._rewritten.get(jit_fn.fn)
        if fn is None:
            fn = InterpretedFunction(jit_fn.fn).rewrite()
            _Interpreted._rewritten[jit_fn.fn] = fn
        return fn(*args, **kwargs)


def _reshape_and_cache_kernel(
    KEY, VALUE, CACHE, SLOTS,
    stride_k_t, stride_k_h, stride_k_d,
    stride_v_t, stride_v_h, stride_v_d,
    stride_c_kv, stride_c_h, stride_c_s, stride_c_d,
    k_scale, v_scale,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
    FP8: tl.constexpr, FP8_MANT: tl.constexpr, FP8_BIAS: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """One program per (token, kv head): copies its K and V rows into their slot."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(SLOTS + t).to(tl.int64)
    if slot < 0:
        return
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD
    dst = CACHE + h * stride_c_h + slot * stride_c_s + d * stride_c_d
    DROP: tl.constexpr = 23 - FP8_MANT  # float32 mantissa bits an fp8 value drops
    for i in tl.static_range(2):
        if i == 0:
            x = tl.load(KEY + t * stride_k_t + h * stride_k_h + d * stride_k_d, mask=d_ok)
            scale = k_scale
        else:
            x = tl.load(VALUE + t * stride_v_t + h * stride_v_h + d * stride_v_d,
                        mask=d_ok)
            scale = v_scale
        if FP8:
            xf = x.to(tl.float32) / scale
            xf = tl.minimum(tl.maximum(xf, -FP8_MAX), FP8_MAX)
            bits = xf.to(tl.int32, bitcast=True)
            sign = (bits >> 24) & 0x80
            a = bits & 0x7FFFFFFF
            # Normal fp8 value: round the float32 exponent+mantissa to FP8_MANT bits
            # (nearest, ties to even), then rebias the exponent.
            normal = (a + ((1 << (DROP - 1)) - 1) + ((a >> DROP) & 1)) >> DROP
            normal = normal - ((127 - FP8_BIAS) << FP8_MANT)
            # Subnormal fp8 value: the mantissa with its implicit bit, shifted down to
            # units of the smallest subnormal, same rounding.
            e = a >> 23
            shift = tl.minimum(tl.maximum(DROP + 128 - FP8_BIAS - e, 1), 31)
            mant = (a & 0x7FFFFF) | 0x800000
            sub = (mant + ((1 << (shift - 1)) - 1) + ((mant >> shift) & 1)) >> shift
            code = tl.where(e >= 128 - FP8_BIAS, normal, sub)
            y = (code | sign).to(tl.uint8)
        else:
            y = x.to(CACHE.dtype.element_ty)
        tl.store(dst + i * stride_c_kv, y, mask=d_ok)


if HAS_TRITON:
    # A function that sees the library's namespace: what the interpreter patches
    # for `triton.language.core` is found through a function's globals.
    _LIBRARY_PROBE = types.FunctionType((lambda: None).__code__, {"core": tl.core})

_KERNEL = TritonKernel(_reshape_and_cache_kernel) if HAS_TRITON else None


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: float = 1.0,
                      v_scale: float = 1.0) -> None:
    """Write key/value `[T, num_kv_heads, head_size]` into `kv_cache` at
    `slot_mapping` `[T]` (negative slots skipped); fp8 caches are quantized with
    k_scale / v_scale. Launch depends only on shapes (CUDA-graph safe)."""
    require_triton("reshape_and_cache")
    num_tokens, num_kv_heads, head_size = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if kv_cache.dim() != 4 or kv_cache.shape[0] != 2 or \
            kv_cache.shape[1] != num_kv_heads or kv_cache.shape[3] != head_size:
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} is not "
                         f"[2, {num_kv_heads}, slots, {head_size}]")
    if num_tokens == 0:
        return
    fp8 = _FP8_FORMATS.get(kv_cache.dtype)
    cache = kv_cache.view(torch.uint8) if fp8 else kv_cache
    mant, bias = fp8 or (0, 0)
    fmax = float(torch.finfo(kv_cache.dtype).max) if fp8 else 0.0
    _KERNEL.on(key.device)[(num_tokens, num_kv_heads)](
        key, value, cache, slot_mapping,
        *key.stride(), *value.stride(), *cache.stride(),
        float(k_scale), float(v_scale),
        HEAD=head_size, HEAD_PAD=triton.next_power_of_2(head_size),
        FP8=fp8 is not None, FP8_MANT=mant, FP8_BIAS=bias, FP8_MAX=fmax,
        num_warps=1 if head_size <= 128 else 2,
    )
