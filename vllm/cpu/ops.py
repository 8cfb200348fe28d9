"""The CPU forward of each custom op: the native kernels, bound by `register_cpu_ops`.

The CPU twin of vllm/hpu/ops.py: the layers hold only their plain-torch
`forward_native`, and each platform binds its kernels to them (see
`CustomOp.register_forward`), and the CPU's entries of the kernel table
(model_executor/kernels.py). The CPU platform binds both in the worker's device
initialization, or when the first layer is built. Every
function falls back to the layer's `forward_native` where its kernel does not apply
(a dtype without a native kernel, strided rows, autograd), so the bound forward is
always safe to call.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from vllm.attention.fp8_kv import is_fp8
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.kernels import register_kernels, torch_fp8_gemm
from vllm.model_executor.layers import decoder_stack  # noqa: F401 (registers the op)
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.cpu import cpu_ops, gemm, quant_ops, state_ops
from vllm.cpu.gemm import PACKS_ATTR
from vllm.cpu.fused_decode import fused_decode_layers_cpu


def _native_rows_ok(x: torch.Tensor) -> bool:
    return (x.dim() == 2 and x.stride(-1) == 1 and cpu_ops.supports(x.dtype)
            and not x.requires_grad)


def rms_norm_cpu(self: RMSNorm, x: torch.Tensor, residual: Optional[torch.Tensor] = None
                 ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One native kernel with HF's roundings; the residual form works in place, as
    vLLM's `fused_add_rms_norm`: `residual` becomes the sum and `x` its norm (callers
    pass tensors they own)."""
    if _native_rows_ok(x):
        if residual is None:
            return cpu_ops.rms_norm(x, self.weight, self.variance_epsilon)
        if residual.stride(-1) == 1 and residual.dtype == x.dtype:
            cpu_ops.rms_norm(x, self.weight, self.variance_epsilon, residual=residual, out=x)
            return x, residual
    return self.forward_native(x, residual)


def silu_and_mul_cpu(self: SiluAndMul, x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in one pass over the rows."""
    if _native_rows_ok(x):
        return cpu_ops.silu_and_mul(x)
    return self.forward_native(x)


def _rotary_rows(rope: RotaryEmbedding, x: torch.Tensor) -> Optional[torch.Tensor]:
    """`x` as rows [T, heads * head_size] sharing its memory, if the native kernel can
    rotate it in place; else None."""
    if (x.dtype != rope.cos_sin_cache.dtype or x.requires_grad
            or not cpu_ops.supports(x.dtype) or x.stride(-1) != 1):
        return None
    if x.dim() == 2:
        return x
    if x.dim() == 3 and x.shape[2] == rope.head_size and x.stride(1) == rope.head_size:
        return x.view(x.shape[0], -1)
    return None


def rotary_embedding_cpu(self: RotaryEmbedding, positions: torch.Tensor,
                         query: torch.Tensor, key: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated in place by one native call (neighbouring views of the fused
    qkv rows are one pass)."""
    q2, k2 = _rotary_rows(self, query), _rotary_rows(self, key)
    if q2 is None or k2 is None:
        return self.forward_native(positions, query, key)
    cpu_ops.rotary_qk_(positions, q2, k2, self.cos_sin_cache, self.head_size,
                       self.rotary_dim, self.is_neox_style)
    return query, key


def _packed_experts(layer: FusedMoE, x: torch.Tensor
                    ) -> Optional[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per-expert (w13, w2) packed for the native bf16 GEMM, built on first use (bf16 on
    CPUs with AVX512-BF16 or AVX2), as the dense layers' weights are (gemm.py): it
    avoids oneDNN re-blocking every expert weight at every call. Kept under the
    attribute `drop_packed_weights` clears, so reloading weights repacks."""
    packs = layer.__dict__.get(PACKS_ATTR)
    if packs is not None:
        return packs
    if (x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.requires_grad
            or layer.w13_weight.dtype != torch.bfloat16 or not cpu_ops.gemm_supported()):
        return None
    packs = []
    for e in range(layer.local_num_experts):
        p13 = cpu_ops.pack_bf16(layer.w13_weight[e])
        p2 = cpu_ops.pack_bf16(layer.w2_weight[e])
        if p13 is None or p2 is None:
            return None
        packs.append((p13, p2))
    layer.__dict__[PACKS_ATTR] = packs
    return packs


def _experts_cpu(layer: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor) -> torch.Tensor:
    packs = _packed_experts(layer, x)
    if packs is None:
        return layer.grouped_torch(x, topk_weights, topk_ids)
    n13, n2 = layer.w13_weight.shape[1], layer.hidden_size
    return layer.grouped(x, topk_weights, topk_ids,
                         lambda e, xs: cpu_ops.gemm_bf16_packed(xs, packs[e][0], n13),
                         lambda e, xs: cpu_ops.gemm_bf16_packed(xs, packs[e][1], n2))


def fused_moe_cpu(self: FusedMoE, hidden_states: torch.Tensor,
                  router_logits: torch.Tensor) -> torch.Tensor:
    """Experts grouped by routing, each expert's GEMMs on weights packed once."""
    return self.run(hidden_states, router_logits, _experts_cpu)


CPU_FORWARDS: dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm_cpu,
    "silu_and_mul": silu_and_mul_cpu,
    "rotary_embedding": rotary_embedding_cpu,
    "fused_decode_layers": fused_decode_layers_cpu,
    "fused_moe": fused_moe_cpu,
}
"""op name -> its CPU forward."""


# ------------------------------------------------- kernels (model_executor/kernels.py)
def paged_decode_attention_cpu(query: torch.Tensor, kv_cache: torch.Tensor,
                               block_table: torch.Tensor, seq_lens: torch.Tensor,
                               num_heads: int, block_size: int, scale: float,
                               out: torch.Tensor, k_scale: float = 1.0,
                               v_scale: float = 1.0) -> bool:
    """The native paged decode kernel where it takes these tensors (a float query
    of a native dtype; a cache of its dtype or fp8)."""
    if not (cpu_ops.usable(query)
            and (kv_cache.dtype == query.dtype or is_fp8(kv_cache.dtype))):
        return False
    cpu_ops.decode_attention(query, kv_cache, block_table, seq_lens, num_heads, block_size,
                             scale, out, k_scale, v_scale)
    return True


def fp8_gemm_cpu(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor,
                 w_scale: torch.Tensor, bias: Optional[torch.Tensor],
                 out_dtype: torch.dtype) -> torch.Tensor:
    """The native fp8 kernel (decode rows), else the dequantizing torch path."""
    if quant_ops.fp8_supported(x_q):
        out = quant_ops.gemm_fp8(x_q, w_q) * x_scale * w_scale
        if bias is not None:
            out = out + bias.float()
        return out.to(out_dtype)
    return torch_fp8_gemm(x_q, x_scale, w_q, w_scale, bias, out_dtype)


def int4_linear_cpu(layer: torch.nn.Module, x: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """The native int4 kernel for up to `native_max_rows()` rows; None above (the
    method dequantizes once for the many rows)."""
    from vllm.model_executor.layers.quantization.int_weights import native_max_rows
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if 0 < rows <= native_max_rows() and quant_ops.int4_supported(
            x, x.shape[-1] // layer.w_scales.shape[1]):
        return quant_ops.gemm_int4(x, layer.w_q, layer.w_scales, layer.w_zeros, bias)
    return None


CPU_KERNELS: dict[str, Callable[..., Any]] = {
    "linear": gemm.linear,
    "drop_weight_copies": gemm.drop_packed_weights,
    "argmax": cpu_ops.argmax,
    "paged_decode_attention": paged_decode_attention_cpu,
    "fp8_gemm": fp8_gemm_cpu,
    "int4_linear": int4_linear_cpu,
    "ssd_step": state_ops.ssd_step,
    "causal_conv1d_step": state_ops.causal_conv1d_step,
    "gated_delta_rule_step": state_ops.gated_delta_rule_step,
}
"""kernel name -> its CPU implementation."""


def register_cpu_ops() -> list[str]:
    """Bind every CPU forward and kernel (idempotent); returns the op names bound."""
    register_kernels(CPU_KERNELS, "cpu")
    return CustomOp.register_forwards(CPU_FORWARDS, "cpu")
