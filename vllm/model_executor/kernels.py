"""Backend kernels that are functions, not layers: the seam between the model code and
the backends (vllm/cpu, vllm/hpu, vllm/cuda), beside `CustomOp` (which binds whole
layers' forwards).

Model, attention and sampling code import no backend package. Where they need a
kernel that is not a layer's forward (the linear GEMM on weights a backend packed, the
greedy argmax, paged decode attention straight from a block table, an fp8 or int4
GEMM) they ask this table for it by name: `kernel("linear")`. Each name has a
backend-neutral default here, plain torch (or "not available": the caller keeps its
torch path); each platform binds its own implementations for its device with
`register_kernels(table, device)`, from its own package, in the same step that binds
its `CustomOp` forwards (`Platform.bind_custom_ops`: when the worker initializes its
device, or when the first layer is built, whichever comes first).

As with `CustomOp`, the choice follows `current_platform.device_name`, not the device
of a tensor (on the fake HPU tensors live on the CPU, yet the model must run Gaudi's
path). Callers on a hot path pick the kernel once, when they are built, and keep it.

Kernels (name: signature; the neutral default):

- `linear(module, x, weight, bias) -> Tensor`: `F.linear` (in fixed row tiles with
  VLLM_BATCH_INVARIANT=1); a backend may route it to weights it packed for `module`.
- `drop_weight_copies(model) -> None`: forget any copies of the weights a backend
  made after loading (before the weights change); nothing by default.
- `argmax(logits) -> Tensor | None`: row-wise first maximal index; None: the caller
  uses `max(dim).indices`.
- `paged_decode_attention(query, kv_cache, block_table, seq_lens, num_heads,
  block_size, scale, out, k_scale, v_scale) -> bool`: one query row per sequence
  against its context, read from a head-major cache through the block table, written
  into `out`; False (nothing written) where the backend has no such kernel for these
  tensors.
- `fp8_gemm(x_q, x_scale, w_q, w_scale, bias, out_dtype) -> Tensor`: fp8 activations
  times fp8 weights, scaled; dequantize-and-matmul in torch by default.
- `int4_prepare(layer, q) -> None` and `int4_linear(layer, x, bias) -> Tensor | None`:
  a backend's own layout of 4-bit weights (made after loading) and its GEMM on them
  (None: the caller dequantizes).
- `inc_fp8_linear(method, layer, x, bias) -> Tensor | None`: INC's static fp8 linear
  with the backend's own scale handling; None: the generic fp8 path.
- The state-space and linear-attention ops of the hybrid models' mixers
  (vllm/model_executor/layers/mamba/ops.py, whose docstrings give the signatures; the
  torch ops are the defaults): `causal_conv1d`, `causal_conv1d_step`, `ssd_chunk_scan`,
  `ssd_step`, `selective_scan`, `selective_step`, `gated_delta_rule_chunked`,
  `gated_delta_rule_step`, `gated_rms_norm`. The step ops take `state_slots` (update
  the slot cache in place).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch
import torch.nn.functional as F

from vllm import envs
from vllm.model_executor.layers.batch_invariant import row_invariant_linear
from vllm.model_executor.layers.mamba import ops as ssm_ops

KernelFn = Callable[..., Any]

_defaults: dict[str, KernelFn] = {}
_bound: dict[str, dict[str, KernelFn]] = {}
"""device name -> kernel name -> the backend's implementation."""


def default(name: str) -> Callable[[KernelFn], KernelFn]:
    def decorator(fn: KernelFn) -> KernelFn:
        _defaults[name] = fn
        return fn
    return decorator


def register_kernels(table: Mapping[str, KernelFn], device: str) -> list[str]:
    """Bind a backend's kernels (name -> fn) for `device` (idempotent; callers that
    picked a kernel before keep it); returns the names bound."""
    unknown = sorted(set(table) - set(_defaults))
    if unknown:
        raise ValueError(f"no kernel named {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(_defaults))}.")
    _bound.setdefault(device, {}).update(table)
    return sorted(table)


def kernel(name: str, device: Optional[str] = None) -> KernelFn:
    """The implementation of kernel `name` for `device` (default: the current
    platform's, whose kernels are bound first), else the neutral default."""
    if name not in _defaults:
        raise ValueError(f"no kernel named {name!r}; known: {', '.join(sorted(_defaults))}.")
    if device is None:
        from vllm.platforms import current_platform
        current_platform.bind_custom_ops()
        device = current_platform.device_name
    return _bound.get(device, {}).get(name, _defaults[name])


def bound_kernel(name: str) -> Optional[KernelFn]:
    """The current platform's own implementation of `name`, or None where it bound
    none (the caller keeps its torch path without calling anything)."""
    fn = kernel(name)
    return None if fn is _defaults[name] else fn


LINEAR_ATTR = "linear_kernel"


def linear(module: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` through the platform's `linear` kernel, picked on the
    module's first call and kept on it (a plain attribute: not a parameter, not in the
    state dict)."""
    fn = module.__dict__.get(LINEAR_ATTR)
    if fn is None:
        fn = module.__dict__[LINEAR_ATTR] = kernel("linear")
    return fn(module, x, weight, bias)


def drop_weight_copies(model: torch.nn.Module) -> None:
    """Forget the copies of the weights the platform's backend made after loading
    (packed GEMM operands): call before the weights change."""
    kernel("drop_weight_copies")(model)


def bound_kernels(device: str) -> dict[str, KernelFn]:
    """What `device`'s backend bound (tests, logs)."""
    return dict(_bound.get(device, {}))


# ------------------------------------------------------------------ neutral defaults
@default("linear")
def torch_linear(module: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor,
                 bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """torch's GEMM; in fixed row tiles under VLLM_BATCH_INVARIANT=1 (its kernel choice
    varies with the row count)."""
    if envs.VLLM_BATCH_INVARIANT:
        return row_invariant_linear(x, weight, bias)
    return F.linear(x, weight, bias)


@default("drop_weight_copies")
def _no_copies(model: torch.nn.Module) -> None:
    return None


@default("argmax")
def _no_argmax(logits: torch.Tensor) -> Optional[torch.Tensor]:
    return None


@default("paged_decode_attention")
def _no_paged_decode(*args: Any, **kwargs: Any) -> bool:
    return False


@default("fp8_gemm")
def torch_fp8_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor,
                   w_scale: torch.Tensor, bias: Optional[torch.Tensor],
                   out_dtype: torch.dtype) -> torch.Tensor:
    """Dequantize both operands and multiply in the output dtype (float32 for others)."""
    compute = out_dtype if out_dtype in (torch.bfloat16, torch.float32) else torch.float32
    out = F.linear(x_q.to(compute), w_q.to(compute)).float()
    out = out * x_scale.expand(out.shape[0], 1) * w_scale.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


@default("int4_prepare")
def _no_int4_layout(layer: torch.nn.Module, q: torch.Tensor) -> None:
    return None


@default("int4_linear")
def _no_int4_linear(layer: torch.nn.Module, x: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    return None


@default("inc_fp8_linear")
def _no_inc_fp8_linear(method: Any, layer: torch.nn.Module, x: torch.Tensor,
                       bias: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    return None


# the state-space / linear-attention ops: the torch ops are the defaults
SSM_OPS = ("causal_conv1d", "causal_conv1d_step", "ssd_chunk_scan", "ssd_step",
           "selective_scan", "selective_step", "gated_delta_rule_chunked",
           "gated_delta_rule_step", "gated_rms_norm")
for _name in SSM_OPS:
    default(_name)(getattr(ssm_ops, _name))
