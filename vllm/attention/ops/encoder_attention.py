"""Bidirectional (encoder-only) attention: every token of a sequence sees all of it.

Encoder models (BERT, XLM-R) attend over the whole prompt in both directions, so a
sequence must be in one pass with nothing before it in the cache; their K/V are never
read again, so nothing is written to the KV cache either. The backends describe each
sequence of the pass as (first row, rows); this op runs one non-causal SDPA per
sequence on the pass's own q/k/v.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def encoder_attention(layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      seqs: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[T, heads * head_size]: each (start, length) of `seqs` attends to itself only;
    rows outside every sequence (padding) come out as zeros."""
    t = query.shape[0]
    hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
    q = query.view(t, hq, d).transpose(0, 1)
    k = key.view(t, hkv, d).transpose(0, 1)
    v = value.view(t, hkv, d).transpose(0, 1)
    out = torch.zeros(hq, t, d, dtype=query.dtype, device=query.device)
    for start, length in seqs:
        end = start + length
        out[:, start:end] = F.scaled_dot_product_attention(
            q[:, start:end].unsqueeze(0), k[:, start:end].unsqueeze(0),
            v[:, start:end].unsqueeze(0), is_causal=False, scale=layer.scale,
            enable_gqa=hkv != hq).squeeze(0)
    return out.transpose(0, 1).reshape(t, hq * d)
