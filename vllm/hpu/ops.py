"""The HPU forward of each custom op: Gaudi's fused kernels, bound by `register_hpu_ops`.

Kept apart from the layers so that a CPU process never imports the HPU stack
(`vllm.hpu`, hence `habana_frameworks` on a Gaudi image), and so the binding is an
explicit step: the HPU plugin's `register_ops()` entry point runs it in every process
of an HPU build, and the HPU platform runs it when it is built (a platform chosen
without the entry points: a source checkout, VLLM_USE_FAKE_HPU on a CPU build).
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
    return habana.mixture_of_experts(
        x, topk_ids, topk_weights.to(x.dtype), list(layer.w13_weight.unbind(0)),
        list(layer.w2_weight.unbind(0)), permuted_weights=True, activation=layer.activation,
        experts_min=0, experts_max=layer.local_num_experts - 1)


def fused_moe_hpu(self: FusedMoE, hidden_states: torch.Tensor,
                  router_logits: torch.Tensor) -> torch.Tensor:
    """Gaudi's `mixture_of_experts` on the bucket-padded batch: one fixed shape per
    bucket, whatever the routing."""
    return self.run(hidden_states, router_logits, _experts_hpu)


HPU_FORWARDS: dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm_hpu,
    "rotary_embedding": rotary_embedding_hpu,
    "fused_moe": fused_moe_hpu,
    "mla_attention": mla_attention_hpu,
}
"""op name -> its HPU forward."""


def register_hpu_ops() -> list[str]:
    """Bind every HPU forward (idempotent); returns the op names bound."""
    return CustomOp.register_forwards(HPU_FORWARDS, "hpu")
