"""The attention layer that models call; the platform's backend does the work."""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from vllm.attention.ops.encoder_attention import encoder_attention
from vllm.attention.ops.masked_attention import masked_attention
from vllm.attention.selector import get_attn_backend
from vllm.forward_context import get_forward_context


ENCODER_ONLY = "encoder_only"
ATTN_TYPES = ("decoder", ENCODER_ONLY)


def extract_layer_index(prefix: str) -> int:
    """'model.layers.12.self_attn.attn' -> 12: the index into the KV cache list."""
    nums = [int(m) for m in re.findall(r"\.(\d+)\.", f".{prefix}.")]
    if not nums:
        raise ValueError(f"cannot find a layer index in {prefix!r}")
    return nums[0]


K_SCALE_CONSTANT = 200.0
V_SCALE_CONSTANT = 100.0
"""vLLM's targets for the largest |k| and |v| of the pass that sets the scales."""
MIN_KV_SCALE = 1e-6
"""A floor, so that an all-zero first pass does not make a zero scale."""


class Attention(nn.Module):
    """Multi-head / grouped-query attention over the paged KV cache.

    Inputs are flattened token-major tensors: query [T, num_heads * head_size],
    key/value [T, num_kv_heads * head_size] (heads of this TP rank only). Rotary
    embedding is applied by the model before calling this layer.

    The backend (`self.impl`) is the current platform's, chosen once when the layer
    is built (attention/selector.py); the runner supplies its per-step metadata and
    the KV caches through the forward context.
    """

    def __init__(self, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: int | None = None, prefix: str = "",
                 logits_soft_cap: float | None = None,
                 per_layer_sliding_window: int | None = None,
                 alibi_slopes: torch.Tensor | list[float] | None = None,
                 attn_type: str = "decoder", sinks: torch.Tensor | None = None,
                 attention_chunk_size: int | None = None) -> None:
        super().__init__()
        if attn_type not in ATTN_TYPES:
            raise ValueError(f"attn_type={attn_type!r}; choose one of {', '.join(ATTN_TYPES)}.")
        self.attn_type = attn_type
        """decoder: causal over the paged KV cache; encoder_only: bidirectional over
        each sequence of the pass, no KV cache (attention/ops/encoder_attention.py)."""
        self.logits_soft_cap = logits_soft_cap or None
        """Scores become `cap * tanh(scores / cap)` before the softmax (Gemma 2)."""
        self.sliding_window = per_layer_sliding_window or None
        """A query attends to itself and the `sliding_window - 1` tokens before it."""
        if attention_chunk_size and self.sliding_window:
            raise ValueError("a layer has either a sliding window or chunked attention.")
        self.attention_chunk_size = attention_chunk_size or None
        """Chunked local attention (Llama 4): the sequence is cut into chunks of this
        many positions and a query attends only to the keys of its own chunk (causally).
        The KV cache keeps the whole sequence (a full-attention layer's spec)."""
        slopes = None
        if alibi_slopes is not None:
            slopes = torch.as_tensor(alibi_slopes, dtype=torch.float32).reshape(-1)
            if slopes.numel() != num_heads:
                raise ValueError(f"alibi_slopes has {slopes.numel()} entries; expected one "
                                 f"per head of this rank ({num_heads}).")
        # A buffer (None without ALiBi), so it follows the model to its device; it is
        # not part of the checkpoint.
        self.register_buffer("alibi_slopes", slopes, persistent=False)
        """[num_heads] float32 ALiBi slopes of this rank's heads: head h adds
        `slope[h] * (k_pos - q_pos)` to its scores (BLOOM, MPT)."""
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks has shape {tuple(sinks.shape)}; expected one value per "
                             f"head of this rank ({num_heads},).")
        if sinks is not None and attn_type != "decoder":
            raise ValueError("attention sinks are supported for decoder attention only.")
        # Owned (and loaded) by the model's attention module: held in a tuple so it is
        # neither registered twice nor copied; moving the model moves it in place.
        self._sinks = (sinks,)
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads}).")
        self.k_scale = 1.0
        self.v_scale = 1.0
        self.calculate_kv_scales = False
        """Set k_scale / v_scale from the first K and V written to the cache
        (--calculate-kv-scales), then clear this flag."""
        """Per-tensor dequantization scales of an fp8 KV cache (vllm/attention/fp8_kv.py):
        the cache holds K / k_scale and V / v_scale. Set from the checkpoint by
        layers/quantization/kv_cache.py; unused with a cache in the model dtype."""
        self.layer_name = prefix
        self.layer_idx = extract_layer_index(prefix) if prefix else 0
        self.impl = get_attn_backend()

    @property
    def sinks(self) -> torch.Tensor | None:
        """[num_heads] learned per-head sink logits (GPT-OSS), or None: head h's softmax
        denominator gets an extra `exp(sinks[h])` term (a key with that score and a zero
        value), so a query may attend to "nothing". Every backend honours it in float32
        scores (the masked paths and the Triton kernel)."""
        return self._sinks[0]

    def forward(self, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        if ctx is None or ctx.attn_metadata is None:
            return self._causal_no_cache(query, key, value)
        if self.attn_type == ENCODER_ONLY:
            return self.impl.forward_encoder_only(self, query, key, value, ctx.attn_metadata)
        if ctx.wait_for_layer is not None:  # a KV connector is loading this step's KV
            ctx.wait_for_layer(self.layer_idx)
        kv_cache = ctx.kv_caches[self.layer_idx] if ctx.kv_caches else None
        if self.calculate_kv_scales and kv_cache is not None and key.shape[0]:
            self._calc_kv_scales(key, value)
        return self.impl.forward(self, query, key, value, kv_cache,
                                 ctx.metadata_for(self.layer_idx))

    def _calc_kv_scales(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """vLLM's rule: the scale maps the largest |k| to K_SCALE_CONSTANT and |v| to
        V_SCALE_CONSTANT, well inside fp8 e4m3's range (448), so later tokens a little
        larger than the first ones still fit."""
        k_max = float(key.detach().abs().max())
        v_max = float(value.detach().abs().max())
        self.k_scale = max(k_max / K_SCALE_CONSTANT, MIN_KV_SCALE)
        self.v_scale = max(v_max / V_SCALE_CONSTANT, MIN_KV_SCALE)
        self.calculate_kv_scales = False

    def _causal_no_cache(self, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor) -> torch.Tensor:
        """All tokens form one sequence; no KV cache is read or written."""
        if self.attn_type == ENCODER_ONLY:
            return encoder_attention(self, query, key, value, [(0, query.shape[0])])
        if (self.logits_soft_cap is not None or self.sliding_window is not None
                or self.alibi_slopes is not None or self.sinks is not None
                or self.attention_chunk_size is not None):
            return masked_attention(self, query, key, value,
                                    torch.arange(query.shape[0], device=query.device),
                                    torch.arange(key.shape[0], device=key.device))
        t = query.shape[0]
        q = query.view(t, self.num_heads, self.head_size).transpose(0, 1)
        k = key.view(t, self.num_kv_heads, self.head_size).transpose(0, 1)
        v = value.view(t, self.num_kv_heads, self.head_size).transpose(0, 1)
        out = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                             is_causal=True, scale=self.scale,
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        return out.squeeze(0).transpose(0, 1).reshape(t, self.num_heads * self.head_size)

