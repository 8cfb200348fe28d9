"""Gemma 3 (text): Gemma 2's layer plus per-head (1 + w) RMSNorm on q and k before the
rotary, and two rotary tables: sliding layers use the local base frequency
(`rope_local_base_freq`, or the "sliding_attention" entry of transformers 5's
`rope_parameters`), full layers the global theta with its scaling."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from vllm.attention.layer import extract_layer_index
from vllm.model_executor.layers.gemma_layers import GemmaRMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope
from vllm.model_executor.models.gemma2 import (Gemma2Attention, Gemma2DecoderLayer,
                                               Gemma2ForCausalLM, Gemma2Model, is_sliding_layer)
from vllm.model_executor.models.utils import head_dim_of


class Gemma3Attention(Gemma2Attention):

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding, prefix: str = "") -> None:
        super().__init__(config, rotary_emb, prefix)
        self.q_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def rotate_qk(self, positions: torch.Tensor, qkv: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        t = qkv.shape[0]
        q = self.q_norm(q.reshape(t, self.num_heads, self.head_dim)).reshape(t, self.q_size)
        k = self.k_norm(k.reshape(t, self.num_kv_heads, self.head_dim)).reshape(t, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    attention_cls = Gemma3Attention


def gemma3_rope_params(config: Any) -> tuple[tuple[float, Optional[dict]], tuple[float,
                                                                                  Optional[dict]]]:
    """((global theta, global scaling), (local theta, local scaling)); scaling None for
    plain RoPE."""
    def split(params: dict, default_theta: float) -> tuple[float, Optional[dict]]:
        params = dict(params or {})
        theta = float(params.get("rope_theta", default_theta))
        kind = params.get("rope_type", params.get("type", "default"))
        return theta, (params if kind not in (None, "default") else None)

    per_type = getattr(config, "rope_parameters", None) or {}
    if "full_attention" in per_type or "sliding_attention" in per_type:
        return (split(per_type.get("full_attention"), 1_000_000.0),
                split(per_type.get("sliding_attention"), 10_000.0))
    global_theta = getattr(config, "rope_theta", None) or 1_000_000.0
    return (split(getattr(config, "rope_scaling", None) or {}, global_theta),
            (float(getattr(config, "rope_local_base_freq", None) or 10_000.0), None))


class Gemma3Model(Gemma2Model):
    layer_cls = Gemma3DecoderLayer

    def build_rotary_emb(self, config: Any) -> RotaryEmbedding:
        """The global table; the local one (sliding layers) is kept beside it."""
        head_dim = head_dim_of(config)
        (g_theta, g_scaling), (l_theta, l_scaling) = gemma3_rope_params(config)
        self.local_rotary_emb = get_rope(head_dim, head_dim, config.max_position_embeddings,
                                         l_theta, l_scaling)
        return get_rope(head_dim, head_dim, config.max_position_embeddings, g_theta, g_scaling)

    def make_layer(self, config: Any, prefix: str) -> nn.Module:
        sliding = is_sliding_layer(config, extract_layer_index(prefix))
        rope = self.local_rotary_emb if sliding else self.rotary_emb
        return self.layer_cls(config, rope, prefix=prefix)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    model_cls = Gemma3Model
