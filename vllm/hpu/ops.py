"""The HPU forward of each custom op: Gaudi's fused kernels, bound by `register_hpu_ops`.

Kept apart from the layers so that a CPU process never imports the HPU stack
(`vllm.hpu`, hence `habana_frameworks` on a Gaudi image), and so the binding is an
explicit step: the HPU plugin's `register_ops()` entry point runs it in every process
of an HPU build, and the HPU platform's `bind_custom_ops` in the worker's device
initialization or when the first layer is built (so a platform chosen without the
entry points, a source checkout or VLLM_USE_FAKE_HPU on a CPU build, binds them too).
The kernel table's HPU entries (model_executor/kernels.py: the quantized GEMMs) are
bound in the same call.
Each function is the forward of its op (`self` is the layer) for the op and every
subclass of it (see `CustomOp.register_forward`).

Ops without an entry here (silu_and_mul: Gaudi's graph compiler fuses the two ops
itself) run their `forward_native`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from vllm.hpu import habana
from vllm.attention.mla import MLAAttention  # noqa: F401  (registers the op)
from vllm.hpu.mla import mla_attention_hpu
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.kernels import register_kernels
from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding


def rms_norm_hpu(self: RMSNorm, x: torch.Tensor, residual: Optional[torch.Tensor] = None
                 ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Gaudi's `FusedRMSNorm` after the residual add (same contract as RMSNorm)."""
    if residual is not None:
        x = x + residual
        residual = x
    out = habana.FusedRMSNorm.apply(x, self.weight, self.variance_epsilon)
    return out if residual is None else (out, residual)


def rotary_embedding_hpu(self: RotaryEmbedding, positions: torch.Tensor,
                         query: torch.Tensor, key: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaudi's kernel wants cos/sin at the full rotary width (halves or pairs
    repeated, by mode) and rotates what it is given, so the pass-through part of
    a partial rotary is split off in `_rotate_hpu`."""
    cos, sin = self.cos_sin_cache.index_select(0, positions.view(-1)).chunk(2, dim=-1)
    if self.is_neox_style:
        mode = habana.RotaryPosEmbeddingMode.BLOCKWISE
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    else:
        mode = habana.RotaryPosEmbeddingMode.PAIRWISE
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [T, 1, rotary_dim]
    return (_rotate_hpu(self, query, cos, sin, mode), _rotate_hpu(self, key, cos, sin, mode))


def _rotate_hpu(rope: RotaryEmbedding, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, mode: Any) -> torch.Tensor:
    heads = x.reshape(x.shape[0], -1, rope.head_size)
    rd = rope.rotary_dim
    if rd == rope.head_size:
        out = habana.apply_rotary_pos_emb(heads, cos, sin, None, 0, mode)
    else:
        rotated = habana.apply_rotary_pos_emb(heads[..., :rd], cos, sin, None, 0, mode)
        out = torch.cat((rotated, heads[..., rd:]), dim=-1)
    return out.reshape(x.shape)


def _experts_hpu(layer: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor) -> torch.Tensor:
    if layer.needs_dense_experts:
        # Expert biases / swigluoai (GPT-OSS): the fused op has neither; every expert
        # over the whole bucket keeps the shapes fixed.
        return layer.dense_experts(x, topk_weights, topk_ids)
    return habana.mixture_of_experts(
        x, topk_ids, topk_weights.to(x.dtype), list(layer.w13_weight.unbind(0)),
        list(layer.w2_weight.unbind(0)), permuted_weights=True, activation=layer.activation,
        experts_min=0, experts_max=layer.local_num_experts - 1)


def fused_moe_hpu(self: FusedMoE, hidden_states: torch.Tensor,
                  router_logits: torch.Tensor) -> torch.Tensor:
    """Gaudi's `mixture_of_experts` on the bucket-padded batch (or, for layers it
    cannot express, `FusedMoE.dense_experts`): one fixed shape per bucket, whatever
    the routing."""
    return self.run(hidden_states, router_logits, _experts_hpu)


HPU_FORWARDS: dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm_hpu,
    "rotary_embedding": rotary_embedding_hpu,
    "fused_moe": fused_moe_hpu,
    "mla_attention": mla_attention_hpu,
}
"""op name -> its HPU forward."""


# ------------------------------------------- kernels of the quantized linear methods
def fp8_gemm_hpu(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor,
                 w_scale: torch.Tensor, bias: Optional[torch.Tensor],
                 out_dtype: torch.dtype) -> torch.Tensor:
    """Gaudi's fp8 GEMM, both scales applied by the op."""
    return habana.hpu_ops.fp8_gemm_v2(x_q, False, w_q, True, None, out_dtype, x_scale,
                                      w_scale, bias, False)


def int4_layout_hpu(layer: torch.nn.Module, q: torch.Tensor) -> None:
    """`convert_from_uint4`'s operands: qweight [K/8, N] int32, scales/zeros [G, N]
    (the generic `w_q` is dropped)."""
    k = q.shape[1]
    words = q.t().reshape(k // 8, 8, -1).to(torch.int32)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32).view(1, 8, 1)
    layer.register_buffer("hpu_qweight", (words << shifts).sum(1, dtype=torch.int32),
                          persistent=False)
    del layer.w_q


def int4_linear_hpu(layer: torch.nn.Module, x: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dequantize on the fly (`convert_from_uint4`), then the matmul."""
    w = habana.hpu_ops.convert_from_uint4(layer.hpu_qweight, layer.w_scales.t(),
                                          layer.w_zeros.t(), x.dtype)
    return torch.nn.functional.linear(x, w.t(), bias)


def inc_fp8_linear_hpu(method: Any, layer: torch.nn.Module, x: torch.Tensor,
                       bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """INC's static fp8 linear with Gaudi's ops: the input cast and the GEMM, each
    scale a tensor (runtime scale patching) or a baked-in constant, trivial ones left
    out (PT_HPU_H2D_TRIVIAL_SCALES_MODE; see quantization/inc.py)."""
    from vllm.model_executor.layers.quantization.fp8_utils import FP8_DTYPE
    s_in, s_in_inv, s_w = method.scales(layer)
    drop_cast, drop_a, drop_b = method.dropped_scales(layer)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    x_q, _ = habana.hpu_ops.cast_to_fp8_v2(x2, None if drop_cast else s_in_inv, False,
                                           False, FP8_DTYPE)
    out = habana.hpu_ops.fp8_gemm_v2(x_q, False, layer.weight, True, None, x.dtype,
                                     None if drop_a else s_in, None if drop_b else s_w,
                                     bias, False)
    return out.reshape(*shape[:-1], layer.weight.shape[0])


HPU_KERNELS: dict[str, Callable[..., Any]] = {
    "fp8_gemm": fp8_gemm_hpu,
    "int4_prepare": int4_layout_hpu,
    "int4_linear": int4_linear_hpu,
    "inc_fp8_linear": inc_fp8_linear_hpu,
}
"""kernel name -> its HPU implementation (model_executor/kernels.py)."""


def register_hpu_ops() -> list[str]:
    """Bind every HPU forward and kernel (idempotent); returns the op names bound."""
    register_kernels(HPU_KERNELS, "hpu")
    return CustomOp.register_forwards(HPU_FORWARDS, "hpu")
