"""Attention with explicit float32 scores: the reference path for layers with a sliding
window, a logit soft-cap, ALiBi or attention sinks, shared by the no-cache path and the
backends."""
from __future__ import annotations

from typing import Any, Optional

import torch

from vllm.attention.ops.alibi import alibi_bias


def softmax_with_sinks(scores: torch.Tensor, sinks: Optional[torch.Tensor]) -> torch.Tensor:
    """Softmax over the last dimension of float32 `scores`; with `sinks` (already shaped
    to broadcast against `scores[..., :1]`) each row's denominator also holds
    `exp(sink)`: the sink is one more column whose probability is dropped. A row whose
    keys are all masked then gives zeros instead of NaN."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.float().expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]


def masked_attention(layer: Any, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                     q_groups: Optional[torch.Tensor] = None,
                     k_groups: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention of queries at positions `q_pos` [Tq] to keys at `k_pos` [Tk] (one
    sequence), with the layer's soft-cap, sliding window, ALiBi slopes and sinks, scores
    and softmax in float32. query [Tq, H*D]; key/value [Tk, Hkv*D] or [Hkv, Tk, D].
    `q_groups` / `k_groups` (image of each position, -1 text): tokens of one image also
    see each other's later positions (Gemma 3), inside the window as the rest."""
    hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
    q = query.reshape(-1, hq, d).transpose(0, 1).float()
    k = key if key.dim() == 3 else key.reshape(-1, hkv, d).transpose(0, 1)
    v = value if value.dim() == 3 else value.reshape(-1, hkv, d).transpose(0, 1)
    k = k.float().repeat_interleave(hq // hkv, dim=0)
    v = v.float().repeat_interleave(hq // hkv, dim=0)
    scores = torch.matmul(q, k.transpose(1, 2)) * layer.scale
    if layer.logits_soft_cap is not None:
        scores = torch.tanh(scores / layer.logits_soft_cap) * layer.logits_soft_cap
    slopes = getattr(layer, "alibi_slopes", None)
    if slopes is not None:
        scores = scores + alibi_bias(slopes, q_pos, k_pos).to(scores.device)
    allowed = k_pos[None, :] <= q_pos[:, None]
    if q_groups is not None:
        allowed = allowed | ((q_groups[:, None] == k_groups[None, :]) & (q_groups[:, None] >= 0))
    if layer.sliding_window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - layer.sliding_window
    chunk = getattr(layer, "attention_chunk_size", None)
    if chunk is not None:
        allowed &= (k_pos // chunk)[None, :] == (q_pos // chunk)[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    sinks = getattr(layer, "sinks", None)
    probs = softmax_with_sinks(scores, None if sinks is None else sinks.view(hq, 1, 1))
    out = torch.matmul(probs, v)
    return out.transpose(0, 1).reshape(-1, hq * d).to(query.dtype)
