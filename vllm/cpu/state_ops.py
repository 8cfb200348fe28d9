"""Tensor-level wrappers of the state-space decode kernels (state_ops.cpp): the Mamba2
SSD step and the causal conv step, in place on the state cache at the batch's slots.

Also the gated delta rule's step (Gated DeltaNet: 135 -> 3.2 ms for 16 requests of 16
heads x 128 x 128 bf16 states on 2 cores). Mamba1's selective step stays in torch: at
Jamba-like sizes (16 x 1024 channels x 16) a native loop was no faster (0.78 vs 0.65 ms),
its exp per state element being the cost. A library of its own (same loader, flags and cache as cpu_ops). The `*_decode` functions return None
where they cannot run (no library, a state dtype other than float32 / bfloat16, a
cache that is not contiguous); the kernel table's CPU entries (`ssd_step`,
`causal_conv1d_step`, `gated_delta_rule_step`) then run the torch op.

Measured (benchmarks/README.md, "State-space models"): the torch step gathers the
batch's states, converts, decays, adds, reads out, converts back and scatters, about
seven passes over each state; the native step reads and writes each state row once.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch

from vllm.model_executor.layers.mamba import ops as torch_ops

SOURCE = Path(__file__).with_name("state_ops.cpp")
_i64, _i32, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "vllm_state_ops_version": ((), ctypes.c_int),
    "vllm_ssd_decode": ((_i32, _ptr, _i64, _ptr, _i64, _i64, _i64, _i64, _i64, _ptr, _ptr,
                         _ptr, _ptr, _ptr, _ptr, _ptr, _i32), None),
    "vllm_conv1d_decode": ((_i32, _ptr, _i64, _ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr,
                            _ptr, _i32), None),
    "vllm_gated_delta_decode": ((_i32, _ptr, _i64, _ptr, _i64, _i64, _i64, _i64, _ptr, _ptr,
                                 _ptr, _ptr, _ptr, _ptr, _i32), None),
}
_STATE_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def get_state_lib() -> Optional[ctypes.CDLL]:
    from vllm.cpu.loader import load_side_library
    return load_side_library(SOURCE, _SIGNATURES,
                             "Native state-space kernels unavailable, using torch")


def _cache_ok(cache: torch.Tensor) -> bool:
    return (cache.device.type == "cpu" and cache.dtype in _STATE_DTYPES
            and cache.is_contiguous())


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous() if t.dtype == torch.float32 else t.float().contiguous()


def ssd_decode(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, D: Optional[torch.Tensor], ssm_cache: torch.Tensor,
               slots: torch.Tensor) -> Optional[torch.Tensor]:
    """One token per request: x [b, H, P], dt [b, H] (softplus'ed), A [H], B, C
    [b, G, N], D [H]; the states at `slots` of ssm_cache [slots, H, P, N] are advanced
    in place. Returns y [b, H, P] (float32), or None (not run)."""
    lib = get_state_lib()
    if lib is None or not _cache_ok(ssm_cache):
        return None
    b, h, p = x.shape
    n, g = B.shape[-1], B.shape[-2]
    x, dt, A, B, C = _f32(x), _f32(dt), _f32(A), _f32(B), _f32(C)
    D = None if D is None else _f32(D)
    slots = slots.to(torch.int64).contiguous()
    y = torch.empty(b, h, p, dtype=torch.float32)
    lib.vllm_ssd_decode(_STATE_DTYPES[ssm_cache.dtype], ssm_cache.data_ptr(),
                        ssm_cache.stride(0), slots.data_ptr(), b, h, p, n, g,
                        x.data_ptr(), dt.data_ptr(), A.data_ptr(), B.data_ptr(),
                        C.data_ptr(), 0 if D is None else D.data_ptr(), y.data_ptr(),
                        torch.get_num_threads())
    return y


def conv1d_decode(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  conv_cache: torch.Tensor, slots: torch.Tensor) -> Optional[torch.Tensor]:
    """One token per request: x [b, C], weight [C, K]; the windows at `slots` of
    conv_cache [slots, C, K - 1] shift in place. Returns silu(conv) [b, C] (float32),
    or None (not run)."""
    lib = get_state_lib()
    if lib is None or not _cache_ok(conv_cache):
        return None
    b, c = x.shape
    x, weight = _f32(x), _f32(weight)
    bias = None if bias is None else _f32(bias)
    slots = slots.to(torch.int64).contiguous()
    out = torch.empty(b, c, dtype=torch.float32)
    lib.vllm_conv1d_decode(_STATE_DTYPES[conv_cache.dtype], conv_cache.data_ptr(),
                           conv_cache.stride(0), slots.data_ptr(), b, c, weight.shape[-1],
                           x.data_ptr(), weight.data_ptr(),
                           0 if bias is None else bias.data_ptr(), out.data_ptr(),
                           torch.get_num_threads())
    return out


def gated_delta_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, ssm_cache: torch.Tensor,
                       slots: torch.Tensor) -> Optional[torch.Tensor]:
    """Gated DeltaNet, one token per request: q, k [b, H, dk], v [b, H, dv], g, beta
    [b, H]; the states at `slots` of ssm_cache [slots, H, dk, dv] advance in place.
    o [b, H, dv] float32."""
    lib = get_state_lib()
    if lib is None or not _cache_ok(ssm_cache):
        return None
    b, h, dk = q.shape
    dv = v.shape[-1]
    q, k, v, g, beta = _f32(q), _f32(k), _f32(v), _f32(g), _f32(beta)
    slots = slots.to(torch.int64).contiguous()
    o = torch.empty(b, h, dv, dtype=torch.float32)
    lib.vllm_gated_delta_decode(_STATE_DTYPES[ssm_cache.dtype], ssm_cache.data_ptr(),
                                ssm_cache.stride(0), slots.data_ptr(), b, h, dk, dv,
                                q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(),
                                beta.data_ptr(), o.data_ptr(), torch.get_num_threads())
    return o


def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor, state: torch.Tensor,
             state_slots: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel table's `ssd_step` on CPU: in place at `state_slots` natively."""
    if state_slots is not None:
        y = ssd_decode(x, dt, A, B, C, D, state, state_slots)
        if y is not None:
            return y, state
    return torch_ops.ssd_step(x, dt, A, B, C, D, state, state_slots)


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       conv_state: torch.Tensor, state_slots: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel table's `causal_conv1d_step` on CPU: in place at `state_slots`
    natively (the sum in float32, the output in x's dtype)."""
    if state_slots is not None:
        out = conv1d_decode(x, weight, bias, conv_state, state_slots)
        if out is not None:
            return out.to(x.dtype), conv_state
    return torch_ops.causal_conv1d_step(x, weight, bias, conv_state, state_slots)


def gated_delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                          state_slots: Optional[torch.Tensor] = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel table's `gated_delta_rule_step` on CPU: in place at `state_slots`
    natively."""
    if state_slots is not None:
        o = gated_delta_decode(q, k, v, g, beta, state, state_slots)
        if o is not None:
            return o, state
    return torch_ops.gated_delta_rule_step(q, k, v, g, beta, state, state_slots)
