"""CUDA forwards of the custom ops (`CustomOp.register_forward(name, "cuda")`).

The twin of vllm/cpu/ops.py: the layers keep their plain-torch `forward_native`,
and the CUDA platform binds these Triton kernels (vllm/cuda/layer_kernels.py) when the
first layer is built, where triton is installed. Each falls back to the layer's
`forward_native` where its kernel does not apply (rows that are not contiguous in
their last dimension, autograd, M-RoPE's three position rows), so a bound forward is
always safe to call. In the same step the kernel table (vllm/model_executor/kernels.py)
gets the Triton kernels of the state-space mixers (vllm/cuda/ssm_kernels.py).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from vllm.cuda import layer_kernels, ssm_kernels
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.kernels import register_kernels
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _rows_ok(x: torch.Tensor) -> bool:
    return (x.dim() == 2 and x.stride(-1) == 1 and x.dtype in _FLOATS
            and not x.requires_grad)


def rms_norm_cuda(self: RMSNorm, x: torch.Tensor, residual: Optional[torch.Tensor] = None
                  ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One kernel for the residual add and the norm; the residual form works in place
    (`residual` becomes the sum, `x` its norm), as vLLM's fused_add_rms_norm."""
    if _rows_ok(x) and self.weight.dtype in _FLOATS:
        if residual is None:
            return layer_kernels.rms_norm(x, self.weight, self.variance_epsilon)
        if residual.stride(-1) == 1 and residual.dtype == x.dtype and residual.dim() == 2:
            layer_kernels.rms_norm(x, self.weight, self.variance_epsilon, residual)
            return x, residual
    return self.forward_native(x, residual)


def silu_and_mul_cuda(self: SiluAndMul, x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in one kernel."""
    if _rows_ok(x) and x.shape[-1] % 2 == 0:
        return layer_kernels.silu_and_mul(x)
    return self.forward_native(x)


def _heads(rope: RotaryEmbedding, x: torch.Tensor) -> Optional[torch.Tensor]:
    """`x` as [T, heads, head_size] sharing its memory (elements of a head
    contiguous), if the kernel can rotate it in place; else None."""
    if x.dtype != rope.cos_sin_cache.dtype or x.requires_grad or x.stride(-1) != 1:
        return None
    if x.dim() == 3 and x.shape[2] == rope.head_size:
        return x
    if x.dim() == 2 and x.shape[1] % rope.head_size == 0:
        return x.view(x.shape[0], -1, rope.head_size)
    return None


def rotary_embedding_cuda(self: RotaryEmbedding, positions: torch.Tensor,
                          query: torch.Tensor, key: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated in place by one launch (every head of both)."""
    q3, k3 = _heads(self, query), _heads(self, key)
    if q3 is None or k3 is None or positions.dim() != 1:
        return self.forward_native(positions, query, key)
    layer_kernels.rotary_qk_(positions, q3, k3, self.cos_sin_cache, self.rotary_dim,
                             self.is_neox_style)
    return query, key


CUDA_FORWARDS: dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm_cuda,
    "silu_and_mul": silu_and_mul_cuda,
    "rotary_embedding": rotary_embedding_cuda,
}
"""op name -> its CUDA forward."""


CUDA_KERNELS: dict[str, Callable[..., Any]] = {
    "causal_conv1d": ssm_kernels.causal_conv1d,
    "causal_conv1d_step": ssm_kernels.causal_conv1d_step,
    "ssd_step": ssm_kernels.ssd_step,
    "selective_step": ssm_kernels.selective_step,
    "gated_delta_rule_step": ssm_kernels.gated_delta_rule_step,
    "selective_scan": ssm_kernels.selective_scan,
    "ssd_chunk_scan": ssm_kernels.ssd_chunk_scan,
    "gated_delta_rule_chunked": ssm_kernels.gated_delta_rule_chunked,
    "gated_rms_norm": ssm_kernels.gated_rms_norm,
}
"""kernel name -> its CUDA implementation (model_executor/kernels.py): the Triton
kernels of the state-space mixers (vllm/cuda/ssm_kernels.py)."""


def register_cuda_ops() -> list[str]:
    """Bind every CUDA forward and kernel (idempotent); returns the op names bound."""
    register_kernels(CUDA_KERNELS, "cuda")
    return CustomOp.register_forwards(CUDA_FORWARDS, "cuda")
