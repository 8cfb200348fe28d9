"""Plain-torch equivalents of the hpex kernels the HPU path calls.

Same call signatures as `habana_frameworks.torch.hpex.kernels.FusedSDPA`,
`hpex.normalization.FusedRMSNorm` and `hpex.kernels.apply_rotary_pos_emb`, so model
and attention code is written once. They are references, not fast paths.
"""
from __future__ import annotations

import enum
from typing import Optional

import torch
import torch.nn.functional as F


class FusedSDPA:
    """Scaled dot-product attention on [B, H, T, D] with Gaudi's extra arguments.

    - `valid_sequence_lengths` [B]: keys at or past a sequence's length (right
      padding; left padding mirrors it) are masked, and query rows in the padding
      come out as zeros (so padding never produces NaN).
    - Grouped-query attention: K/V may have fewer heads than Q (a divisor).
    - `softmax_mode` ("None" | "fast") and `recompute_mode` only change speed and
      precision trade-offs on Gaudi; here the math is exact.
    - `is_causal` aligns the causal diagonal top-left, as torch's SDPA does.
    """

    @staticmethod
    def apply(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: Optional[float] = None,
              softmax_mode: str = "None", recompute_mode: Optional[bool] = None,
              valid_sequence_lengths: Optional[torch.Tensor] = None,
              padding_side: str = "left") -> torch.Tensor:
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
        gqa = query.shape[1] != key.shape[1]
        if valid_sequence_lengths is None:
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                  dropout_p=dropout_p, is_causal=is_causal,
                                                  scale=scale, enable_gqa=gqa)
        if attn_mask is not None and is_causal:
            raise ValueError("FusedSDPA: pass either attn_mask or is_causal, not both.")
        b, _, t, _ = query.shape
        s = key.shape[-2]
        lens = valid_sequence_lengths.to(query.device).view(b, 1, 1, 1)
        q_idx = torch.arange(t, device=query.device).view(1, 1, t, 1)
        k_idx = torch.arange(s, device=query.device).view(1, 1, 1, s)
        if padding_side == "right":
            key_ok, query_ok = k_idx < lens, q_idx < lens
        else:
            key_ok, query_ok = k_idx >= s - lens, q_idx >= t - lens
        allowed = key_ok.expand(b, 1, t, s)
        if is_causal:
            allowed = allowed & (k_idx <= q_idx)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        row_ok = allowed.any(-1, keepdim=True) & query_ok
        # Rows without any allowed key (padding) attend to everything, then are zeroed.
        allowed = allowed | ~row_ok
        bias = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        bias = bias.masked_fill(~allowed, float("-inf"))
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            bias = bias + attn_mask
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias,
                                             dropout_p=dropout_p, scale=scale, enable_gqa=gqa)
        return out.masked_fill(~row_ok, 0.0)


class FusedRMSNorm:
    """RMSNorm computed in fp32 and cast back: x / sqrt(mean(x^2) + eps) * weight."""

    @staticmethod
    def apply(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (xf * weight.float()).to(x.dtype)


class RotaryPosEmbeddingMode(enum.Enum):
    BLOCKWISE = 0  # rotate halves (GPT-NeoX / Llama layout)
    PAIRWISE = 1   # rotate interleaved pairs (GPT-J layout)


def _rotate(x: torch.Tensor, mode: RotaryPosEmbeddingMode) -> torch.Tensor:
    if mode == RotaryPosEmbeddingMode.BLOCKWISE:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         position_ids: Optional[torch.Tensor] = None, offset: int = 0,
                         mode: RotaryPosEmbeddingMode = RotaryPosEmbeddingMode.BLOCKWISE
                         ) -> torch.Tensor:
    """p * cos + rotate(p) * sin over the first cos.shape[-1] channels of p.

    The hpex kernel's signature. `cos`/`sin` hold the full rotary width (frequencies
    repeated per half for BLOCKWISE, per pair for PAIRWISE) and broadcast against p;
    with `position_ids` they are tables indexed by position first. Channels past the
    rotary width (partial rotary) pass through unchanged. `offset` (a shift into the
    tables, Megatron style) is not modelled: only 0 is accepted.
    """
    if offset != 0:
        raise ValueError(f"the fake apply_rotary_pos_emb supports offset=0 only, got {offset}.")
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    rot = cos.shape[-1]
    if rot > p.shape[-1] or rot % 2:
        raise ValueError(f"rotary width must be even and <= head size {p.shape[-1]}, "
                         f"got {rot}.")
    pr, rest = p[..., :rot], p[..., rot:]
    out = pr * cos + _rotate(pr, mode) * sin
    return torch.cat((out.to(p.dtype), rest), dim=-1) if rest.numel() else out.to(p.dtype)
